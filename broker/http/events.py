"""What an HTTP connection gives and takes: a request's head, a response, and the two signals.

:class:`~broker.http.connection.HTTPConnection` hands out a :class:`Request` (the handler's
view of a head: the path decoded, the query not), :data:`NEED_DATA` when it must be fed more
bytes first, or :data:`CLOSED` once the connection is over (:data:`LEFT`: a request it would
not answer at once); it takes a :class:`Response`.
:class:`BodyReadError` is what a body read raises when the body cannot be read to its end.

Nothing here does I/O or imports anything of the server: :mod:`broker.http.connection` and
:mod:`broker.http.server` import this module, and the endpoints get these names from
:mod:`broker.http.server`.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Request", "Response", "BodyReadError", "Signal", "NEED_DATA", "CLOSED", "LEFT"]


class Request(NamedTuple):
    """One request's head. ``path`` is percent-decoded; ``raw_query`` is not.

    ``headers`` are (lower-case name, value) pairs as received; ``content_length`` is None
    for a chunked body.
    """

    method: str
    path: str
    raw_query: str
    headers: tuple[tuple[bytes, bytes], ...]
    content_length: int | None
    remote: str

    def header(self, name: bytes) -> bytes | None:
        """The first value of header ``name`` (lower case), or None."""
        for key, value in self.headers:
            if key == name:
                return value
        return None


class Response(NamedTuple):
    """A complete response. ``headers`` are (name, value) byte pairs; ``Date`` and
    ``Content-Length`` are added when it is sent. ``reason`` replaces the status's usual
    phrase in the status line."""

    status: int
    body: bytes = b""
    headers: tuple[tuple[bytes, bytes], ...] = ()
    reason: bytes | None = None


class BodyReadError(Exception):
    """The request body could not be read (the peer closed early or sent bad chunking)."""


class Signal:
    """A connection's answer that is not a request (compared by identity)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: The connection needs more bytes (or the end of input) before it can go on.
NEED_DATA = Signal("NEED_DATA")
#: The connection is over: write what it queued, then close.
CLOSED = Signal("CLOSED")
#: The next request cannot be answered at once: :meth:`~broker.http.connection.HTTPConnection.next_event`
#: hands it out (``answer_whole`` left it where it was).
LEFT = Signal("LEFT")
