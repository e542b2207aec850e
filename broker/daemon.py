"""The daemon: a broker with its TCP and HTTP listeners, signals and shutdown order.

Shutdown (SIGTERM/SIGINT, or :meth:`Daemon.request_shutdown`) runs in this
order: stop the listeners, refuse new publishes, ask every connection to
flush and close (cancelling what is left after a grace period), then let the
broker write memory, in-flight and deferred messages to disk and persist its
metadata. A second signal during shutdown exits at once.
"""

from __future__ import annotations

import atexit
import dataclasses
import gc
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from broker.config.options import VERSION_TEXT, Options
from broker.config.tls import TLS_REQUIRED
from broker.config.unbuilt import unbuilt_warnings
from broker.core.broker import Broker, ShutdownIncomplete
from broker.lookup import Identity, LookupClient
from broker.observe.statsd_prefix import statsd_prefix
from broker.server.fdlimit import raise_open_files_limit
from broker.server.net import Addresses, ListenError, bound_address, describe_address, open_listeners
from broker.server.tcp import TCPServer
from broker.server.tls import TLSConfigError, client_context, peer_context, server_context
from broker.storage import DataDirectory, DataPathError, MetadataLoadError, MetadataWriteError
from diskqueue import os_error_reason

if TYPE_CHECKING:
    from broker.http.api import HTTPServer
    from broker.observe.statsd_pusher import StatsdPusher
    from broker.replication import Replicator

__all__ = ["Daemon", "Addresses", "run"]

log = logging.getLogger("pynsqd")

#: Allocations between two runs of the cyclic garbage collector's youngest generation.
GC_THRESHOLD = 50_000

#: Seconds connections get to flush and close at shutdown.
SHUTDOWN_GRACE = 5.0


class Daemon:
    """A broker plus its listeners. Owns every task it starts in :meth:`run`."""

    def __init__(self, options: Options):
        self.options = options
        # TLSConfigError (a ValueError) for unusable certificate, key or CA files
        self.ssl_context = server_context(options)
        authd = None
        if options.auth_http_addresses:
            from broker.server.auth import AuthClient  # only with auth servers: RE2 and httpx come with it

            authd = AuthClient(options.auth_http_addresses, options.http_client_connect_timeout,
                               options.http_client_request_timeout, client_context(options))
        # replication is chosen here, once: the broker's core gets its sending side and fence,
        # the TCP server its holding side (without --replicas or a cluster secret, the core's
        # do-nothing ones); a cluster secret alone lets topics have replicas of their own
        self.replicator: Replicator | None = None
        if options.replicas > 1 or options.replication_secret_file:
            from broker.replication import Replicator  # only when copies are kept on peers

            self.replicator = Replicator(options, Path(options.data_dir()),
                                         _replication_secret(options.replication_secret_file),
                                         peer_context(options))
            self.broker = Broker(options, DataDirectory(options), self.replicator.copies, self.replicator.fence)
        else:
            self.broker = Broker(options, DataDirectory(options))
        self.tcp = TCPServer(self.broker, self.ssl_context, authd)
        if self.replicator is not None:
            self.tcp.replicas = self.replicator.holder
        self.http: HTTPServer | None = None
        self.lookup: LookupClient | None = None
        self.https: HTTPServer | None = None
        self.statsd: StatsdPusher | None = None
        self._stop = trio.Event()

    def request_shutdown(self) -> None:
        """Begin the graceful shutdown; :meth:`run` returns when it is done."""
        self._stop.set()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Start everything, report :class:`Addresses`, serve until shutdown is requested.

        Logs the version and node id first, as nsqd does, then one warning per option
        given that pynsqd does not act on.
        """
        opts = self.options
        log.info("%s", VERSION_TEXT)
        log.info("ID: %d", opts.node_id)
        raise_open_files_limit(log)  # as Go's runtime does for nsqd
        for warning in unbuilt_warnings(opts):
            log.warning("%s", warning)
        # As nsqd: the data path is locked, then the listeners open, and only then is anything in
        # the data path read or written; a start that fails before leaves it as it was.
        self.broker.lock_storage()
        opened: list[trio.SocketListener] = []
        try:
            tcp_listeners = await open_listeners(opts.tcp_address, "TCP")
            opened += tcp_listeners
            http_listeners = https_listeners = None
            if opts.http_address:
                http_listeners = await open_listeners(opts.http_address, "HTTP")
                opened += http_listeners
            if self.ssl_context is not None and opts.https_address:
                https_listeners = await open_listeners(opts.https_address, "HTTPS")
                opened += https_listeners
            await self._serve(opts, tcp_listeners, http_listeners, https_listeners, task_status)
        finally:
            self.broker.unlock_storage()  # run() gave it back already, unless it never started
            with trio.CancelScope(shield=True):
                for listener in opened:  # closing twice is harmless: the servers close those they served
                    await listener.aclose()
        log.info("bye")

    async def _serve(self, opts: Options, tcp_listeners: list[trio.SocketListener],
                     http_listeners: list[trio.SocketListener] | None,
                     https_listeners: list[trio.SocketListener] | None,
                     task_status: trio.TaskStatus[Addresses]) -> None:
        """Load the broker, serve on the listeners until shutdown is requested, shut down."""
        async with trio.open_nursery() as nursery:
            with _no_cyclic_collection():
                await nursery.start(self.broker.run)
            tcp_address = bound_address(tcp_listeners[0])
            await nursery.start(self.tcp.serve, tcp_listeners)
            log.info("TCP: listening on %s", describe_address(tcp_address))
            http_address = bound_address(http_listeners[0]) if http_listeners is not None else None
            https_address = bound_address(https_listeners[0]) if https_listeners is not None else None
            addresses = Addresses(tcp_address, http_address, https_address)
            # as nsqd, a broadcast port left at 0 becomes the port bound (GET /config shows it;
            # 0 stays for a unix socket or no listener), and the statsd prefix is expanded once,
            # for this host's broadcast address and HTTP port (GET /config/statsd_prefix shows it)
            http_port = opts.broadcast_http_port or _port(http_address)
            tcp_port = opts.broadcast_tcp_port or _port(tcp_address)
            changes: dict[str, Any] = {}
            if http_port != opts.broadcast_http_port:
                changes["broadcast_http_port"] = http_port
            if tcp_port != opts.broadcast_tcp_port:
                changes["broadcast_tcp_port"] = tcp_port
            if opts.statsd_prefix:
                changes["statsd_prefix"] = statsd_prefix(opts.statsd_prefix, opts.broadcast_address, http_port)
            if changes:
                opts = dataclasses.replace(opts, **changes)
                self.broker.reconfigure(opts)
            if http_listeners is not None or https_listeners is not None:
                from broker.http.api import HTTPServer
            if http_listeners is not None:
                self.http = HTTPServer(self.broker, addresses, tls_required=opts.tls_required == TLS_REQUIRED)
                await nursery.start(self.http.serve, http_listeners)
                log.info("HTTP: listening on %s", describe_address(http_address))
            if https_listeners is not None:
                self.https = HTTPServer(self.broker, addresses, ssl_context=self.ssl_context)
                await nursery.start(self.https.serve, https_listeners)
                log.info("HTTPS: listening on %s", describe_address(https_address))
            self.lookup = LookupClient(self.broker, Identity.of(opts, _port(tcp_address), _port(http_address)))
            self.broker.listen(self.lookup)
            await nursery.start(self.lookup.run)
            if self.replicator is not None:
                # channels deliver once the peers said what they took over from this node
                await nursery.start(self.replicator.run, self.broker, self.lookup.nodes,
                                    (opts.broadcast_address, tcp_port))
            statsd_scope = trio.CancelScope()
            if opts.statsd_address:
                from broker.observe.statsd_pusher import StatsdPusher  # only with a statsd to push to

                self.statsd = StatsdPusher(self.broker)
                await nursery.start(_run_in_scope, statsd_scope, self.statsd.run)
            task_status.started(addresses)

            await self._stop.wait()
            log.info("shutting down")
            statsd_scope.cancel()
            self.tcp.stop_listening()
            for http in (self.http, self.https):
                if http is not None:
                    http.stop_listening()
            self.broker.exiting = True
            await self.tcp.close_connections(SHUTDOWN_GRACE)
            for http in (self.http, self.https):
                if http is not None:
                    await http.close_connections(SHUTDOWN_GRACE)
            with _no_cyclic_collection():
                await self.broker.shutdown()
            nursery.cancel_scope.cancel()


@contextmanager
def _no_cyclic_collection() -> Iterator[None]:
    """Keep the cyclic garbage collector from running in the block (start-up, shutdown).

    Loading thousands of topics allocates long-lived objects by the hundred thousand, and
    each collection they trigger scans all of those made before it: a quarter of a
    10,000-topic start went to collections that freed nothing. Reference counting still
    frees everything acyclic. At the end the objects made in the block move to the oldest
    generation unscanned (``freeze`` then ``unfreeze``): left in the youngest, they would
    make its next collection as long as the ones avoided. Cycles among them are collected
    with that generation.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.unfreeze()
        if was_enabled:
            gc.enable()


async def _run_in_scope(scope: trio.CancelScope, run: Callable[..., Awaitable[None]],
                        *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Start ``run`` inside ``scope``, so the caller can stop it alone."""
    with scope:
        await run(task_status=task_status)


def _replication_secret(path: str) -> bytes:
    """The cluster's secret from ``--replication-secret-file`` (b"" when none is given); its
    surrounding whitespace (a final newline) is not part of it. Raises ValueError (a start
    failure) for a file that cannot be read or holds nothing."""
    if not path:
        return b""
    try:
        with open(path, "rb") as file:
            secret = file.read(1 << 16).strip()
            mode = os.fstat(file.fileno()).st_mode
    except OSError as exc:
        raise ValueError(f"--replication-secret-file: open {path}: {os_error_reason(exc)}") from None
    if not secret:
        raise ValueError(f"--replication-secret-file {path} is empty")
    if mode & 0o077:
        log.warning("REPLICATION: --replication-secret-file %s can be read by other users (mode %o): "
                    "chmod 600 it", path, mode & 0o777)
    return secret


def _port(address: object) -> int:
    """The port of a bound ``(host, port)``; 0 for a unix socket or no listener, as nsqd registers."""
    return address[1] if isinstance(address, tuple) else 0


async def _main(options: Options) -> None:
    daemon = Daemon(options)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            async def watch_signals() -> None:
                async for signum in signals:
                    if daemon._stop.is_set():
                        log.warning("second signal: exiting without a clean shutdown")
                        nursery.cancel_scope.cancel()
                        return
                    log.info("received signal %s", signal.Signals(signum).name)
                    daemon.request_shutdown()

            nursery.start_soon(watch_signals)
            await daemon.run()
            nursery.cancel_scope.cancel()


def _root_causes(exc: BaseException) -> list[BaseException]:
    """The leaf exceptions of a (possibly nested) exception group."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _root_causes(sub)]
    return [exc]


def run(options: Options) -> int:
    """Run the daemon until a signal stops it; the exit status for the CLI."""
    # Messages hold no reference cycles (reference counting frees them), yet every
    # one is an allocation that counts towards the cyclic collector's next run. At
    # CPython's default (a collection per 700 allocations) a busy broker collects
    # thousands of times a second; a collection per 50,000 allocations keeps cycles
    # (exceptions, tasks) collected at a fraction of the cost.
    gc.set_threshold(GC_THRESHOLD, 20, 20)
    # At exit the interpreter's last collections would scan every object still alive: with
    # 10,000 topics, seconds between "bye" and the exit. The process frees them all anyway.
    atexit.register(gc.freeze)
    try:
        trio.run(_main, options)
    except ExceptionGroup as group:
        incomplete, rest = group.split(ShutdownIncomplete)
        if incomplete is None:
            return _start_failure(group)
        if rest is not None:
            raise
        for cause in _root_causes(incomplete):
            log.critical("shutdown incomplete: %s", cause)
        return 1
    except (OSError, ValueError, RuntimeError) as exc:
        return _start_failure(exc)
    return 0


def _start_failure(exc: Exception) -> int:
    """Exit status 1 for a start-up failure (address in use, data path locked, bad
    metadata), reported in one line; anything else is re-raised with its traceback."""
    causes = _root_causes(exc)
    if not all(isinstance(c, (OSError, ValueError, RuntimeError)) for c in causes):
        raise exc
    for cause in causes:
        log.critical("%s", _start_failure_line(cause))
    return 1


def _start_failure_line(cause: BaseException) -> str:
    """The FATAL line of a start-up failure; nsqd's words where nsqd has them."""
    if isinstance(cause, (DataPathError, ListenError, TLSConfigError)):  # what nsqd's New() reports
        return f"failed to instantiate nsqd - {cause}"
    if isinstance(cause, MetadataLoadError):
        return f"failed to load metadata - {cause}"
    if isinstance(cause, MetadataWriteError):
        return f"failed to persist metadata - {cause}"
    return f"failed to start: {cause}"
