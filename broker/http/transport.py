"""How the HTTP server reads and writes one connection: the I/O beneath its sans-I/O core.

Three kinds, chosen by :func:`open_transport`:

* :class:`PolledTransport`, a plain socket (TCP or unix) where the server has a
  :class:`~broker.server.poller.ReadPoller`: read with ``os.read`` until a read comes back
  short, then wait on the poller (one edge-triggered epoll set for every connection), which
  may call an input handler in its own task meanwhile (:meth:`Transport.receive`'s
  ``on_input``); written with ``os.write`` at once, waiting only when the socket's buffer is
  full. That is one scheduler round per batch of requests instead of Trio's stream layer's
  two checkpoints per call, and no ``epoll_ctl`` per wait;
* :class:`SocketTransport`, a plain socket where there is no poller (no epoll): the same
  reads and writes, waiting through :func:`trio.lowlevel.wait_readable`;
* :class:`Transport`, any other stream (TLS), through Trio's stream methods.

All of them read ``b""`` at EOF or when the peer reset, end a wait on :meth:`Transport.wake`
(the server's shutdown, for a connection between requests), and raise
:class:`trio.BrokenResourceError` when a write cannot be done. ``receive`` and ``send`` are
async (they wait for the socket);
:meth:`Transport.receive_ready` and :meth:`Transport.send_some` are plain, for the poller's
task, which cannot wait. Imported by :mod:`broker.http.server` only; the server closes the
stream, the transport only stops watching it (:meth:`Transport.close`).
"""

from __future__ import annotations

import os

import trio

from broker.server.poller import InputHandler, ReadPoller

__all__ = ["RECEIVE_SIZE", "Transport", "SocketTransport", "PolledTransport", "open_transport"]

#: Bytes asked of the socket per read.
RECEIVE_SIZE = 64 * 1024
_read = os.read


class Transport:
    """Reads and writes a Trio stream; the connection's owner closes the stream."""

    __slots__ = ("stream", "drained", "_wait_scope")

    def __init__(self, stream: trio.abc.Stream):
        self.stream = stream
        #: the last read emptied the socket: the next bytes come with an edge of the poller
        #: (only a :class:`PolledTransport` reads without waiting; the others are always drained)
        self.drained = True
        self._wait_scope: trio.CancelScope | None = None

    async def receive(self, on_input: InputHandler | None = None) -> bytes | None:
        """The next bytes from the peer; ``b""`` once it has closed or reset.

        None when the wait ended without reading: :meth:`wake` ended it, or the poller's task
        took care of what came (``on_input``, called on each edge while a
        :class:`PolledTransport` waits; see :meth:`ReadPoller.wait_readable`). Other transports
        never call ``on_input``.
        """
        with trio.CancelScope() as scope:
            self._wait_scope = scope
            data = await self._receive()
        self._wait_scope = None
        return None if scope.cancelled_caught else data

    async def _receive(self) -> bytes:
        try:
            return bytes(await self.stream.receive_some(RECEIVE_SIZE))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return b""

    def receive_ready(self) -> bytes | None:
        """The bytes already received, without waiting: None when there are none (a stream
        cannot tell without waiting: always None)."""
        return None

    def wake(self) -> None:
        """End the :meth:`receive` now in progress, if any (the server is closing a connection
        that waits between requests: its owner calls this only then)."""
        if self._wait_scope is not None:
            self._wait_scope.cancel()

    async def send(self, data: bytes) -> None:
        """Write all of ``data``; raises :class:`trio.BrokenResourceError` if the peer is gone."""
        try:
            await self.stream.send_all(data)
        except trio.ClosedResourceError as exc:
            raise trio.BrokenResourceError("connection closed") from exc

    def send_some(self, data: bytes) -> int:
        """Write what of ``data`` the peer takes without waiting; returns how many bytes: 0
        also when the peer is gone (the next :meth:`send` raises) and always for a stream,
        which cannot write without waiting."""
        return 0

    def close(self) -> None:
        """Stop using the stream (before the server closes it); safe to call twice."""


class SocketTransport(Transport):
    """A socket stream read and written on its descriptor."""

    __slots__ = ("fd", "_waiting")

    def __init__(self, stream: trio.SocketStream):
        super().__init__(stream)
        self.fd = stream.socket.fileno()  # the socket's descriptor, read and written directly
        self._waiting = False

    async def receive(self, on_input: InputHandler | None = None) -> bytes | None:
        self._waiting = True
        try:
            return await self._receive()
        except trio.ClosedResourceError:  # woken by wake()
            return None
        finally:
            self._waiting = False

    async def _receive(self) -> bytes:
        fd = self.fd
        while True:
            # Waiting first is the checkpoint that lets other tasks run between batches; a
            # peer that already sent more is readable at once.
            await trio.lowlevel.wait_readable(fd)
            try:
                return os.read(fd, RECEIVE_SIZE)
            except BlockingIOError:
                continue
            except OSError:  # reset by the peer
                return b""

    def wake(self) -> None:
        # A cancel scope per read would cost more than the read; instead the waiting task
        # is told that its descriptor is closing. The server closes it right after.
        if self._waiting:
            trio.lowlevel.notify_closing(self.fd)

    async def send(self, data: bytes) -> None:
        fd = self.fd
        view: memoryview | None = None
        while True:
            try:
                sent = os.write(fd, data if view is None else view)
            except BlockingIOError:
                sent = 0
            except OSError as exc:  # EPIPE, ECONNRESET
                raise trio.BrokenResourceError(str(exc)) from exc
            if view is None:
                if sent == len(data):
                    return
                view = memoryview(data)
            if sent == len(view):
                return
            view = view[sent:]
            await trio.lowlevel.wait_writable(fd)

    def send_some(self, data: bytes) -> int:
        try:
            return os.write(self.fd, data)
        except OSError:  # full (EAGAIN), or the peer is gone (EPIPE, ECONNRESET): send() tells which
            return 0


class PolledTransport(SocketTransport):
    """A socket read until it is drained, then waited for on the server's read poller.

    Registered with ``poller`` from its creation until :meth:`close`.
    """

    __slots__ = ("poller", "_woken", "_registered")

    def __init__(self, stream: trio.SocketStream, poller: ReadPoller):
        super().__init__(stream)
        self.poller = poller
        self.drained = False
        self._woken = False
        poller.register(self.fd)
        self._registered = True

    async def receive(self, on_input: InputHandler | None = None) -> bytes | None:
        fd = self.fd
        while True:
            if self.drained:
                await self.poller.wait_readable(fd, on_input)
                self.drained = False
                if on_input is not None or self._woken:
                    return None  # the poller's task may have read and answered: the caller looks again
            # receive_ready(), without its call: this is every request's read
            try:
                data = _read(fd, RECEIVE_SIZE)
            except BlockingIOError:
                self.drained = True
                continue
            except OSError:  # reset by the peer
                return b""
            if len(data) < RECEIVE_SIZE and not self.poller.hung_up(fd):
                self.drained = True
            else:
                await trio.lowlevel.checkpoint()  # the other connections run before this one reads on
            return data

    def receive_ready(self) -> bytes | None:
        """The next bytes, read at once; None when the socket is drained (:attr:`drained`)."""
        fd = self.fd
        try:
            data = _read(fd, RECEIVE_SIZE)
        except BlockingIOError:
            self.drained = True
            return None
        except OSError:  # reset by the peer
            return b""
        # a short read emptied the socket (unless its peer hung up: then no edge will come)
        self.drained = len(data) < RECEIVE_SIZE and not self.poller.hung_up(fd)
        return data

    def wake(self) -> None:
        self._woken = True
        self.poller.wake(self.fd)

    def close(self) -> None:
        if self._registered:
            self._registered = False
            self.poller.unregister(self.fd)


def open_transport(stream: trio.abc.Stream, poller: ReadPoller | None) -> Transport:
    """The transport for ``stream``: its descriptor for a plain socket (waited for on
    ``poller`` when there is one), its methods otherwise."""
    if type(stream) is trio.SocketStream:
        if poller is not None:
            return PolledTransport(stream, poller)
        return SocketTransport(stream)
    return Transport(stream)
