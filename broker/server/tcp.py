"""The TCP listener: bytes from sockets into the protocol parser, commands into handlers.

Each connection runs two tasks in its own nursery: the reader below, which
feeds every chunk received to the parser and applies all complete commands
before reading again, and the client's writer (:meth:`Client.run_writer`).
After a batch of commands the client's channel dispatches once, so a chunk
of 100 FINs frees 100 slots and refills them in one pass.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from broker.protocol import FinRun, Identify, ProtocolError, ServerConnection
from broker.server.commands import ASYNC_HANDLERS, SYNC_HANDLERS, fin_run
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

    def __init__(self, broker: Broker):
        super().__init__("TCP", log)
        self.broker = broker
        self._client_numbers = 0

    def ask_to_close(self) -> None:
        """Ask every client to flush what is queued and close."""
        for client in list(self.broker.clients):
            client.close_soon()

    async def handle_connection(self, stream: trio.SocketStream) -> None:
        """Run one client's reader, writer and timers until the connection ends."""
        broker = self.broker
        try:
            remote = peer_address(stream)
        except OSError:
            return
        self._client_numbers += 1
        client = Client(broker, stream, remote, self._client_numbers)
        conn = ServerConnection(broker.limits)
        conn.fin_runs = True
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
                    await self._read_loop(client, conn, stream)
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

    async def _read_loop(self, client: Client, conn: ServerConnection, stream: trio.SocketStream) -> None:
        """Read, parse and apply commands until EOF, a fatal error or close."""
        while not client.closing:
            try:
                data = await stream.receive_some(RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            client.note_read()
            # b"" tells the parser the input ended: a command cut off in its body
            # then gets nsqd's "failed to read" error before the close.
            if not await self._apply(client, conn, data) or not data:
                return

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
