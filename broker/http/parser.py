"""HTTP/1.x requests read off a connection's bytes with llhttp (``httptools``), checked as Go's
``net/http`` checks them.

:class:`RequestParser` is fed what the socket gives; every request whose head is complete
goes into :attr:`RequestParser.ready` as a :class:`ParsedRequest`, its body following into
it as it arrives. Pipelined requests received together are parsed in one pass. A head that
cannot be served ends the stream with a :class:`HeadError` in ``ready`` after the requests
before it; a body that cannot be read marks its request (:attr:`ParsedRequest.error`).

What Go's server refuses and llhttp would accept is refused here with Go's answer:
a protocol version other than 1.x (``505``), an HTTP/1.1 request without exactly one valid
``Host`` (``400``), a ``Transfer-Encoding`` other than ``chunked`` (``501``), a head over the
size limit (``431``); an ``Expect`` other than ``100-continue`` is marked for Go's ``417``.
Go accepts what llhttp's strict mode would not in two places, and so does this parser: any
1.x version, and ``Content-Length`` together with a chunked ``Transfer-Encoding`` (the
chunking wins).
"""

from __future__ import annotations

from collections import deque

import httptools

__all__ = ["HeadError", "ParsedRequest", "RequestParser"]

#: The bytes Go's ``httpguts.ValidHostHeader`` allows in a ``Host`` value.
_HOST_BYTES = bytes(range(0x21, 0x7F)).translate(None, b'"<>\\^`{|}')
#: What a request line costs beyond its method and target (`` HTTP/1.1\r\n`` and a space),
#: and each header line beyond its name and value (``: `` and ``\r\n``).
_REQUEST_LINE_BYTES = 11
_HEADER_LINE_BYTES = 4
#: llhttp's reasons for a head it rejects, as Go words the same refusal.
_LLHTTP_REASONS = {"Invalid header value char": "invalid header value"}
#: The headers the parser acts on.
_HOST, _CONTENT_LENGTH, _TRANSFER_ENCODING, _EXPECT = range(4)
_SPECIAL_HEADERS = {b"host": _HOST, b"content-length": _CONTENT_LENGTH, b"transfer-encoding": _TRANSFER_ENCODING,
                    b"expect": _EXPECT}
_UNSUPPORTED_TRANSFER_ENCODING = ("Invalid `Transfer-Encoding` header value", "Request has invalid `Transfer-Encoding`")


class HeadError(Exception):
    """A request head the server answers without a handler: Go's status and its ``text``
    (the answer is ``<status> <reason>[: <text>]``, or just ``body`` when given)."""

    def __init__(self, status: int, text: str = "", body: bytes | None = None):
        super().__init__(text or str(status))
        self.status = status
        self.text = text
        self.body = body


class ParsedRequest:
    """One request as it was read: its head, and its body as far as it has arrived.

    ``method`` and ``target`` are the raw bytes of the request line; ``headers`` are
    (lower-case name, value) pairs. ``content_length`` is None for a chunked body.
    ``parts`` holds body bytes not yet taken (``buffered`` of them); ``complete`` is set
    once the body has ended, ``error`` when it cannot be read to its end.
    """

    # Class-level defaults: a request sets only what it differs in (most set none of them).
    method = b""
    target = b""
    http10 = False
    keep_alive = True
    content_length: int | None = 0
    chunked = False
    expect: bytes | None = None
    expect_continue = False  # the client waits for "100 Continue" before it sends the body
    expect_failed = False  # an Expect header Go answers with 417
    hosts = 0
    host = b""
    buffered = 0
    complete = False
    error: str | None = None

    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.parts: list[bytes] = []


class RequestParser:
    """Parses one connection's requests; owns the llhttp parser.

    Callers :meth:`feed` received bytes and take requests from :attr:`ready` in order;
    :meth:`eof` says the peer will send no more. After a :class:`HeadError` (or EOF)
    :attr:`failed` is set and further input is ignored.
    """

    __slots__ = ("ready", "failed", "idle", "_parser", "_request", "_in_head", "_max_header_bytes", "_held",
                 "_held_from", "_long_input", "_error")

    def __init__(self, max_header_bytes: int):
        parser = httptools.HttpRequestParser(self)
        parser.set_dangerous_leniencies(lenient_version=True, lenient_chunked_length=True)
        self._parser = parser
        self._max_header_bytes = max_header_bytes
        self.ready: deque[ParsedRequest | HeadError] = deque()
        self.failed = False
        #: no byte of a next request has arrived: the connection waits between requests
        self.idle = True
        self._request: ParsedRequest | None = None  # the last request begun
        self._in_head = False  # its head is still arriving
        self._held: bytearray | None = None  # a head's bytes held back until its end arrives
        self._held_from = 0  # where in ``_held`` the bytes not yet fed begin
        self._long_input = False  # what is being fed may hold a head over the limit
        self._error: HeadError | None = None

    def feed(self, data: bytes) -> None:
        """Parse ``data``: complete heads go to :attr:`ready`, body bytes to their request.

        The rest of a head that began in an earlier feed is held back until its end is
        here (or it is over the limit), so that llhttp sees it at once: a head trickled in
        byte by byte costs what one sent whole does.
        """
        if self.failed:
            return
        held = self._held
        over_limit = False
        if held is not None:
            start = len(held) - 3 if len(held) > 3 else 0
            held += data
            over_limit = len(held) - self._held_from > self._max_header_bytes
            if held.find(b"\n\n", start) < 0 and held.find(b"\n\r\n", start) < 0 and not over_limit:
                return
            data = bytes(held[self._held_from:])
            self._held = None
        # A head within one feed is as long as the feed at most: only a longer feed, or one
        # that ends a head begun earlier, can hold a head over the limit.
        self._long_input = held is not None or len(data) > self._max_header_bytes
        while True:
            try:
                self._parser.feed_data(data)
                break
            except httptools.HttpParserUpgrade as upgrade:
                # llhttp stops after a request asking to switch protocols; Go serves it as a
                # plain request (nsqd has nothing to switch to) and reads on.
                data = data[upgrade.args[0]:]
            except httptools.HttpParserError as exc:
                self._fail(exc)
                return
        if self._in_head:
            if over_limit:
                self._fail_head(HeadError(431))
            else:
                # the head's end may have begun in the last bytes fed
                self._held = bytearray(data[-3:])
                self._held_from = len(self._held)

    def eof(self) -> None:
        """The peer sent all it will: a body still expected cannot be read."""
        request = self._request
        if request is not None and not self.idle and not self._in_head:
            request.error = "unexpected EOF"
        self.failed = True

    def _fail(self, exc: httptools.HttpParserError) -> None:
        request = self._request
        if request is not None and not self.idle and not self._in_head:
            self.failed = True
            request.error = str(exc) or "malformed body"
            return
        error = self._error
        if error is None:
            reason = str(exc)
            if reason in _UNSUPPORTED_TRANSFER_ENCODING:
                error = HeadError(501, body=b"Unsupported transfer encoding")
            else:
                error = HeadError(400, _LLHTTP_REASONS.get(reason, ""))
        self._fail_head(error)

    def _fail_head(self, error: HeadError) -> None:
        self.failed = True
        self.ready.append(error)

    def _refuse(self, error: HeadError) -> HeadError:
        """Remember why a callback stops llhttp (httptools reports it only as a callback error)."""
        self._error = error
        return error

    # ------------------------------------------------------------------ llhttp's callbacks

    def on_url(self, url: bytes) -> None:
        # A request begins with its target (its method, a few bytes, needs no holding back).
        if self.idle:
            self.idle = False
            self._in_head = True
            request = self._request = ParsedRequest()
            request.target = url
        else:
            request = self._request  # type: ignore[assignment]
            request.target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        request: ParsedRequest = self._request  # type: ignore[assignment]  # set by on_url
        lower = name.lower()
        request.headers.append((lower, value))
        special = _SPECIAL_HEADERS.get(lower)
        if special is None:
            return
        if special == _HOST:
            request.hosts += 1
            request.host = value
        elif special == _CONTENT_LENGTH:
            try:
                request.content_length = int(value)
            except ValueError:
                raise self._refuse(HeadError(400)) from None
        elif special == _TRANSFER_ENCODING:
            if value.lower() != b"chunked":
                raise self._refuse(HeadError(501, body=b"Unsupported transfer encoding"))
            request.chunked = True
        else:
            request.expect = value

    def on_headers_complete(self) -> None:
        request: ParsedRequest = self._request  # type: ignore[assignment]  # set by on_url
        parser = self._parser
        request.method = method = parser.get_method()
        version = parser.get_http_version()
        if version != "1.1":
            if version == "0.9":  # a request line without a version
                raise self._refuse(HeadError(400))
            if not version.startswith("1."):
                raise self._refuse(HeadError(505, "unsupported protocol version"))
            request.http10 = version == "1.0"
        if not parser.should_keep_alive():
            request.keep_alive = False
        if self._long_input and self._head_size(request) > self._max_header_bytes:
            raise self._refuse(HeadError(431))
        if request.chunked:
            request.content_length = None
        if request.hosts != 1:
            if request.hosts:
                raise self._refuse(HeadError(400))
            if not request.http10 and method != b"CONNECT":
                raise self._refuse(HeadError(400, "missing required Host header"))
        elif request.host.translate(None, _HOST_BYTES):
            raise self._refuse(HeadError(400, "malformed Host header"))
        expect = request.expect
        if expect is not None:
            if expect.lower() == b"100-continue":
                request.expect_continue = not request.http10 and request.content_length != 0
            elif expect:
                request.expect_failed = True
        self._in_head = False
        self.ready.append(request)

    @staticmethod
    def _head_size(request: ParsedRequest) -> int:
        """The bytes of a request's line and headers (as sent with single spaces)."""
        size = len(request.method) + len(request.target) + _REQUEST_LINE_BYTES
        for name, value in request.headers:
            size += len(name) + len(value) + _HEADER_LINE_BYTES
        return size

    def on_body(self, body: bytes) -> None:
        request: ParsedRequest = self._request  # type: ignore[assignment]  # set by on_url
        request.parts.append(body)
        request.buffered += len(body)

    def on_message_complete(self) -> None:
        self._request.complete = True  # type: ignore[union-attr]
        self.idle = True
