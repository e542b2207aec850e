"""HTTP/1.1 over Trio streams with h11: one task per connection, keep-alive, bounded input.

This module knows HTTP, not NSQ: it parses requests with h11, hands each one to a
handler (``async (Request, RequestBody) -> Response``) and writes the response. The
behaviour at the edges follows Go's ``net/http`` server, which nsqd uses:

* the request line and headers together may take :data:`MAX_HEADER_BYTES`; beyond that
  the answer is ``431 Request Header Fields Too Large`` and the connection closes;
* a handler reads the body through :meth:`RequestBody.read` with a byte limit, so a
  large body is never held in memory; ``100 Continue`` is sent when a client waits for
  it and the handler starts reading;
* a body the handler left unread is discarded (up to :data:`MAX_DRAIN_BYTES`) so the
  connection can be reused; a longer one closes the connection (``Connection: close``);
* malformed requests get ``400 Bad Request`` in Go's plain-text form and a close.

Responses carry ``Date`` and ``Content-Length``; a body without ``Content-Type`` gets
Go's sniffed ``text/plain; charset=utf-8``.
"""

from __future__ import annotations

import email.utils
import http
import logging
import re
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import h11
import trio

from broker.server.net import ConnectionServer, peer_address

__all__ = [
    "MAX_HEADER_BYTES",
    "MAX_DRAIN_BYTES",
    "Request",
    "Response",
    "RequestBody",
    "BodyReadError",
    "Handler",
    "H11Server",
    "TEXT_PLAIN",
]

log = logging.getLogger("pynsqd.http")

#: Request line plus headers: Go's ``http.DefaultMaxHeaderBytes`` (1 MiB) plus the 4 KiB
#: of slack its reader allows.
MAX_HEADER_BYTES = (1 << 20) + 4096
#: Unread request body discarded after a response so the connection can be reused
#: (Go's ``maxPostHandlerReadBytes``); more than this closes the connection.
MAX_DRAIN_BYTES = 256 * 1024
#: Bytes asked of the socket per read.
RECEIVE_SIZE = 64 * 1024
#: After closing our side while the client may still be sending, how long to keep
#: reading (and dropping) its data so that the kernel does not answer it with a reset
#: that destroys the response in flight (Go's ``rstAvoidanceDelay``).
LINGER_SECONDS = 0.5

#: What Go's content sniffing says about text bodies.
TEXT_PLAIN = b"text/plain; charset=utf-8"


@dataclass(frozen=True, slots=True)
class Request:
    """One request's head. ``path`` is percent-decoded; ``raw_query`` is not.

    ``content_length`` is None for a chunked body.
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


@dataclass(frozen=True, slots=True)
class Response:
    """A complete response. ``headers`` are (name, value) byte pairs; ``Date`` and
    ``Content-Length`` are added when it is sent."""

    status: int
    body: bytes = b""
    headers: tuple[tuple[bytes, bytes], ...] = ()


class BodyReadError(Exception):
    """The request body could not be read (the peer closed early or sent bad chunking)."""


Handler = Callable[[Request, "RequestBody"], Awaitable[Response]]


_REASONS = {status.value: status.phrase.encode() for status in http.HTTPStatus}


class _Connection:
    """One client connection: its stream, h11 state and the cancel scope of an idle wait."""

    __slots__ = ("stream", "h11", "remote", "idle_scope")

    def __init__(self, stream: trio.abc.Stream, remote: str, max_header_bytes: int):
        self.stream = stream
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=max_header_bytes)
        self.remote = remote
        self.idle_scope: trio.CancelScope | None = None

    async def receive(self) -> None:
        """Feed the next chunk from the socket (b"" at EOF) to h11."""
        try:
            data = bytes(await self.stream.receive_some(RECEIVE_SIZE))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        self.h11.receive_data(data)

    async def send(self, *events) -> None:
        await self.stream.send_all(b"".join(self.h11.send(event) or b"" for event in events))


class RequestBody:
    """The body of the request being handled; read it at most once, with a limit."""

    __slots__ = ("_conn", "complete", "received")

    def __init__(self, conn: _Connection):
        self._conn = conn
        self.complete = False
        self.received = 0

    async def _next_event(self):
        conn = self._conn
        while True:
            try:
                event = conn.h11.next_event()
            except h11.RemoteProtocolError as exc:
                raise BodyReadError(str(exc)) from exc
            if event is h11.NEED_DATA:
                await conn.receive()
                continue
            return event

    async def read(self, limit: int) -> bytes:
        """Up to ``limit`` bytes of the body (fewer only if the body is shorter).

        Like Go's ``io.LimitReader``: a result of exactly ``limit`` bytes means the body
        may be longer; callers pass their maximum plus one to detect that. Raises
        :class:`BodyReadError` if the body cannot be read.
        """
        if self.complete or limit <= 0:
            return b""
        conn = self._conn
        if conn.h11.they_are_waiting_for_100_continue:
            try:
                await conn.send(h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue"))
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise BodyReadError("connection closed") from exc
        parts = []
        got = 0
        while got < limit:
            event = await self._next_event()
            if type(event) is h11.Data:
                parts.append(event.data)
                got += len(event.data)
            elif type(event) is h11.EndOfMessage:
                self.complete = True
                break
            else:
                raise BodyReadError(f"unexpected {type(event).__name__} in request body")
        self.received += got
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        return data if got <= limit else data[:limit]

    async def discard(self, limit: int) -> bool:
        """Read and drop up to ``limit`` more bytes; True if the body ended within them."""
        dropped = 0
        while not self.complete and dropped <= limit:
            event = await self._next_event()
            if type(event) is h11.Data:
                dropped += len(event.data)
            elif type(event) is h11.EndOfMessage:
                self.complete = True
        return self.complete


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


class _DateHeader:
    """The ``Date`` value, formatted once per second."""

    __slots__ = ("_second", "_value")

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def value(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._value = email.utils.formatdate(now, usegmt=True).encode()
        return self._value


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


class H11Server(ConnectionServer):
    """Serves HTTP/1.1 on listeners with ``handler``; owns the connection tasks.

    :meth:`serve` runs until :meth:`stop_listening` and :meth:`close_connections` are
    done. Requests on one connection are handled one after another; at shutdown idle
    connections close at once and busy ones after their response.
    """

    def __init__(self, handler: Handler, *, max_header_bytes: int = MAX_HEADER_BYTES,
                 ssl_context: ssl.SSLContext | None = None):
        super().__init__("HTTPS" if ssl_context is not None else "HTTP", log, ssl_context)
        self.handler = handler
        self.max_header_bytes = max_header_bytes
        self._connections: set[_Connection] = set()
        self._closing = False
        self._date = _DateHeader()

    def ask_to_close(self) -> None:
        """Close idle connections now, busy ones after their response."""
        self._closing = True
        for conn in list(self._connections):
            if conn.idle_scope is not None:
                conn.idle_scope.cancel()

    async def handle_connection(self, stream: trio.abc.Stream) -> None:
        """Answer the requests of one connection until either side ends it."""
        try:
            remote = peer_address(stream)
        except OSError:
            remote = ""
        conn = _Connection(stream, remote, self.max_header_bytes)
        self._connections.add(conn)
        try:
            while True:
                event = await self._next_request(conn)
                if event is None:
                    break
                if not await self._respond(conn, event):
                    break
                conn.h11.start_next_cycle()
        except h11.RemoteProtocolError as exc:
            await self._send_protocol_error(conn, exc)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            if conn.h11.their_state in (h11.SEND_BODY, h11.ERROR):
                await _linger(stream)
            self._connections.discard(conn)

    async def _next_request(self, conn: _Connection) -> h11.Request | None:
        """The next request's head, or None when the peer is gone or we are closing."""
        checked_idle = False
        while True:
            event = conn.h11.next_event()
            if event is h11.NEED_DATA:
                if not checked_idle:
                    checked_idle = True
                    idle = conn.h11.their_state is h11.IDLE and not conn.h11.trailing_data[0]
                else:
                    idle = False
                if idle:
                    if self._closing:
                        return None
                    with trio.CancelScope() as scope:
                        conn.idle_scope = scope
                        await conn.receive()
                    conn.idle_scope = None
                    if scope.cancelled_caught:
                        return None
                else:
                    await conn.receive()
                continue
            if type(event) is h11.Request:
                return event
            return None  # ConnectionClosed (or PAUSED, which cannot happen between cycles)

    async def _respond(self, conn: _Connection, event: h11.Request) -> bool:
        """Handle one request and send the response; True to keep the connection."""
        raw_path, raw_query = _split_target(event.target)
        path = _decode_path(raw_path)
        if path is None:
            await self._send_plain_error(conn, 400)
            return False
        content_length: int | None = 0
        for name, value in event.headers:
            if name == b"content-length":
                content_length = int(value)
            elif name == b"transfer-encoding":
                content_length = None
        request = Request(
            method=event.method.decode("ascii", "replace"),
            path=path,
            raw_query=raw_query.decode("utf-8", "surrogateescape"),
            headers=tuple(event.headers),
            content_length=content_length,
            remote=conn.remote,
        )
        body = RequestBody(conn)
        response = await self.handler(request, body)
        close = self._closing
        if not body.complete and not close:
            if conn.h11.they_are_waiting_for_100_continue:
                # The client may or may not send the body now; the stream's state is unknown.
                close = True
            elif content_length is not None and content_length - body.received >= MAX_DRAIN_BYTES:
                close = True
            else:
                try:
                    close = not await body.discard(MAX_DRAIN_BYTES)
                except BodyReadError:
                    close = True
        await self._send_response(conn, response, head_only=request.method == "HEAD", close=close)
        return conn.h11.our_state is h11.DONE and conn.h11.their_state is h11.DONE

    async def _send_response(self, conn: _Connection, response: Response, *, head_only: bool, close: bool) -> None:
        headers = list(response.headers)
        body = response.body
        if body and not any(name.lower() == b"content-type" for name, _ in headers):
            headers.append((b"Content-Type", TEXT_PLAIN))
        if close:
            headers.append((b"Connection", b"close"))
        headers.append((b"Date", self._date.value()))
        headers.append((b"Content-Length", str(len(body)).encode()))
        status = response.status
        events: list[h11.Event] = [h11.Response(status_code=status, headers=headers, reason=_REASONS.get(status, b""))]
        if body and not head_only:
            events.append(h11.Data(data=body))
        events.append(h11.EndOfMessage())
        await conn.send(*events)

    async def _send_plain_error(self, conn: _Connection, status: int) -> None:
        """Go's own answer to a request it cannot parse: ``<code> <reason>`` and a close."""
        if conn.h11.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        reason = _REASONS.get(status, b"Error")
        response = Response(status, b"%d %s" % (status, reason), ((b"Content-Type", TEXT_PLAIN),))
        try:
            await self._send_response(conn, response, head_only=False, close=True)
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.LocalProtocolError):
            pass

    async def _send_protocol_error(self, conn: _Connection, exc: h11.RemoteProtocolError) -> None:
        status = exc.error_status_hint or 400
        log.debug("HTTP: bad request from %s: %s", conn.remote, exc)
        await self._send_plain_error(conn, status)
