"""HTTP/1.1 over Trio: one task per connection, keep-alive, pipelining, bounded input.

This module knows HTTP, not NSQ, and does the I/O only: what the bytes mean and what to
answer is :class:`~broker.http.connection.HTTPConnection`'s (the sans-I/O core: Go's rules
for keep-alive, ``100 Continue``, draining, refusals, rendering), reading and writing a
socket or a TLS stream is :mod:`broker.http.transport`'s. Between them is one I/O loop
per connection (:class:`_Exchange`): feed what was received, answer what the connection
hands out, write what it queued, wait for more.

A request is answered by the server's ``handler`` (``async (Request, RequestBody) ->
Response``), which reads the body through :meth:`RequestBody.read` with a byte limit, so a
large body is never held in memory. Requests that arrive together (pipelined) are parsed in
one pass and their responses written together, one write per batch.

The loop has two drivers. The connection's task runs it (:meth:`_Exchange.run`), awaiting
the handler and the socket. While that task waits between requests on the server's
:class:`~broker.server.poller.ReadPoller` (a plain socket), the poller's task runs a step of
the same loop on each edge (:meth:`_Exchange.__call__`: read, feed, answer, write; plain,
never awaiting), if the server was given an ``inline`` handler (``(Request, bytes) ->
Maybe[Response] | None``): a request whose body is all there is answered at once
(:meth:`~broker.http.connection.HTTPConnection.answer_whole`), or by what to await (the
connection's task then awaits it), or left to the connection's task and its ``handler``
(None). A small body whose head came first is waited for there. A ``/pub`` answered at once
then costs no task switch and no coroutine, only the poller's wake-up, shared by every
connection that became readable. Whichever task writes, the answers go out in request
order. The poller's task never raises for a connection: what fails in it is kept for the
connection's task, which ends the connection on it.

Imported by :mod:`broker.http.api` (and, for :class:`Request`, :class:`Response`,
:class:`RequestBody`, by the endpoints); imports the core (:mod:`broker.http.connection`),
the transports and :mod:`broker.server.net` for the listener loop.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable, Coroutine

import trio

from broker.http.connection import MAX_DRAIN_BYTES, MAX_HEADER_BYTES, HTTPConnection, WholeAnswer
from broker.http.events import CLOSED, NEED_DATA, BodyReadError, Request, Response, Signal
from broker.http.render import TEXT_PLAIN, ResponseRenderer, http_date
from broker.http.transport import RECEIVE_SIZE, Transport, open_transport
from broker.server.net import ConnectionServer, peer_address

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

#: After closing our side while the client may still be sending, how long to keep
#: reading (and dropping) its data so that the kernel does not answer it with a reset
#: that destroys the response in flight (Go's ``rstAvoidanceDelay``).
LINGER_SECONDS = 0.5
#: Responses to pipelined requests are written together up to this size.
_OUTPUT_BYTES = 256 * 1024
#: A request body up to this size is awaited in the read poller's task when its head came
#: first, so that the request can be answered there.
_INLINE_BODY_BYTES = 64 * 1024

Handler = Callable[[Request, "RequestBody"], Awaitable[Response]]
#: Answers a request whose whole body is given, in the poller's task: a response, what to
#: await for one (in the connection's task), or None to leave the request to the
#: :data:`Handler`, which then sees it as if nothing had happened. Never raises.
InlineHandler = WholeAnswer


class RequestBody:
    """The body of the request being handled; read it at most once, with a limit."""

    __slots__ = ("_conn", "_exchange")

    def __init__(self, exchange: _Exchange):
        self._conn = exchange.conn
        self._exchange = exchange

    async def read(self, limit: int) -> bytes:
        """Up to ``limit`` bytes of the body (fewer only if the body is shorter).

        Like Go's ``io.LimitReader``: a result of exactly ``limit`` bytes means the body
        may be longer; callers pass their maximum plus one to detect that. Raises
        :class:`BodyReadError` if the body cannot be read.
        """
        while True:
            data = self._conn.read_body(limit)
            if data is not None:
                return data
            await self._exchange.fill()


class _Exchange:
    """One connection's I/O loop: its :class:`HTTPConnection`, its transport, and the answer
    the poller's task began for the connection's task to await.

    :meth:`run` is the connection's task; :meth:`__call__` is the input handler it leaves
    the poller while it waits (it never raises: a failure is kept in ``failure``).
    """

    __slots__ = ("conn", "transport", "handler", "inline", "pending", "failure")

    def __init__(self, conn: HTTPConnection, transport: Transport, handler: Handler, inline: InlineHandler | None):
        self.conn = conn
        self.transport = transport
        self.handler = handler
        self.inline = inline
        #: the answer to the request being answered, to await (the poller's task began it)
        self.pending: Awaitable[Response] | None = None
        self.failure: Exception | None = None  # what failed in the poller's task

    def __call__(self) -> bool:
        """The poller's task's step, on an edge: read the socket, answer with the inline handler
        what it answers at once (:meth:`HTTPConnection.answer_whole`) and write the answers;
        False when the connection's task must go on instead (it has a request to answer or an
        answer to await, the socket did not take the answers whole, a read was full, the input
        ended, the connection is over)."""
        transport = self.transport
        data = transport.receive_ready()
        if not data:
            # None: an edge for bytes read already; b"": the end of input (or a reset), which the
            # connection's task reads again
            return data is None
        conn = self.conn
        try:
            conn.receive_data(data)
            answer = conn.answer_whole(self.inline, _INLINE_BODY_BYTES)  # type: ignore[arg-type]  # set when called
            if answer is not NEED_DATA:
                if type(answer) is not Signal:
                    self.pending = answer  # type: ignore[assignment]  # an awaitable
                return False
            if conn.output:
                out = conn.data_to_send()
                sent = transport.send_some(out)
                if sent < len(out):  # the rest is for the connection's task to write
                    conn.put_back(out[sent:])
                    return False
            return transport.drained
        except Exception as exc:
            self.failure = exc
            return False

    async def run(self) -> None:
        """Serve the connection until either side ends it (the connection's task): answer what
        the connection hands out with the handler (or await the answer the poller's task
        began), write what it queued when it needs input, wait for input."""
        conn = self.conn
        transport = self.transport
        handler = self.handler
        on_input = self if self.inline is not None else None
        while True:
            pending = self.pending
            if pending is None:
                event = conn.next_event()
                if event is NEED_DATA:
                    if conn.output:
                        await transport.send(conn.data_to_send())
                        if conn.closing:
                            continue  # the server began closing meanwhile: an idle connection ends now
                    data = await transport.receive(on_input)
                    if data is None:  # woken: by the shutdown, or by the poller's task
                        failure = self.failure
                        if failure is not None:
                            self.failure = None
                            log.error("HTTP: connection from %s failed: %r", conn.remote, failure)
                            return
                        continue
                    conn.receive_data(data)
                    continue
                if event is CLOSED:
                    if conn.output:
                        await transport.send(conn.data_to_send())
                    return
                response = await handler(event, RequestBody(self))  # type: ignore[arg-type]  # a Request
            else:
                self.pending = None
                response = await pending
            conn.send_response(response)
            if conn.output_bytes >= _OUTPUT_BYTES:  # many large answers pipelined: write as they come
                await transport.send(conn.data_to_send())

    async def fill(self) -> None:
        """Receive more of the body being read, after writing what is queued (a ``100
        Continue`` among it); the body ends with an error if the client is gone."""
        conn = self.conn
        if conn.output:
            try:
                await self.transport.send(conn.data_to_send())
            except trio.BrokenResourceError:
                conn.send_failed()
                return
        data = await self.transport.receive()
        if data is not None:
            conn.receive_data(data)

    def abandon(self) -> None:
        """The connection ended: an answer it did not live to await is closed unawaited."""
        pending = self.pending
        self.pending = None
        if isinstance(pending, Coroutine):
            pending.close()


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
        self._connections: set[_Exchange] = set()
        self._closing = False
        self._renderer = ResponseRenderer()

    def ask_to_close(self) -> None:
        """Close idle connections now, busy ones after their response."""
        self._closing = True
        for exchange in list(self._connections):
            conn = exchange.conn
            conn.closing = True
            if conn.idle:  # a wait for a request to come; a connection busy with one ends after it
                exchange.transport.wake()

    async def handle_connection(self, stream: trio.abc.Stream) -> None:
        """Answer the requests of one connection until either side ends it."""
        try:
            remote = peer_address(stream)
        except OSError:
            remote = ""
        conn = HTTPConnection(remote, self.max_header_bytes, self._renderer)
        conn.closing = self._closing
        transport = open_transport(stream, self.poller)
        exchange = _Exchange(conn, transport, self.handler, self.inline)
        self._connections.add(exchange)
        try:
            try:
                await exchange.run()
            finally:
                transport.close()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            conn.linger = False
        finally:
            exchange.abandon()
            if conn.linger:
                await _linger(stream)
            self._connections.discard(exchange)
