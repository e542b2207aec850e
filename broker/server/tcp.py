"""The TCP listener: bytes from sockets into the protocol parser, commands into handlers.

Each connection runs two tasks in its own nursery: the reader below, which
feeds every chunk received to the parser and applies all complete commands
before reading again, and the client's writer (:meth:`Client.run_writer`).
After a batch of commands the client's channel dispatches once, so a chunk
of 100 FINs frees 100 slots and refills them in one pass. What other tasks
queue for a connection (a topic's pump delivering, heartbeats) is sent by the
server's one flusher task (:mod:`broker.server.flush`), not by each writer.

A plain connection's reader reads its socket with ``os.read`` and, once a read
drained it, waits on the server's :class:`~broker.server.poller.ReadPoller`
(one edge-triggered epoll set). While it waits, the poller's task applies what
arrives itself (:class:`_InlineInput`) as long as no command must be awaited,
so a request answered at once costs no task switch; the reader takes over for
the rest. A TLS connection reads its ``trio.SSLStream`` instead.

Every failure of a connection is handled in that connection's task, whichever
task applied the command: a turn of commands (:meth:`TCPServer._turn`) raises
what fails, the connection's task turns it into the end of the connection
(:meth:`TCPServer._fail`: nsqd's error frame, the log line, the disk error
reported), and the poller's task only keeps it for the connection
(``_InlineInput.failure``) and wakes its task. So the poller's task never logs,
answers or closes for a connection and never raises what a connection's input
did: each connection's failure is its own, as a nursery keeps a task's failure
with its parent, and the inline path keeps its speed (see
:mod:`broker.server.poller` for what waking the task per request costs).
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Coroutine
from typing import TYPE_CHECKING

import trio

from broker.config.tls import TLS_NOT_REQUIRED
from broker.protocol import FinRun, Identify, ProtocolError, ServerConnection, finish_identify
from broker.server.client import Client
from broker.server.compression import MAX_PIECE, CompressionError
from broker.server.flush import Flusher
from broker.server.handlers import ANSWER_HANDLERS, SYNC_HANDLERS, fin_run
from broker.server.net import ConnectionServer, peer_address
from broker.server.peer import ReplicaReceiver
from broker.server.poller import ReadPoller
from diskqueue import DiskQueueError

if TYPE_CHECKING:
    from broker.core.broker import Broker
    from broker.server.auth import AuthClient
    from broker.server.transport import Upgrade

__all__ = ["TCPServer"]

log = logging.getLogger("pynsqd.tcp")

#: The most bytes one read takes from a connection: the plain input of one turn.
RECEIVE_SIZE = MAX_PIECE
#: The most commands (each message of an MPUB counts) a connection applies in one turn;
#: then the other connections run before it goes on. This bounds a turn to a few
#: milliseconds whatever the input (a run of NOPs, of small PUBs, of MPUBs, decompressed
#: or not), and lets a batch of MPUBs sent together be answered in one turn.
TURN_COMMANDS = 512

read = os.read
checkpoint = trio.lowlevel.checkpoint


class TCPServer(ConnectionServer):
    """Accepts V2 connections for a :class:`Broker`; owns their tasks."""

    def __init__(self, broker: Broker, ssl_context: ssl.SSLContext | None = None, authd: AuthClient | None = None):
        super().__init__("TCP", log)
        self.broker = broker
        self._client_numbers = 0
        self.ssl_context = ssl_context  # None: IDENTIFY answers tls_v1 false
        self.authd = authd  # None: AUTH is disabled
        self.replicas: ReplicaReceiver | None = None  # set when the node replicates (--replicas)
        self.flusher = Flusher()  # sends what other tasks queue for the connections

    def start_beside(self, nursery: trio.Nursery) -> None:
        """The flusher's task runs beside the connections (the read poller's runs too: see
        :class:`ConnectionServer`)."""
        nursery.start_soon(self.flusher.run)

    def ask_to_close(self) -> None:
        """Ask every client to flush what is queued and close."""
        for client in list(self.broker.clients):
            client.close_soon()

    async def handle_connection(self, stream: trio.abc.Stream) -> None:
        """Run one client's reader, writer and timers until the connection ends."""
        broker = self.broker
        try:
            remote = peer_address(stream)
        except OSError:
            return
        self._client_numbers += 1
        client = Client(broker, stream, remote, self._client_numbers)
        client.transport.ssl_context = self.ssl_context
        client.authd = self.authd
        client.peer.replicas = self.replicas
        client.flusher = self.flusher
        conn = ServerConnection(broker.limits)
        conn.fin_runs = True
        conn.tls_required = broker.options.tls_required != TLS_NOT_REQUIRED
        broker.clients.add(client)
        log.info("TCP: new client(%s)", remote)
        try:
            async with trio.open_nursery() as nursery:
                async def writer() -> None:
                    await client.run_writer()
                    nursery.cancel_scope.cancel()

                read_scope = trio.CancelScope()
                nursery.start_soon(writer)
                nursery.start_soon(client.run_timers, read_scope, nursery.cancel_scope)
                with read_scope:
                    await self._read_loop(client, conn)
                if read_scope.cancelled_caught:
                    # the read deadline passed: a command cut off in its body
                    # gets nsqd's "failed to read" error before the close
                    await self._apply(client, conn, b"")
                client.close_soon()
        finally:
            broker.clients.discard(client)
            peer = client.peer
            if peer.node is not None and peer.replicas is not None:
                peer.replicas.closed(peer.node, client, client.last_read)
            if client.channel is not None:
                client.channel.remove_client(client)
            if client.unapplied:  # an answer the connection did not live to await
                pending = client.unapplied[0]
                client.unapplied = []
                if isinstance(pending, Coroutine):
                    pending.close()
            log.info("TCP: client(%s) closed", remote)

    async def _read_loop(self, client: Client, conn: ServerConnection) -> None:
        """Read, parse and apply commands until EOF, a fatal error or close.

        A plain connection reads its socket directly (:meth:`_read_socket`), until TLS
        comes between; then it reads the TLS stream (:meth:`_read_stream`).
        """
        poller = self.poller
        fd = client.fd
        if poller is not None and fd >= 0:
            poller.register(fd)
            try:
                if not await self._read_socket(client, conn, poller, fd):
                    return
            finally:
                poller.unregister(fd)
        await self._read_stream(client, conn)

    async def _read_socket(self, client: Client, conn: ServerConnection, poller: ReadPoller, fd: int) -> bool:
        """Read the socket ``fd`` until the connection ends (False) or upgrades to TLS (True).

        Reads go straight to the socket. Once a read drained it, the connection waits on
        ``poller`` and leaves it an :class:`_InlineInput`: the poller's task applies what
        arrives next itself while that needs nothing awaited, and wakes this task otherwise.
        """
        inline = _InlineInput(self, client, conn, fd)
        transport = client.transport
        drained = False  # the last read emptied the socket: wait for the next edge first
        while not client.closing:
            if client.unapplied or conn.has_more:
                # what the poller's task left: a command that must be awaited, or the rest of a
                # read its turn did not reach
                if not await self._apply(client, conn, None):
                    return False
                continue
            upgrade = transport.upgrade
            if upgrade is not None:
                if not await self._finish_upgrade(client, conn, upgrade):
                    return False
                if transport.tls:
                    return True
                continue
            if drained:
                await poller.wait_readable(fd, inline)
                drained = False
                failure = inline.failure
                if failure is not None:  # what failed in the poller's task ends this connection, here
                    inline.failure = None
                    return self._fail(client, failure)
                continue  # what the poller's task left (see _InlineInput) comes first
            try:
                data = read(fd, RECEIVE_SIZE)
            except BlockingIOError:
                drained = True
                continue
            except OSError:  # reset by the peer
                return False
            client.note_read()
            # b"" tells the parser the input ended: a command cut off in its body
            # then gets nsqd's "failed to read" error before the close.
            if not await self._receive(client, conn, data) or not data:
                return False
            # a short read emptied the socket; after a full one more may be there
            drained = len(data) < RECEIVE_SIZE
            if not drained:
                await checkpoint()  # the other connections run before this one reads on
        return False

    async def _read_stream(self, client: Client, conn: ServerConnection) -> None:
        """Read the connection's stream (TLS, or a socket where there is no poller) until it ends."""
        transport = client.transport
        while not client.closing:
            upgrade = transport.upgrade
            if upgrade is not None:
                if not await self._finish_upgrade(client, conn, upgrade):
                    return
                continue
            try:
                data = await transport.stream.receive_some(RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if isinstance(data, bytearray):  # the Stream interface allows it; sockets and TLS give bytes
                data = bytes(data)
            client.note_read()
            if not await self._receive(client, conn, data) or not data:
                return

    async def _finish_upgrade(self, client: Client, conn: ServerConnection, upgrade: Upgrade) -> bool:
        """Wait until the writer has upgraded the stream after IDENTIFY (:mod:`broker.server.upgrade`),
        then apply the bytes received past IDENTIFY. False when the connection must close."""
        await upgrade.done.wait()
        if upgrade.failed:
            return False
        if client.transport.tls:
            conn.tls_required = False
        return not upgrade.leftover or await self._receive(client, conn, upgrade.leftover)

    async def _receive(self, client: Client, conn: ServerConnection, data: bytes) -> bool:
        """Apply received bytes, decompressed first when the stream is compressed.

        A piece of decompressed input (:data:`~broker.server.compression.MAX_PIECE` bytes at
        most) is applied a turn at a time like a read (see :meth:`_apply`), and the other
        connections run before the next piece is decompressed. Returns False when the
        connection must close: a fatal error, or a corrupt compressed stream (which ends
        the input as a failed read does in nsqd).
        """
        codec = client.transport.codec
        if codec is None or not data:
            return await self._apply(client, conn, data)
        try:
            for piece in codec.decompress(data):
                if not await self._apply(client, conn, piece):
                    return False
                if client.closing:
                    return True
                await checkpoint()
        except CompressionError as exc:
            log.info("TCP: client(%s) error: failed to read command - %s", client.remote_address, exc)
            await self._apply(client, conn, b"")
            return False
        return True

    async def _apply(self, client: Client, conn: ServerConnection, data: bytes | None) -> bool:
        """Feed ``data`` to the parser (None: nothing new, go on with what it holds and with
        ``client.unapplied``) and apply every complete command, awaiting those that must wait.

        The commands are applied a turn of at most :data:`TURN_COMMANDS` at a time, with a
        checkpoint between turns, so one connection's input never holds the others long.
        It stops early only when the connection closes or upgrades. Returns False after a
        fatal error (its frame is queued, if it has one).
        """
        if data is not None:
            conn.receive_data(data)
            done = self._apply_commands(client, conn, None)
        else:
            done = None if client.unapplied else self._apply_commands(client, conn, None)
        while True:
            if done is None:
                done = await self._apply_rest(client, conn)
            if not done or not conn.has_more or client.closing or client.transport.upgrade is not None:
                return done
            await checkpoint()
            # the read deadline is for a client that sends nothing, not one whose input is still applied
            client.note_read()
            done = self._apply_commands(client, conn, None)

    async def _apply_rest(self, client: Client, conn: ServerConnection) -> bool:
        """Apply ``client.unapplied``: await its first command's answer (or, for a large IDENTIFY,
        its decoded event, applied then), then the rest of its turn, awaiting each answer that
        must wait. Returns False after a fatal error."""
        while True:
            pending, *rest = client.unapplied
            client.unapplied = []
            try:
                response = await pending
            except ProtocolError as err:
                if err.fatal:
                    return self._fail(client, err)
                client.batching = True
                client.send_error(err)
            except Exception as exc:
                return self._fail(client, exc)
            else:
                client.batching = True
                if type(response) is Identify:  # decoded off the event loop: now applied
                    rest.insert(0, response)
                else:
                    client.send_response(response)
            done = self._apply_commands(client, conn, rest)
            if done is not None:
                return done

    def _apply_commands(self, client: Client, conn: ServerConnection, events: list | None) -> bool | None:
        """:meth:`_turn` in the connection's own task, which ends the connection on what it raises.

        True: the turn is applied (``conn.has_more`` tells whether another is due); False: a
        fatal error, the connection must close; None: ``client.unapplied`` holds a command to
        await and the rest of its turn (:meth:`_apply_rest` applies them).
        """
        try:
            return self._turn(client, conn, events)
        except Exception as exc:
            return self._fail(client, exc)

    def _turn(self, client: Client, conn: ServerConnection, events: list | None) -> bool | None:
        """Apply ``events`` (None: the next turn the parser gives, at most :data:`TURN_COMMANDS`),
        up to the first that must be awaited (then None, see :meth:`_apply_commands`; else True).
        The turn ends with one dispatch and one flush; what the parser still holds is left for
        the next. Non-fatal errors are answered; anything else a command raises (a fatal
        protocol error, a failed disk write, a fault) is raised, with the batch left open for
        :meth:`_fail`, which the connection's own task calls."""
        broker = self.broker
        sync_handlers = SYNC_HANDLERS
        answer_handlers = ANSWER_HANDLERS
        client.batching = True
        if events is None:
            events = conn.next_events(TURN_COMMANDS)
        for index, event in enumerate(events):
            event_type = type(event)
            if event_type is FinRun:
                fin_run(broker, client, event.msg_ids)
                continue
            if event_type is Identify and event.data is None:
                # a large body is decoded in a worker thread, then applied as any IDENTIFY
                client.unapplied = [trio.to_thread.run_sync(finish_identify, event.body), *events[index + 1:]]
                client.batching = False
                return None
            handler = sync_handlers.get(event_type)
            try:
                if handler is not None:
                    handler(broker, client, event)
                else:
                    response = answer_handlers[event_type](broker, client, event)
                    if type(response) is not bytes:  # to await: the answer, then the rest of the turn
                        client.unapplied = [response, *events[index + 1:]]
                        # while the command waits, other tasks' output is not held back
                        client.batching = False
                        return None
                    client.send_response(response)
            except ProtocolError as err:
                if err.fatal:
                    raise
                client.send_error(err)
            if event_type is Identify:
                conn.heartbeats_enabled = client.heartbeat_interval > 0
                conn.keyed = client.publish_keys  # a message's key comes before its body
                conn.prioritised = client.priorities  # and its priority
                conn.replica = client.peer.node is not None  # REPL from a peer node
                upgrade = client.transport.upgrade
                if upgrade is not None:
                    # what follows IDENTIFY belongs to the upgraded stream
                    upgrade.leftover = conn.take_trailing_data()
                    return self._end_batch(client, True)
        return self._end_batch(client, True)

    def _fail(self, client: Client, exc: Exception) -> bool:
        """The connection ends after ``exc``: a fatal protocol error (its frame is queued, if it has
        one), a failed disk write under a command, or a fault of ours. Returns False. Called in
        the connection's own task only (see the module docstring)."""
        if isinstance(exc, ProtocolError) and exc.code == "E_BAD_PROTOCOL":
            log.error("client(%s) %s", client.remote_address, exc.description)  # nsqd's line
            client.send_error(exc)
        elif isinstance(exc, ProtocolError):
            log.info("TCP: client(%s) error: %s %s", client.remote_address, exc.code, exc.description)
            if exc.payload:  # an over-long line closes without a frame, as in nsqd
                client.send_error(exc)
        elif isinstance(exc, DiskQueueError):
            # a disk write (or a queue's files) under a command failed: that client goes, the others stay
            self.broker.disk_failed(exc)
            log.error("TCP: client(%s) closed after a disk error", client.remote_address)
        else:
            log.error("TCP: client(%s) closed after an internal error", client.remote_address, exc_info=exc)
        return self._end_batch(client, False)

    @staticmethod
    def _end_batch(client: Client, result: bool) -> bool:
        """A batch of commands is applied: the channel dispatches once and the output goes out."""
        if client.channel is not None:
            client.channel.dispatch(client)
        client.end_batch()
        return result


class _InlineInput:
    """What a plain connection waiting for input leaves the :class:`ReadPoller`: called in the
    poller's task on an edge, it reads the socket and applies what came while nothing needs
    awaiting, so a request costs the connection's task no wake-up.

    It applies one turn (see :meth:`TCPServer._apply`) and returns False (wake the
    connection's task) when the task has something to do: a command to await
    (``client.unapplied``), the rest of the read (``conn.has_more``), an upgrade after
    IDENTIFY, a connection that ends (it asked it to close), a full read (more may be
    waiting), or a failure. Compressed input is left to the task.

    It never raises (the poller's contract): what the turn raises is kept in ``failure``
    for the connection's task, which ends the connection on it (:meth:`TCPServer._fail`).
    """

    __slots__ = ("server", "client", "transport", "conn", "fd", "failure")

    def __init__(self, server: TCPServer, client: Client, conn: ServerConnection, fd: int):
        self.server = server
        self.client = client
        self.transport = client.transport
        self.conn = conn
        self.fd = fd
        self.failure: Exception | None = None  # what failed here; the connection's task acts on it

    def __call__(self) -> bool:
        client = self.client
        transport = self.transport
        if client.closing or transport.codec is not None:
            return False
        try:
            data = read(self.fd, RECEIVE_SIZE)
        except BlockingIOError:  # an edge for bytes read already
            return True
        except OSError:  # reset by the peer
            client.close_soon()
            return False
        client.note_read()
        conn = self.conn
        try:
            conn.receive_data(data)
            done = self.server._turn(client, conn, None)
        except Exception as exc:  # the connection's task ends the connection on it
            self.failure = exc
            return False
        if not data:
            client.close_soon()
            return False
        return (done is True and len(data) < RECEIVE_SIZE and not conn.has_more and transport.upgrade is None
                and not client.closing)
