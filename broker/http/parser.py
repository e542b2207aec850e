"""HTTP/1.x requests read off a connection's bytes where Go's ``net/http`` server reads them.

:class:`RequestParser` is fed what the socket gives; every request whose head is complete
goes into :attr:`RequestParser.ready` as a :class:`ParsedRequest`, its body following into
it as it arrives. Pipelined requests received together are parsed in one pass. A head that
cannot be served ends the stream with a :class:`HeadError` in ``ready`` after the requests
before it; a body that cannot be read marks its request (:attr:`ParsedRequest.error`) and
ends the stream.

Where a request ends and the next begins is exactly where Go puts it, so that no request
can hide in another's body for one server and not for the other: a head ends at its first
blank line (LF or CR LF, :mod:`broker.http.head` reads it); a body is as long as its
``Content-Length`` (none: empty) or its chunking says (:mod:`broker.http.chunked`), and
HTTP/1.0 ignores ``Transfer-Encoding``; after a ``POST``, up to four CR or LF bytes before
the next request line are skipped (Go's tolerance for old clients). A head may take
``max_header_bytes`` (more is ``431``); a line Go refuses is refused as soon as it is
whole, as Go reads a head line by line; the end of input within a head is ``400``.
"""

from __future__ import annotations

from collections import deque

from broker.http.chunked import ChunkedBody, ChunkedBodyError
from broker.http.head import HeadError, ParsedRequest, header_line_error, parse_head, request_line_error

__all__ = ["HeadError", "ParsedRequest", "RequestParser"]

#: CR or LF bytes Go drops before a request line that follows a POST (``numLeadingCRorLF`` of
#: a 4-byte peek).
_SKIPPED_AFTER_POST = 4


def _head_end(buf: bytes | bytearray, start: int) -> int:
    """The index of the LF that ends a head's last line (the blank line follows it), searching
    from ``start``; -1 when no blank line has come yet."""
    crlf = buf.find(b"\n\r\n", start)
    lf = buf.find(b"\n\n", start, crlf + 1 if crlf >= 0 else len(buf))
    return lf if lf >= 0 else crlf


class RequestParser:
    """Parses one connection's requests.

    Callers :meth:`feed` received bytes and take requests from :attr:`ready` in order;
    :meth:`eof` says the peer will send no more. After a :class:`HeadError`, a body error or
    EOF :attr:`failed` is set and further input is ignored.
    """

    __slots__ = ("ready", "failed", "idle", "_max_header_bytes", "_held", "_scanned", "_checked", "_lines",
                 "_request", "_left", "_chunked", "_skip")

    def __init__(self, max_header_bytes: int):
        self._max_header_bytes = max_header_bytes
        self.ready: deque[ParsedRequest | HeadError] = deque()
        self.failed = False
        #: no byte of a next request has arrived: the connection waits between requests
        self.idle = True
        # input kept for the next feed: the start of a head, or of a piece of chunking
        self._held = bytearray()
        self._scanned = 0  # how far the held head was searched for its end
        self._checked = 0  # how far its lines were checked
        self._lines = 0  # and how many
        self._request: ParsedRequest | None = None  # the request whose body is arriving
        self._left = 0  # bytes still to come of its Content-Length body
        self._chunked: ChunkedBody | None = None  # or the decoder of its chunked one
        self._skip = 0  # CR and LF bytes that may still be skipped before the next request line

    def feed(self, data: bytes) -> None:
        """Parse ``data``: complete heads go to :attr:`ready`, body bytes to their request.

        A head that began in an earlier feed is searched for its end only in what is new,
        so a head sent in pieces costs about what one sent whole does.
        """
        if self.failed:
            return
        held = self._held
        if held:
            held += data
            if self._request is None:
                if _head_end(held, self._scanned) < 0:
                    self._scanned = max(len(held) - 2, 0)
                    self._check_partial(held, 0)
                    return
            buf = bytes(held)
            held.clear()
        else:
            buf = data
        pos = 0
        end = len(buf)
        ready = self.ready
        while pos < end:
            request = self._request
            if request is not None:
                pos = self._body(request, buf, pos)
                if self._request is not None:
                    break
                continue
            if self._skip and buf[pos] in b"\r\n":
                pos += 1
                self._skip -= 1
                continue
            # the head ends at its first blank line, LF or CR LF
            crlf = buf.find(b"\n\r\n", pos)
            last = buf.find(b"\n\n", pos, crlf + 1 if crlf >= 0 else end)
            if last >= 0:
                after = last + 2
            elif crlf >= 0:
                last = crlf
                after = last + 3
            else:
                self.idle = False
                held += buf[pos:]
                self._scanned = max(len(held) - 2, 0)
                self._checked = self._lines = 0
                self._check_partial(held, 0)
                return
            if after - pos > self._max_header_bytes:
                self._checked = self._lines = 0
                self._check_partial(buf, pos)
                return
            try:
                request = parse_head(buf[pos:last + 1])
            except HeadError as error:
                self._fail(error)
                return
            ready.append(request)
            pos = after
            self._skip = _SKIPPED_AFTER_POST if request.method == b"POST" else 0
            length = request.content_length
            if length is None:
                self._chunked = ChunkedBody()
                self._request = request
                self.idle = False
            elif length:
                if end - pos >= length:  # the whole body is here
                    request.parts.append(buf[pos:pos + length])
                    request.buffered = length
                    request.complete = True
                    self.idle = True
                    pos += length
                else:
                    self._left = length
                    self._request = request
                    self.idle = False
            else:
                request.complete = True
                self.idle = True
        if pos < end and not self.failed:
            held += buf[pos:]

    def _body(self, request: ParsedRequest, buf: bytes, pos: int) -> int:
        """Give ``request`` the body bytes in ``buf`` from ``pos``; returns where they end."""
        chunked = self._chunked
        if chunked is None:
            take = min(self._left, len(buf) - pos)
            request.parts.append(buf[pos:pos + take])
            request.buffered += take
            self._left -= take
            pos += take
            if self._left:
                return pos
        else:
            parts = request.parts
            first = len(parts)
            try:
                pos = chunked.feed(buf, pos, parts)
            except ChunkedBodyError as exc:
                request.error = str(exc)
                self.failed = True
                return len(buf)
            for part in parts[first:]:
                request.buffered += len(part)
            if not chunked.done:
                return pos
            self._chunked = None
        request.complete = True
        self._request = None
        self.idle = True
        return pos

    def _check_partial(self, buf: bytes | bytearray, start: int) -> None:
        """Refuse a head not yet whole (or over the limit) that Go would refuse already: a
        bad line within the limit, else the limit."""
        limit = start + self._max_header_bytes
        checked = start + self._checked
        stop = min(len(buf), limit)
        while True:
            newline = buf.find(b"\n", checked, stop)
            if newline < 0:
                break
            line = bytes(buf[checked:newline])
            if checked == start:
                error = request_line_error(line)
            else:
                error = header_line_error(line, self._lines == 1)
            if error is not None:
                self._fail(error)
                return
            self._lines += 1
            checked = newline + 1
        self._checked = checked - start
        if len(buf) > limit:
            self._fail(HeadError(431))

    def _fail(self, error: HeadError) -> None:
        self.failed = True
        self._held.clear()
        self.ready.append(error)

    def eof(self) -> None:
        """The peer sent all it will: a body still expected cannot be read, a head begun is
        answered ``400`` (Go's ``unexpected EOF``)."""
        if self.failed:
            return
        self.failed = True
        request = self._request
        if request is not None:
            request.error = "unexpected EOF"
            request.truncated = self._chunked is None
        elif not self.idle:
            self._held.clear()
            self.ready.append(HeadError(400))
