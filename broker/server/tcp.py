"""The TCP listener: bytes from sockets into the protocol parser, commands into handlers.

Each connection runs two tasks in its own nursery: the reader below, which
feeds every chunk received to the parser and applies all complete commands
before reading again, and the client's writer (:meth:`Client.run_writer`).
After a batch of commands the client's channel dispatches once, so a chunk
of 100 FINs frees 100 slots and refills them in one pass.
"""

from __future__ import annotations

import logging
import ssl
from typing import TYPE_CHECKING

import trio

from broker.config.tls import TLS_NOT_REQUIRED
from broker.protocol import FinRun, Identify, ProtocolError, ServerConnection
from broker.server.auth import AuthClient
from broker.server.commands import ASYNC_HANDLERS, SYNC_HANDLERS, fin_run
from broker.server.compression import CompressionError
from broker.server.connection import Client
from broker.server.net import ConnectionServer, peer_address
from diskqueue import DiskQueueError

if TYPE_CHECKING:
    from broker.core.broker import Broker

__all__ = ["TCPServer"]

log = logging.getLogger("pynsqd.tcp")

RECEIVE_SIZE = 256 * 1024


class TCPServer(ConnectionServer):
    """Accepts V2 connections for a :class:`Broker`; owns their tasks."""

    def __init__(self, broker: Broker, ssl_context: ssl.SSLContext | None = None, authd: AuthClient | None = None):
        super().__init__("TCP", log)
        self.broker = broker
        self._client_numbers = 0
        self.ssl_context = ssl_context  # None: IDENTIFY answers tls_v1 false
        self.authd = authd  # None: AUTH is disabled

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
        client.ssl_context = self.ssl_context
        client.authd = self.authd
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
            if client.channel is not None:
                client.channel.remove_client(client)
            log.info("TCP: client(%s) closed", remote)

    async def _read_loop(self, client: Client, conn: ServerConnection) -> None:
        """Read, parse and apply commands until EOF, a fatal error or close.

        After an IDENTIFY that agreed TLS or compression, reading waits until the writer
        has upgraded the stream (:mod:`broker.server.upgrade`); then it reads from the
        upgraded stream and decompresses what it reads.
        """
        while not client.closing:
            upgrade = client.upgrade
            if upgrade is not None:
                await upgrade.done.wait()
                if upgrade.failed:
                    return
                if client.tls:
                    conn.tls_required = False
                if upgrade.leftover and not await self._receive(client, conn, upgrade.leftover):
                    return
                continue
            try:
                data = await client.stream.receive_some(RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if isinstance(data, bytearray):  # the Stream interface allows it; sockets and TLS give bytes
                data = bytes(data)
            client.note_read()
            # b"" tells the parser the input ended: a command cut off in its body
            # then gets nsqd's "failed to read" error before the close.
            if not await self._receive(client, conn, data) or not data:
                return

    async def _receive(self, client: Client, conn: ServerConnection, data: bytes) -> bool:
        """Apply received bytes, decompressed first when the stream is compressed.

        Returns False when the connection must close: a fatal error, or a corrupt
        compressed stream (which ends the input as a failed read does in nsqd).
        """
        codec = client.codec
        if codec is None or not data:
            return await self._apply(client, conn, data)
        try:
            for piece in codec.decompress(data):
                if not await self._apply(client, conn, piece):
                    return False
        except CompressionError as exc:
            log.info("TCP: client(%s) error: failed to read command - %s", client.remote_address, exc)
            await self._apply(client, conn, b"")
            return False
        return True

    async def _apply(self, client: Client, conn: ServerConnection, data: bytes) -> bool:
        """Feed ``data`` to the parser and apply every complete command.

        Returns False after a fatal error (its frame is queued, if it has one).
        """
        broker = self.broker
        sync_handlers = SYNC_HANDLERS
        async_handlers = ASYNC_HANDLERS
        conn.receive_data(data)
        client.batching = True
        try:
            while True:
                events = conn.next_events()
                if not events:
                    return True
                for event in events:
                    event_type = type(event)
                    if event_type is FinRun:
                        fin_run(broker, client, event.msg_ids)
                        continue
                    handler = sync_handlers.get(event_type)
                    try:
                        if handler is not None:
                            handler(broker, client, event)
                        else:
                            # while the handler waits, other tasks' output is not held back
                            client.batching = False
                            response = await async_handlers[event_type](broker, client, event)
                            client.batching = True
                            client.send_response(response)
                    except ProtocolError as err:
                        if err.fatal:
                            raise
                        client.send_error(err)
                    if event_type is Identify:
                        conn.heartbeats_enabled = client.heartbeat_interval > 0
                        if client.upgrade is not None:
                            # what follows IDENTIFY belongs to the upgraded stream
                            client.upgrade.leftover = conn.take_trailing_data()
                            return True
        except ProtocolError as err:
            log.info("TCP: client(%s) error: %s %s", client.remote_address, err.code, err.description)
            if err.payload:  # an over-long line closes without a frame, as in nsqd
                client.send_error(err)
            return False
        except DiskQueueError as exc:
            # a disk write under a command failed: that client goes, the others stay
            broker.disk_failed(exc)
            log.error("TCP: client(%s) closed after a disk error", client.remote_address)
            return False
        except Exception:
            log.exception("TCP: client(%s) closed after an internal error", client.remote_address)
            return False
        finally:
            if client.channel is not None:
                client.channel.dispatch(client)
            client.end_batch()
