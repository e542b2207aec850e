"""HTTP/1.1 over Trio: one task per connection, keep-alive, pipelining, bounded input.

This module knows HTTP, not NSQ: requests are parsed by :mod:`broker.http.parser` where Go's
server parses them, each one is handed to a handler (``async (Request, RequestBody) -> Response``) and the
responses are written in order. The behaviour at the edges follows Go's ``net/http``
server, which nsqd uses:

* the request line and headers together may take :data:`MAX_HEADER_BYTES`; beyond that
  the answer is ``431 Request Header Fields Too Large`` and the connection closes;
* a handler reads the body through :meth:`RequestBody.read` with a byte limit, so a
  large body is never held in memory; ``100 Continue`` is sent when a client waits for
  it and the handler starts reading; any other ``Expect`` is ``417``;
* a body the handler left unread is discarded (up to :data:`MAX_DRAIN_BYTES`) so the
  connection can be reused; a longer one closes the connection (``Connection: close``);
* malformed requests get Go's plain-text answer, byte for byte (``400 Bad Request``,
  ``505``, ``501``, ``431``: no ``Date``, no length) and a close, and so does a head cut
  short by the end of input; an HTTP/1.0 request is answered in HTTP/1.0 and keeps its
  connection only when its first ``Connection`` header says ``keep-alive``.

Requests that arrive together (pipelined) are parsed in one pass and their responses
written together, one write per batch. Responses carry ``Date`` and ``Content-Length``; a
body without ``Content-Type`` gets Go's sniffed ``text/plain; charset=utf-8``. The bytes of
a small response are built once per second and reused.

A plain socket waits for input on the server's :class:`~broker.server.poller.ReadPoller`
(one edge-triggered epoll set), as TCP connections do. A server given an ``inline``
handler (``(Request, bytes) -> Maybe[Response] | None``) lets the poller's
task answer requests whose body is all there as their bytes arrive: the handler answers at
once, or returns what to await (the connection's task then awaits it), or None to leave
the request to the connection's task and its ``handler``. A ``/pub`` answered at once then
costs no task switch and no coroutine, only the poller's wake-up, shared by every
connection that became readable.
"""

from __future__ import annotations

import http
import logging
import os
import re
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import NamedTuple

import trio

from broker.core.maybe import Maybe
from broker.http.parser import HeadError, ParsedRequest, RequestParser
from broker.http.transport import RECEIVE_SIZE, SocketTransport, Transport, open_transport
from broker.server.net import ConnectionServer, peer_address
from broker.server.poller import ReadPoller

__all__ = [
    "http_date",
    "MAX_HEADER_BYTES",
    "MAX_DRAIN_BYTES",
    "Request",
    "Response",
    "RequestBody",
    "BodyReadError",
    "Handler",
    "InlineHandler",
    "HTTP1Server",
    "TEXT_PLAIN",
]

log = logging.getLogger("pynsqd.http")

#: Request line plus headers: Go's ``http.DefaultMaxHeaderBytes`` (1 MiB) plus the 4 KiB
#: of slack its reader allows.
MAX_HEADER_BYTES = (1 << 20) + 4096
#: Unread request body discarded after a response so the connection can be reused
#: (Go's ``maxPostHandlerReadBytes``); more than this closes the connection.
MAX_DRAIN_BYTES = 256 * 1024
#: After closing our side while the client may still be sending, how long to keep
#: reading (and dropping) its data so that the kernel does not answer it with a reset
#: that destroys the response in flight (Go's ``rstAvoidanceDelay``).
LINGER_SECONDS = 0.5

#: What Go's content sniffing says about text bodies.
TEXT_PLAIN = b"text/plain; charset=utf-8"

#: Responses whose bytes are kept for reuse (within the second of their ``Date``): at most
#: this many, with bodies of at most this size.
_CACHED_RESPONSES = 256
_CACHED_BODY_BYTES = 1024
#: Responses to pipelined requests are written together up to this size.
_OUTPUT_BYTES = 256 * 1024
#: A request body up to this size is awaited in the read poller's task when its head came
#: first, so that the request can be answered there.
_INLINE_BODY_BYTES = 64 * 1024
#: Distinct request targets whose decoded path and query are kept, up to this length.
_CACHED_TARGETS = 1024
_CACHED_TARGET_BYTES = 512


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


Handler = Callable[[Request, "RequestBody"], Awaitable[Response]]
#: Answers a request whose whole body is given, in the poller's task: a response, what to
#: await for one (in the connection's task), or None to leave the request to the
#: :data:`Handler`, which then sees it as if nothing had happened. Never raises.
InlineHandler = Callable[[Request, bytes], Maybe[Response] | None]


_REASONS = {status.value: status.phrase.encode() for status in http.HTTPStatus}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_EXPECTATION_FAILED = Response(417)
_BAD_REQUEST = HeadError(400)


class _Connection:
    """One client connection: its transport, parser, the responses not yet written, and
    whether closing must wait for the client to stop sending."""

    __slots__ = ("stream", "transport", "parser", "remote", "output", "output_bytes", "linger", "awaiting")

    def __init__(self, stream: trio.abc.Stream, remote: str, max_header_bytes: int):
        self.stream = stream
        self.transport: Transport = open_transport(stream)
        self.parser = RequestParser(max_header_bytes)
        self.remote = remote
        self.output: list[bytes] = []
        self.output_bytes = 0  # of the responses in output
        self.linger = False
        # a request the poller's task began (see _InlineRequests): its parsed form and what to
        # await for its response
        self.awaiting: tuple[ParsedRequest, Awaitable[Response]] | None = None

    async def flush(self) -> None:
        """Write the responses waiting in :attr:`output` (one write)."""
        output = self.output
        data = output[0] if len(output) == 1 else b"".join(output)
        output.clear()
        self.output_bytes = 0
        await self.transport.send(data)

    async def fill(self, request: ParsedRequest) -> None:
        """Receive more of ``request``'s body, after writing what waits in :attr:`output`
        (a ``100 Continue`` among it); marks the request's error if the client is gone."""
        try:
            if self.output:
                await self.flush()
        except trio.BrokenResourceError:
            request.error = "connection closed"
            return
        data = await self.transport.receive()
        if data:
            self.parser.feed(data)
        else:
            self.parser.eof()


class RequestBody:
    """The body of the request being handled; read it at most once, with a limit."""

    __slots__ = ("_conn", "_request", "complete", "received", "cut_short")

    def __init__(self, conn: _Connection, request: ParsedRequest):
        self._conn = conn
        self._request = request
        self.complete = False
        self.received = 0
        # a read met the end of input within a Content-Length body: Go's reader takes that as
        # the body's end (an error for the handler), so its answer does not announce a close
        self.cut_short = False

    async def read(self, limit: int) -> bytes:
        """Up to ``limit`` bytes of the body (fewer only if the body is shorter).

        Like Go's ``io.LimitReader``: a result of exactly ``limit`` bytes means the body
        may be longer; callers pass their maximum plus one to detect that. Raises
        :class:`BodyReadError` if the body cannot be read.
        """
        if self.complete or limit <= 0:
            return b""
        request = self._request
        if request.expect_continue:  # as Go: on the first read, even if the body came anyway
            request.expect_continue = False
            self._conn.output.append(_CONTINUE)
        while request.buffered < limit and not request.complete:
            if request.error is not None:
                self.cut_short = request.truncated
                raise BodyReadError(request.error)
            await self._conn.fill(request)
        parts = request.parts
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        parts.clear()
        if len(data) > limit:
            parts.append(data[limit:])
            data = data[:limit]
        request.buffered -= len(data)
        self.received += len(data)
        if request.complete and not request.buffered:
            self.complete = True
        return data

    async def discard(self, limit: int) -> bool:
        """Read and drop up to ``limit`` more bytes; True if the body ended within them.
        Raises :class:`BodyReadError` if the body cannot be read."""
        request = self._request
        dropped = 0
        while True:
            dropped += request.buffered
            request.parts.clear()
            request.buffered = 0
            if request.complete:
                self.complete = True
                return True
            if request.error is not None:
                raise BodyReadError(request.error)
            if dropped > limit:
                return False
            await self._conn.fill(request)


_PERCENT = re.compile(rb"%([0-9A-Fa-f]{2})")


def _decode_path(raw: bytes) -> str | None:
    """Go's path unescaping: ``%XX`` decoded, ``+`` kept; None for a bad escape."""
    if b"%" in raw:
        if raw.count(b"%") != len(_PERCENT.findall(raw)):
            return None
        raw = _PERCENT.sub(lambda m: bytes((int(m.group(1), 16),)), raw)
    return raw.decode("utf-8", "surrogateescape")


def _split_target(target: bytes) -> tuple[bytes, bytes]:
    """(path, raw query) of an origin-form or absolute-form request target."""
    if not target.startswith(b"/"):
        scheme, sep, rest = target.partition(b"://")
        if sep:
            slash = rest.find(b"/")
            question = rest.find(b"?")
            if slash == -1 or (question != -1 and question < slash):
                target = b"/" + rest[question:] if question != -1 else b"/"
            else:
                target = rest[slash:]
    path, _, query = target.partition(b"?")
    return path, query


_WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def http_date(seconds: float) -> str:
    """RFC 9110's date (``Sun, 06 Nov 1994 08:49:37 GMT``), the ``Date`` header's, as Go's
    ``http.TimeFormat`` writes it; English names whatever the locale (``email.utils`` does the
    same, at 7 ms of a start's imports)."""
    t = time.gmtime(seconds)
    return (f"{_WEEKDAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year:04d} "
            f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT")


class _ResponseWriter:
    """Renders responses to bytes; the bytes of small ones are kept for the current second.

    The cache is keyed by the response object (kept alive with its bytes, so that its id
    is not reused) and by how it is sent: HTTP/1.0 or 1.1, closing or not, to a HEAD.
    """

    __slots__ = ("_second", "_date", "_cache")

    def __init__(self) -> None:
        self._second = -1
        self._date = b""
        self._cache: dict[int, tuple[Response, bytes]] = {}

    def render(self, response: Response, *, http10: bool, close: bool, head: bool) -> bytes:
        """The bytes of ``response``: in HTTP/1.0 or 1.1, saying whether the connection
        closes, without the body for a HEAD."""
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._date = b"Date: " + http_date(now).encode() + b"\r\n"
            self._cache.clear()
        key = id(response) * 8 + http10 * 4 + close * 2 + head
        cached = self._cache.get(key)
        if cached is not None and cached[0] is response:
            return cached[1]
        data = self._render(response, http10, close, head)
        if len(response.body) <= _CACHED_BODY_BYTES:
            if len(self._cache) >= _CACHED_RESPONSES:
                self._cache.clear()
            self._cache[key] = (response, data)
        return data

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


class _InlineRequests:
    """What a plain HTTP connection waiting between requests leaves the :class:`ReadPoller`:
    called in the poller's task on an edge, it reads the socket and answers the requests
    that came (:meth:`HTTP1Server.answer_inline`), and wakes the connection's task only when
    that task has work. It never raises (the poller's contract): a failure is kept in
    ``failure`` and the connection's task ends the connection on it."""

    __slots__ = ("server", "conn", "poller", "fd", "failure")

    def __init__(self, server: HTTP1Server, conn: _Connection, poller: ReadPoller, fd: int):
        self.server = server
        self.conn = conn
        self.poller = poller
        self.fd = fd
        self.failure: Exception | None = None

    def __call__(self) -> bool:
        try:
            data = os.read(self.fd, RECEIVE_SIZE)
        except BlockingIOError:  # an edge for bytes read already
            return True
        except OSError:  # reset by the peer: the connection's task reads it again and ends
            return False
        if not data:
            return False  # the end of input, which the connection's task reads again
        try:
            self.conn.parser.feed(data)
            return (self.server.answer_inline(self.conn) and len(data) < RECEIVE_SIZE
                    and not self.poller.hung_up(self.fd))
        except Exception as exc:
            self.failure = exc
            return False


def _head_error_answer(error: HeadError) -> bytes:
    """Go's own answer to a request it cannot read, byte for byte: ``<code> <reason>[: <text>]``
    in plain text, without ``Date`` or a length (the connection closes after it)."""
    reason = _REASONS.get(error.status, b"Error")
    if error.text:
        reason += b": " + error.text.encode()
    body = error.body if error.body is not None else b"%d %s" % (error.status, reason)
    return b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nConnection: close\r\n\r\n%s" % (error.status, reason, TEXT_PLAIN,
                                                                                    body)


async def _linger(stream: trio.abc.Stream) -> None:
    """Half-close and drop what the client still sends, for at most :data:`LINGER_SECONDS`."""
    with trio.move_on_after(LINGER_SECONDS):
        try:
            if isinstance(stream, trio.abc.HalfCloseableStream):  # TLS cannot half-close
                await stream.send_eof()
            while await stream.receive_some(RECEIVE_SIZE):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


class HTTP1Server(ConnectionServer):
    """Serves HTTP/1.x on listeners with ``handler``; owns the connection tasks.

    :meth:`serve` runs until :meth:`stop_listening` and :meth:`close_connections` are
    done. Requests on one connection are handled one after another; at shutdown idle
    connections close at once and busy ones after their response.
    """

    def __init__(self, handler: Handler, *, inline: InlineHandler | None = None,
                 max_header_bytes: int = MAX_HEADER_BYTES, ssl_context: ssl.SSLContext | None = None):
        super().__init__("HTTPS" if ssl_context is not None else "HTTP", log, ssl_context)
        self.handler = handler
        self.inline = inline
        self.max_header_bytes = max_header_bytes
        self._connections: set[_Connection] = set()
        self._closing = False
        self._writer = _ResponseWriter()
        self._targets: dict[bytes, tuple[str, str] | None] = {}
        self._methods: dict[bytes, str] = {}

    def ask_to_close(self) -> None:
        """Close idle connections now, busy ones after their response."""
        self._closing = True
        poller = self.poller
        for conn in list(self._connections):
            transport = conn.transport
            if poller is not None and type(transport) is SocketTransport:
                poller.wake(transport.fd)
            transport.wake()

    async def handle_connection(self, stream: trio.abc.Stream) -> None:
        """Answer the requests of one connection until either side ends it."""
        try:
            remote = peer_address(stream)
        except OSError:
            remote = ""
        conn = _Connection(stream, remote, self.max_header_bytes)
        self._connections.add(conn)
        poller = self.poller
        transport = conn.transport
        try:
            if poller is not None and type(transport) is SocketTransport:
                poller.register(transport.fd)
                try:
                    await self._serve_polled(conn, poller, transport.fd)
                finally:
                    poller.unregister(transport.fd)
            else:
                await self._serve(conn)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            conn.linger = False
        finally:
            if conn.awaiting is not None:  # an answer the connection did not live to await
                pending = conn.awaiting[1]
                conn.awaiting = None
                if isinstance(pending, Coroutine):
                    pending.close()
            if conn.linger:
                await _linger(stream)
            self._connections.discard(conn)

    async def _serve(self, conn: _Connection) -> None:
        parser = conn.parser
        ready = parser.ready
        transport = conn.transport
        while True:
            if not ready:
                if conn.output:
                    await conn.flush()
                if parser.failed:
                    return
                if parser.idle:
                    if self._closing:
                        return
                    data = await transport.receive_idle()
                    if data is None:
                        return
                else:
                    data = await transport.receive()
                if data:
                    parser.feed(data)
                else:
                    parser.eof()  # a head cut short is still answered
                continue
            if not await self._answer_next(conn):
                return

    async def _serve_polled(self, conn: _Connection, poller: ReadPoller, fd: int) -> None:
        """:meth:`_serve` for a plain socket: read on its descriptor until a read comes back
        short, then wait on ``poller``, whose task answers what it can meanwhile
        (:class:`_InlineRequests`)."""
        parser = conn.parser
        ready = parser.ready
        inline = _InlineRequests(self, conn, poller, fd) if self.inline is not None else None
        drained = False  # the last read emptied the socket: wait for the next edge first
        while True:
            if conn.awaiting is not None:
                if not await self._answer_awaited(conn):
                    return
                continue
            if ready:
                if not await self._answer_next(conn):
                    return
                continue
            if conn.output:
                await conn.flush()
            if parser.failed or (parser.idle and self._closing):
                return
            if drained:
                await poller.wait_readable(fd, inline)
                drained = False
                if inline is not None and inline.failure is not None:
                    failure, inline.failure = inline.failure, None
                    log.error("HTTP: connection from %s failed: %r", conn.remote, failure)
                    return
                continue
            try:
                data = os.read(fd, RECEIVE_SIZE)
            except BlockingIOError:
                drained = True
                continue
            except OSError:  # reset by the peer
                return
            if not data:
                parser.eof()  # a head cut short is still answered
                continue
            parser.feed(data)
            drained = len(data) < RECEIVE_SIZE and not poller.hung_up(fd)
            if not drained:
                await trio.lowlevel.checkpoint()  # the other connections run before this one reads on

    async def _answer_next(self, conn: _Connection) -> bool:
        """Answer the next parsed request with the handler; False if the connection must end."""
        request = conn.parser.ready.popleft()
        if type(request) is HeadError:
            self._answer_head_error(conn, request)
            await conn.flush()
            return False
        assert type(request) is ParsedRequest
        started = self._start(conn, request)
        if started is None:
            await conn.flush()
            return False
        response = await self.handler(*started)
        body = started[1]
        close = self._closing or not request.keep_alive
        if not request.complete and not close and not body.cut_short:
            close = await self._drain(request, body)
        if request.error is not None and not body.cut_short:
            close = True
        data = self._writer.render(response, http10=request.http10, close=close, head=started[0].method == "HEAD")
        conn.output.append(data)
        if close:
            conn.linger = not request.complete
            await conn.flush()
            return False
        conn.output_bytes += len(data)
        if conn.output_bytes >= _OUTPUT_BYTES:  # many large answers pipelined: write as they come
            await conn.flush()
        return True

    async def _answer_awaited(self, conn: _Connection) -> bool:
        """Await the response to the request the poller's task began, and queue it; False if
        the connection must end (the server began closing meanwhile)."""
        assert conn.awaiting is not None
        request, pending = conn.awaiting
        conn.awaiting = None
        response = await pending
        close = self._closing
        conn.output.append(self._writer.render(response, http10=request.http10, close=close, head=False))
        if close:
            await conn.flush()
        return not close

    def answer_inline(self, conn: _Connection) -> bool:
        """Answer the requests parsed on ``conn`` with the inline handler while it can, and
        write the answers; False when the connection's task has work: a request the
        handler left, a response to await, a write the socket did not take whole.

        Runs in the poller's task; raises what the handler or the parser raised."""
        ready = conn.parser.ready
        inline = self.inline
        assert inline is not None
        while ready:
            parsed = ready[0]
            if (type(parsed) is not ParsedRequest or not parsed.keep_alive or parsed.expect_continue
                    or parsed.expect_failed or parsed.error is not None or self._closing):
                return False
            if not parsed.complete:
                # a small body whose head came first (as many clients send them): wait for the
                # rest here; a larger one is read by the task's handler, which bounds it
                content_length = parsed.content_length
                if content_length is None or content_length > _INLINE_BODY_BYTES:
                    return False
                break
            request = self._request(conn, parsed)
            if request is None:
                return False
            parts = parsed.parts
            answer = inline(request, parts[0] if len(parts) == 1 else b"".join(parts))
            if answer is None:
                return False
            ready.popleft()
            parts.clear()
            parsed.buffered = 0
            if not isinstance(answer, Response):
                conn.awaiting = (parsed, answer)
                return False
            conn.output.append(self._writer.render(answer, http10=parsed.http10, close=False, head=False))
        output = conn.output
        if output:
            data = output[0] if len(output) == 1 else b"".join(output)
            output.clear()
            conn.output_bytes = 0
            transport = conn.transport
            assert type(transport) is SocketTransport
            try:
                sent = os.write(transport.fd, data)
            except BlockingIOError:
                sent = 0
            except OSError:  # the peer is gone: the connection's task finds out on its read
                return False
            if sent < len(data):
                output.append(data[sent:])
                return False
        return True

    def _answer_head_error(self, conn: _Connection, error: HeadError) -> None:
        log.debug("HTTP: bad request from %s: %s %s", conn.remote, error.status, error.text)
        conn.output.append(_head_error_answer(error))
        conn.linger = True

    def _target(self, target: bytes) -> tuple[str, str] | None:
        """(decoded path, raw query) of a request target; None for a bad escape."""
        try:
            return self._targets[target]
        except KeyError:
            pass
        raw_path, raw_query = _split_target(target)
        path = _decode_path(raw_path)
        found = None if path is None else (path, raw_query.decode("utf-8", "surrogateescape"))
        if len(target) <= _CACHED_TARGET_BYTES:
            if len(self._targets) >= _CACHED_TARGETS:
                self._targets.clear()
            self._targets[target] = found
        return found

    def _request(self, conn: _Connection, parsed: ParsedRequest) -> Request | None:
        """The handler's view of a parsed request's head; None for a target with a bad escape."""
        target = self._target(parsed.target)
        if target is None:
            return None
        method = self._methods.get(parsed.method)
        if method is None:
            method = self._methods[parsed.method] = parsed.method.decode("ascii", "replace")
        return Request(method, target[0], target[1], tuple(parsed.headers), parsed.content_length, conn.remote)

    def _start(self, conn: _Connection, parsed: ParsedRequest) -> tuple[Request, RequestBody] | None:
        """The handler's arguments for a request, or None when the server answers it itself
        (a bad target, an Expect it cannot meet): then that answer is queued and the
        connection must close."""
        if parsed.expect_failed:
            conn.output.append(self._writer.render(_EXPECTATION_FAILED, http10=parsed.http10, close=True, head=False))
            conn.linger = not parsed.complete
            return None
        request = self._request(conn, parsed)
        if request is None:
            self._answer_head_error(conn, _BAD_REQUEST)
            return None
        return request, RequestBody(conn, parsed)

    async def _drain(self, parsed: ParsedRequest, body: RequestBody) -> bool:
        """Discard what the handler left of a body, so that the connection can serve the
        next request; True if the connection must close instead."""
        content_length = parsed.content_length
        if parsed.expect_continue:
            # The client may or may not send the body now; the stream's state is unknown.
            return True
        if content_length is not None and content_length - body.received >= MAX_DRAIN_BYTES:
            return True
        try:
            return not await body.discard(MAX_DRAIN_BYTES)
        except BodyReadError:
            return True
