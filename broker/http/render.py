"""Responses as bytes on the wire, as Go's ``net/http`` server writes them.

A :class:`Response` gets its status line (HTTP/1.0 or 1.1), its headers, a ``Content-Type``
sniffed as Go sniffs text when it has none, the ``Connection`` header its connection's fate
calls for, ``Content-Length`` and ``Date``; a HEAD's answer has no body. The bytes of a small
response are built once per second and reused. A head the server cannot read gets Go's own
plain-text answer (:func:`refusal`), without ``Date`` or a length.

Pure functions of their arguments and the clock: :mod:`broker.http.connection` renders with
them; nothing here does I/O.
"""

from __future__ import annotations

import http
import time

from broker.http.events import Response
from broker.http.head import HeadError

__all__ = ["TEXT_PLAIN", "CONTINUE", "ResponseRenderer", "http_date", "refusal"]

#: What Go's content sniffing says about text bodies.
TEXT_PLAIN = b"text/plain; charset=utf-8"
#: The interim answer to ``Expect: 100-continue``.
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
#: Responses whose bytes are kept for reuse (within the second of their ``Date``): at most
#: this many, with bodies of at most this size.
_CACHED_RESPONSES = 256
_CACHED_BODY_BYTES = 1024

_time = time.time
_REASONS = {status.value: status.phrase.encode() for status in http.HTTPStatus}
_WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def http_date(seconds: float) -> str:
    """RFC 9110's date (``Sun, 06 Nov 1994 08:49:37 GMT``), the ``Date`` header's, as Go's
    ``http.TimeFormat`` writes it; English names whatever the locale (``email.utils`` does the
    same, at 7 ms of a start's imports)."""
    t = time.gmtime(seconds)
    return (f"{_WEEKDAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year:04d} "
            f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT")


def refusal(error: HeadError) -> bytes:
    """Go's own answer to a request it cannot read, byte for byte: ``<code> <reason>[: <text>]``
    in plain text, without ``Date`` or a length (the connection closes after it)."""
    reason = _REASONS.get(error.status, b"Error")
    if error.text:
        reason += b": " + error.text.encode()
    body = error.body if error.body is not None else b"%d %s" % (error.status, reason)
    return b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nConnection: close\r\n\r\n%s" % (error.status, reason, TEXT_PLAIN,
                                                                                    body)


class ResponseRenderer:
    """Renders responses to bytes; the bytes of small ones are kept for the current second.

    The cache is keyed by the response object (kept alive with its bytes, so that its id
    is not reused) and by how it is sent: HTTP/1.0 or 1.1, closing or not, to a HEAD.
    """

    __slots__ = ("_second", "_next_second", "_date", "_cache", "_last", "_last_bytes")

    def __init__(self) -> None:
        self._second = -1
        self._next_second = 0.0  # when the Date changes
        self._date = b""
        self._cache: dict[int, tuple[Response, bytes]] = {}
        # the last small response rendered the usual way (HTTP/1.1, kept open, not to a HEAD) and
        # its bytes: a server answering publishes renders the same one again and again
        self._last: Response | None = None
        self._last_bytes = b""

    def render(self, response: Response, http10: bool, close: bool, head: bool) -> bytes:
        """The bytes of ``response``: in HTTP/1.0 or 1.1, saying whether the connection
        closes, without the body for a HEAD."""
        now = _time()
        if now >= self._next_second or now < self._second:  # a new second (or the clock went back)
            self._new_second(int(now))
        if response is self._last and not (http10 or close or head):
            return self._last_bytes
        key = id(response) * 8 + http10 * 4 + close * 2 + head
        cached = self._cache.get(key)
        if cached is not None and cached[0] is response:
            data = cached[1]
        else:
            data = self._render(response, http10, close, head)
            if len(response.body) > _CACHED_BODY_BYTES:
                return data
            if len(self._cache) >= _CACHED_RESPONSES:
                self._cache.clear()
            self._cache[key] = (response, data)
        if not (http10 or close or head):
            self._last, self._last_bytes = response, data
        return data

    def _new_second(self, second: int) -> None:
        self._second = second
        self._next_second = second + 1
        self._date = b"Date: " + http_date(second).encode() + b"\r\n"
        self._cache.clear()
        self._last = None

    def _render(self, response: Response, http10: bool, close: bool, head: bool) -> bytes:
        status = response.status
        body = response.body
        reason = response.reason if response.reason is not None else _REASONS.get(status, b"")
        lines = [b"HTTP/1.0 %d %s\r\n" % (status, reason) if http10 else b"HTTP/1.1 %d %s\r\n" % (status, reason)]
        typed = False
        for name, value in response.headers:
            lines.append(b"%s: %s\r\n" % (name, value))
            typed = typed or name.lower() == b"content-type"
        if body and not typed:
            lines.append(b"Content-Type: " + TEXT_PLAIN + b"\r\n")
        if http10:
            if not close:
                lines.append(b"Connection: keep-alive\r\n")
        elif close:
            lines.append(b"Connection: close\r\n")
        lines.append(b"Content-Length: %d\r\n" % len(body))
        lines.append(self._date)
        lines.append(b"\r\n")
        if not head:
            lines.append(body)
        return b"".join(lines)
