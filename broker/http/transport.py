"""How the HTTP server reads and writes one connection.

A plain socket (TCP or unix) is read and written on its descriptor: ``os.read`` after the
event loop says it is readable, ``os.write`` at once, waiting only when the socket's buffer is
full. That is one scheduler round per batch of requests instead of Trio's stream layer's two
checkpoints per call. Any other stream (TLS) goes through Trio's stream methods.

Both kinds end an idle read on :meth:`wake` (the server's shutdown), read ``b""`` at EOF or
when the peer reset, and raise :class:`trio.BrokenResourceError` when a write cannot be done.
"""

from __future__ import annotations

import os

import trio

__all__ = ["RECEIVE_SIZE", "Transport", "open_transport"]

#: Bytes asked of the socket per read.
RECEIVE_SIZE = 64 * 1024


class Transport:
    """Reads and writes a Trio stream; the connection's owner closes the stream."""

    __slots__ = ("stream", "_idle_scope")

    def __init__(self, stream: trio.abc.Stream):
        self.stream = stream
        self._idle_scope: trio.CancelScope | None = None

    async def receive(self) -> bytes:
        """The next bytes from the peer; ``b""`` once it has closed or reset."""
        try:
            return bytes(await self.stream.receive_some(RECEIVE_SIZE))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return b""

    async def receive_idle(self) -> bytes | None:
        """As :meth:`receive`, between requests: None if :meth:`wake` ended the wait."""
        with trio.CancelScope() as scope:
            self._idle_scope = scope
            data = await self.receive()
        self._idle_scope = None
        return None if scope.cancelled_caught else data

    def wake(self) -> None:
        """End a :meth:`receive_idle` now in progress."""
        if self._idle_scope is not None:
            self._idle_scope.cancel()

    async def send(self, data: bytes) -> None:
        """Write all of ``data``; raises :class:`trio.BrokenResourceError` if the peer is gone."""
        try:
            await self.stream.send_all(data)
        except trio.ClosedResourceError as exc:
            raise trio.BrokenResourceError("connection closed") from exc


class SocketTransport(Transport):
    """A socket stream read and written on its descriptor."""

    __slots__ = ("fd", "_idle")

    def __init__(self, stream: trio.SocketStream):
        super().__init__(stream)
        self.fd = stream.socket.fileno()  # the socket's descriptor, read and written directly
        self._idle = False

    async def receive(self) -> bytes:
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

    async def receive_idle(self) -> bytes | None:
        self._idle = True
        try:
            return await self.receive()
        except trio.ClosedResourceError:  # woken by wake()
            return None
        finally:
            self._idle = False

    def wake(self) -> None:
        # A cancel scope per read would cost more than the read; instead the waiting task
        # is told that its descriptor is closing. The server closes it right after.
        if self._idle:
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


def open_transport(stream: trio.abc.Stream) -> Transport:
    """The transport for ``stream``: its descriptor for a plain socket, its methods otherwise."""
    if type(stream) is trio.SocketStream:
        return SocketTransport(stream)
    return Transport(stream)
