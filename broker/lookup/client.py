"""Registration with every ``--lookupd-tcp-address``, as nsqd's ``lookup.go`` does it.

One task per nsqlookupd: it connects, IDENTIFYs with the node's broadcast address and
ports, REGISTERs every topic and channel, then sends a REGISTER or UNREGISTER for each
topic and channel created or deleted and a ``PING`` every 15 seconds. A broken connection
is re-opened by the next command or ping (a command that finds the connection broken is
sent again on a new one at once), and re-registers everything. Each lookupd has its
own queue, so one that is slow or gone delays nothing else. ``PUT
/config/nsqlookupd_tcp_addresses`` adds and removes peers while running.
"""

from __future__ import annotations

import logging
import socket
from collections import deque
from typing import TYPE_CHECKING, NamedTuple

import trio

from broker.config.options import NSQD_COMPAT_VERSION, Options
from broker.core.broker import Broker
from broker.core.host import PeerState, RegistryChange
from broker.lookup.v1 import PING, describe, identify, register, unregister

if TYPE_CHECKING:
    # the connections and the HTTP query load with the first lookupd: a node without one
    # does not pay for them at start
    from broker.lookup.peer import LookupPeer

__all__ = ["Identity", "LookupClient"]

log = logging.getLogger("pynsqd.lookup")

#: Seconds between two PINGs to each lookupd (nsqd's fixed ticker).
PING_INTERVAL = 15.0

#: Commands held for one lookupd; past this it gets everything again on reconnection instead.
MAX_PENDING = 10_000


class Identity(NamedTuple):
    """What the node tells nsqlookupd about itself (the IDENTIFY body)."""

    broadcast_address: str
    tcp_port: int
    http_port: int
    hostname: str = socket.gethostname()
    version: str = NSQD_COMPAT_VERSION

    @classmethod
    def of(cls, options: Options, tcp_port: int, http_port: int) -> Identity:
        """The identity for ``options`` on the bound ports; ``--broadcast-*-port`` (if non-zero) wins."""
        return cls(options.broadcast_address, options.broadcast_tcp_port or tcp_port,
                   options.broadcast_http_port or http_port)

    def body(self) -> dict:
        return {"broadcast_address": self.broadcast_address, "hostname": self.hostname,
                "http_port": self.http_port, "tcp_port": self.tcp_port, "version": self.version}


class _Link:
    """One lookupd peer, the commands waiting for it and the task that sends them."""

    def __init__(self, peer: LookupPeer):
        self.peer = peer
        self.pending: deque[bytes] = deque()
        self.wakeup = trio.Event()
        self.cancel_scope = trio.CancelScope()
        self.resync = False

    def push(self, command: bytes) -> None:
        if len(self.pending) >= MAX_PENDING:
            # the reconnection re-registers the broker's whole state, which covers all of these
            self.pending.clear()
            self.resync = True
        self.pending.append(command)
        self.wakeup.set()


class LookupClient:
    """Keeps every configured nsqlookupd informed of ``broker``'s topics and channels.

    A :class:`~broker.core.host.RegistryListener`: register it with ``broker.listen``.
    Owns its peers' connections and tasks, which run in :meth:`run` until it is cancelled.
    """

    def __init__(self, broker: Broker, identity: Identity):
        self._broker = broker
        self._identity = identity
        self._links: dict[str, _Link] = {}
        self._nursery: trio.Nursery | None = None

    # ---------------------------------------------------------------- lifecycle

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Connect to every ``--lookupd-tcp-address`` and keep them informed until cancelled."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._apply_addresses(self._broker.options.nsqlookupd_tcp_addresses)
                task_status.started()
                await trio.sleep_forever()  # peers come and go with PUT /config
        finally:
            log.info("LOOKUP: closing")

    # ---------------------------------------------------------------- RegistryListener

    def registry_changed(self, change: RegistryChange) -> None:
        """Queue the REGISTER or UNREGISTER for every lookupd."""
        command = (register if change.created else unregister)(change.topic, change.channel)
        for link in self._links.values():
            link.push(command)

    def options_changed(self, options: Options) -> None:
        """Add and remove peers to match ``nsqlookupd_tcp_addresses``."""
        if self._nursery is not None:
            self._apply_addresses(options.nsqlookupd_tcp_addresses)

    async def channels_for(self, topic: str) -> list[str]:
        """The channels the lookupds know for ``topic`` (nsqd creates them with the topic); [] on failure."""
        addresses = [address for link in self._links.values()
                     if link.peer.info is not None and (address := link.peer.info.http_address())]
        if not addresses:
            if self._links:
                log.error("no available nsqlookupd to query for channels to pre-create for topic %s", topic)
            return []
        from broker.lookup.topic_channels import LookupHTTPError, query_topic_channels

        options = self._broker.options
        try:
            return await query_topic_channels(addresses, topic, options.http_client_connect_timeout,
                                              options.http_client_request_timeout)
        except LookupHTTPError as exc:
            log.warning("failed to query nsqlookupd for channels to pre-create for topic %s - %s", topic, exc)
            return []

    async def nodes(self) -> set[tuple[str, int]] | None:
        """``(broadcast address, TCP port)`` of every node the lookupds list (``/nodes``), this
        one among them once registered; the lookupds that fail are left out (None: all did, or
        none is connected yet)."""
        from broker.lookup.topic_channels import LookupHTTPError, get_nodes

        options = self._broker.options
        found: set[tuple[str, int]] = set()
        answered = False

        async def ask(address: str) -> None:
            nonlocal answered
            try:
                found.update(await get_nodes(address, options.http_client_connect_timeout,
                                             options.http_client_request_timeout))
                answered = True
            except LookupHTTPError as exc:
                log.debug("LOOKUP: %s", exc)

        async with trio.open_nursery() as nursery:
            for link in self._links.values():
                address = link.peer.info.http_address() if link.peer.info is not None else None
                if address:
                    nursery.start_soon(ask, address)
        return found if answered else None

    def peer_states(self) -> list[PeerState]:
        """Each configured lookupd and whether it is connected and identified."""
        return [PeerState(address, link.peer.connected) for address, link in self._links.items()]

    # ---------------------------------------------------------------- peers

    def _apply_addresses(self, addresses: tuple[str, ...]) -> None:
        from broker.lookup.peer import LookupPeer

        assert self._nursery is not None
        for address, link in list(self._links.items()):
            if address not in addresses:
                log.info("LOOKUP(%s): removing peer", address)
                del self._links[address]
                link.cancel_scope.cancel()
        for address in addresses:
            if address in self._links:
                continue
            log.info("LOOKUP(%s): adding peer", address)
            peer = LookupPeer(address, self._broker.options.max_body_size, self._identify_and_register)
            link = _Link(peer)
            self._links[address] = link
            self._nursery.start_soon(self._serve, link)

    async def _serve(self, link: _Link) -> None:
        """Send the link's commands in order, and a PING every :data:`PING_INTERVAL` seconds."""
        peer = link.peer
        with link.cancel_scope:
            try:
                await self._send(peer, None)  # start the connection
                next_ping = trio.current_time() + PING_INTERVAL
                while True:
                    if not link.pending:
                        link.wakeup = trio.Event()
                        with trio.move_on_at(next_ping):
                            await link.wakeup.wait()
                    if link.resync:
                        link.resync = False
                        await peer.close()
                    if link.pending:
                        command = link.pending.popleft()
                        log.info("LOOKUPD(%s): %s %s", peer, _branch(command), describe(command))
                        await self._send(peer, command)
                    if trio.current_time() >= next_ping:
                        next_ping = trio.current_time() + PING_INTERVAL
                        log.debug("LOOKUPD(%s): sending heartbeat", peer)
                        await self._send(peer, PING)
            finally:
                await peer.close()

    async def _send(self, peer: LookupPeer, command: bytes | None) -> None:
        from broker.lookup.peer import LookupPeerError

        was_connected = peer.connected
        try:
            try:
                response = await peer.command(command)
            except LookupPeerError:
                if not was_connected:
                    raise
                # The connection broke while idle (lookupd restarted): nsqd would drop this
                # command and reconnect on the next one; reconnecting now re-registers
                # everything and sends it at once.
                response = await peer.command(command)
        except LookupPeerError as exc:
            if command is not None:  # as nsqd, a failed first connection is retried by the next command
                log.error("LOOKUPD(%s): %s - %s", peer, describe(command), exc)
            return
        if command is not None and response is not None and response.startswith(b"E_"):
            # lookupd closes the connection after any error it answers
            log.error("LOOKUPD(%s): %s - %s", peer, describe(command), response.decode("utf-8", "replace"))
            await peer.close()

    async def _identify_and_register(self, peer: LookupPeer) -> None:
        """nsqd's connect callback: IDENTIFY, then REGISTER every topic (and each of its channels)."""
        from broker.lookup.peer import LookupPeerError, PeerInfo

        command = identify(self._identity.body())
        response = await peer.roundtrip(command)
        if response.startswith(b"E_"):
            log.info("LOOKUPD(%s): lookupd returned %s", peer, response.decode("utf-8", "replace"))
            await peer.close()
            return
        try:
            info = PeerInfo.parse(response)
        except (ValueError, TypeError):
            log.error("LOOKUPD(%s): parsing response - %s", peer, response.decode("utf-8", "replace"))
            await peer.close()
            return
        peer.info = info
        log.info("LOOKUPD(%s): peer info %s", peer, info)
        if not info.broadcast_address:
            log.error("LOOKUPD(%s): no broadcast address", peer)
        for command in self._registrations():
            log.info("LOOKUPD(%s): %s", peer, describe(command))
            response = await peer.roundtrip(command)
            if response.startswith(b"E_"):
                raise LookupPeerError(response.decode("utf-8", "replace"))

    def _registrations(self) -> list[bytes]:
        commands = []
        for name in sorted(self._broker.topics):
            topic = self._broker.topics[name]
            if not topic.channels:
                commands.append(register(name))
            commands.extend(register(name, channel) for channel in sorted(topic.channels))
        return commands


def _branch(command: bytes) -> str:
    # nsqd names the kind of change it announces: "topic REGISTER t" or "channel REGISTER t c"
    return "channel" if describe(command).count(" ") >= 2 else "topic"
