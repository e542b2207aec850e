"""Sockets shared by the TCP and HTTP servers: listen addresses, address text, the accept loop.

:func:`open_listeners` turns an nsqd-style listen address into bound listeners;
:class:`ConnectionServer` accepts on them and runs one task per connection in a
nursery it owns, with the shutdown steps both servers follow: stop listening,
ask every connection to close, cancel what is left after a grace period.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import ssl
import stat
from typing import Any, NamedTuple

import trio

from broker.gocompat.netaddr import AddrError, lookup_port, split_host_port
from broker.server.poller import ReadPoller, open_poller
from diskqueue import os_error_reason

__all__ = [
    "Address",
    "Addresses",
    "ConnectionServer",
    "ListenError",
    "open_listeners",
    "bound_address",
    "describe_address",
    "peer_address",
]

#: A bound address: ``(host, port)``, or the path of a unix socket.
Address = tuple[str, int] | str

#: Seconds to wait after a failed accept (e.g. EMFILE) before accepting again; the wait
#: doubles while accepting keeps failing, up to ``ACCEPT_RETRY_MAX``.
ACCEPT_RETRY_DELAY = 0.1
ACCEPT_RETRY_MAX = 1.0
#: While accepting keeps failing, one log line per this many seconds.
ACCEPT_LOG_INTERVAL = 10.0


class Addresses(NamedTuple):
    """Where a started daemon listens: ``(host, port)`` pairs or unix socket paths."""

    tcp: Address | None
    http: Address | None
    https: Address | None = None


class ListenError(OSError):
    """A listener could not be opened; the message is nsqd's, Go's error included:
    ``listen (127.0.0.1:4150) failed - listen tcp 127.0.0.1:4150: bind: address already in use``."""


async def open_listeners(address: str, kind: str) -> list[trio.SocketListener]:
    """Listeners for an nsqd address: ``host:port`` (``:port``, ``[v6]:port``, a service name
    or an empty port), or else the path of a unix socket, as Go's ``net.SplitHostPort`` tells
    them apart (``HTTPS`` is always TCP, as nsqd's ``tls.Listen("tcp", ...)``).

    Raises :class:`ListenError` with nsqd's words when the address is unusable or binding
    fails. The caller owns the listeners (a :class:`ConnectionServer` closes those it serves).
    """
    split = _split_host_port(address)
    port = 0
    try:
        if split is None:
            if kind == "HTTPS":
                raise _GoError(f"listen tcp: address {address}: missing port in address")
            return [await _open_unix_listener(address)]
        port = _port_number(split[1])
        return await trio.open_tcp_listeners(port, host=split[0] or None)
    except _GoError as exc:
        raise ListenError(f"listen ({address}) failed - {exc}") from None
    except socket.gaierror:
        raise ListenError(f"listen ({address}) failed - listen tcp: lookup {split[0] if split else address}: "
                          "no such host") from None
    except OSError as exc:
        network, where = ("unix", address) if split is None else ("tcp", describe_address((split[0], port)))
        raise ListenError(f"listen ({address}) failed - listen {network} {where}: bind: {os_error_reason(exc)}") \
            from exc


class _GoError(Exception):
    """An address Go's ``net.Listen`` refuses before binding; the message is Go's."""


def _split_host_port(address: str) -> tuple[str, str] | None:
    """(host, port) as Go's ``net.SplitHostPort`` splits ``address``; None where it refuses it
    (no port, too many colons), which makes nsqd listen on a unix socket of that path."""
    try:
        return split_host_port(address)
    except AddrError:
        return None


def _port_number(port: str) -> int:
    """A listen port as Go reads it: empty is 0, digits (with a sign) are a number that must be
    in range, anything else is a service name (``http``)."""
    try:
        return lookup_port("tcp", port)
    except AddrError as exc:
        raise _GoError(f"listen tcp: {exc}") from None


async def _open_unix_listener(path: str) -> trio.SocketListener:
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(path).st_mode):  # a socket left by an earlier run; never another file
                os.unlink(path)
        await sock.bind(path)
        sock.listen(socket.SOMAXCONN)
    except BaseException:
        sock.close()
        raise
    return trio.SocketListener(sock)


def bound_address(listener: trio.SocketListener) -> Address:
    """The bound address of a listener, as ``(host, port)`` or a path."""
    name = listener.socket.getsockname()
    return name if isinstance(name, str) else (name[0], name[1])


def describe_address(address: Any) -> str:
    """``host:port`` (``[v6]:port``) for a socket address; a unix socket's path as it is."""
    if isinstance(address, str):
        return address
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def peer_address(stream: trio.abc.Stream) -> str:
    """The remote end of a connection (a socket stream, or TLS over one) as text; raises
    ``OSError`` if the peer is already gone."""
    while isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    assert isinstance(stream, trio.SocketStream)
    return describe_address(stream.socket.getpeername())


class ConnectionServer:
    """Accepts connections on listeners and serves each in its own task.

    Subclasses implement :meth:`handle_connection` and :meth:`ask_to_close`, and may start
    tasks of their own beside the connections (:meth:`start_beside`). With an
    ``ssl_context`` every connection is TLS from its first byte (HTTPS): the handler gets a
    :class:`trio.SSLStream` whose handshake runs on its first read. While serving, ``poller``
    is the server's :class:`~broker.server.poller.ReadPoller` (None where the platform has no
    epoll), whose task runs beside the connections, for them to wait on.
    The owner runs :meth:`serve` in its nursery, then at shutdown calls
    :meth:`stop_listening` and :meth:`close_connections`; :meth:`serve`
    returns once both are done.
    """

    def __init__(self, kind: str, logger: logging.Logger, ssl_context: ssl.SSLContext | None = None) -> None:
        self.kind = kind  # names the server in log lines: "TCP", "HTTP", "HTTPS"
        self.log = logger
        self.listener_ssl_context = ssl_context
        self._listener_scope = trio.CancelScope()
        self._nursery: trio.Nursery | None = None
        self._active = 0
        self._all_closed: trio.Event | None = None
        self.poller: ReadPoller | None = None

    async def serve(self, listeners: list[trio.SocketListener], *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Accept on every listener; reports started once all of them accept. Returns once
        every connection has ended, after stopping the tasks beside them."""
        poller = self.poller = open_poller()
        try:
            async with trio.open_nursery() as beside:
                if poller is not None:
                    beside.start_soon(poller.run)
                self.start_beside(beside)
                async with trio.open_nursery() as connections:
                    self._nursery = connections
                    with self._listener_scope:
                        async with trio.open_nursery() as accept:
                            for listener in listeners:
                                accept.start_soon(self._accept_loop, listener, connections)
                            task_status.started()
                    for listener in listeners:
                        await listener.aclose()
                beside.cancel_scope.cancel()  # every connection has ended
        finally:
            self.poller = None
            if poller is not None:
                poller.close()

    def start_beside(self, nursery: trio.Nursery) -> None:
        """Start the server's own tasks that run while it serves (none by default)."""

    def stop_listening(self) -> None:
        """Stop accepting connections (the first step of shutdown)."""
        self._listener_scope.cancel()

    async def close_connections(self, grace: float) -> None:
        """Ask every connection to close; cancel those still open after ``grace`` seconds."""
        self.ask_to_close()
        if self._active:
            self._all_closed = trio.Event()
            with trio.move_on_after(grace):
                await self._all_closed.wait()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def ask_to_close(self) -> None:
        """Make every connection finish what it is doing and close."""
        raise NotImplementedError

    async def handle_connection(self, stream: trio.abc.Stream) -> None:
        """Serve one accepted connection until it ends; the stream is closed by the caller."""
        raise NotImplementedError

    async def _accept_loop(self, listener: trio.SocketListener, connections: trio.Nursery) -> None:
        delay = ACCEPT_RETRY_DELAY
        failures = 0  # since the last log line
        next_log = -float("inf")
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:  # e.g. EMFILE: wait and keep serving the others
                failures += 1
                now = trio.current_time()
                if now >= next_log:
                    self.log.error("%s: accept failed: %s%s", self.kind, exc,
                                   f" ({failures} failures since the last report)" if failures > 1 else "")
                    failures = 0
                    next_log = now + ACCEPT_LOG_INTERVAL
                await trio.sleep(delay)
                delay = min(delay * 2, ACCEPT_RETRY_MAX)
                continue
            delay = ACCEPT_RETRY_DELAY  # the reporting interval runs on: one freed descriptor ends no flood
            connections.start_soon(self._run_connection, stream)

    async def _run_connection(self, stream: trio.SocketStream) -> None:
        self._active += 1
        try:
            if self.listener_ssl_context is None:
                await self.handle_connection(stream)
            else:
                # https_compatible: browsers and Go close without close_notify
                await self.handle_connection(trio.SSLStream(stream, self.listener_ssl_context, server_side=True,
                                                            https_compatible=True))
        finally:
            # the socket, not the TLS stream: a close_notify could wait on a client that stopped reading
            with trio.CancelScope(shield=True):
                await stream.aclose()
            self._active -= 1
            if not self._active and self._all_closed is not None:
                self._all_closed.set()
