"""The node's replication (``--replicas`` > 1): made before the broker, run beside it.

What the core sees of it is chosen when the broker is made: :attr:`Replicator.copies`
(:class:`~broker.replication.copies.PeerCopies`, the sending side) and
:attr:`Replicator.fence` (channels deliver nothing while this node may have been taken for
gone). What the TCP server hands other nodes' connections to is :attr:`Replicator.holder`
(:class:`~broker.replication.holder.Holder`, the holding side). :meth:`Replicator.run`,
given the broker, does the rest:

- **discovery**: every node the lookupds list (``/nodes``) gets a link (:mod:`.links`),
  which says HELLO; the answer says what the peer took over from this node (its channels
  skip those messages) and from every node (copies held here of those are dropped);
- **takeover** (:mod:`.takeover`): the copies of nodes gone for ``--replica-timeout``;
- **copies made again** (:mod:`.recopy`): those of this node's messages that a peer gone for
  ``--replica-timeout`` held (the HELLO answer also says what the peer holds for this node);
- **the fence**: from the start, and whenever this node notices it was stopped (SIGSTOP) or
  starved, its channels deliver nothing until every peer answered a fresh HELLO, or failed
  to, within ``--replica-timeout``;
- the topics' channels are posted to the peers when they change and when a link connects
  (the replicator listens to the broker's registry), and the FINs every 0.1 s.

Who imports whom: the replicator imports the sides and the links; the sides import the
links, the peers, the held log and the wire format; none imports the replicator.
"""

from __future__ import annotations

import ipaddress
import logging
import secrets
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from broker.config.options import Options
from broker.core.host import PeerState, RegistryChange
from broker.core.message import now_ns
from broker.protocol.replica import is_valid_node_id
from broker.replication.answers import decode_hello_answer, decode_hello_holding
from broker.replication.confirm import Confirms
from broker.replication.copies import PeerCopies
from broker.replication.fence import ClockFence
from broker.replication.held import HeldCopies
from broker.replication.holder import Holder
from broker.replication.links import HEARTBEAT, PeerLink
from broker.replication.members import Members
from broker.replication.peers import Peers
from broker.replication.quorum import Quorum
from broker.replication.recopy import Recopy
from broker.replication.refused import RefusedPublishes
from broker.replication.takeover import Takeover
from broker.replication.wire import Channels, Forget
from diskqueue.checkpoint import replace_durably

if TYPE_CHECKING:
    from broker.core.broker import Broker

__all__ = ["Replicator"]

log = logging.getLogger("pynsqd.replication")

#: Seconds between two looks at nsqlookupd's ``/nodes``.
DISCOVERY_INTERVAL = 1.0
#: Seconds between two checks for nodes gone.
TAKEOVER_INTERVAL = 0.25
#: Seconds a link to a node the lookupds stopped listing is kept (a node that restarts comes
#: back to the FINs and takeovers kept for it meanwhile).
UNLISTED_GRACE = 300.0
#: Seconds between two ticks of the clock that notices this process was stopped.
CLOCK_TICK = 0.1
_NODE_ID_FILE = "replication.id"
#: There while the node runs: found at a start, the last run ended in a crash.
_RUNNING_FILE = "replication.running"

Nodes = Callable[[], Awaitable[set[tuple[str, int]] | None]]


class Replicator:
    """The replication of a node with ``options`` whose data lives in ``data_path``.

    ``secret`` is the cluster's (``--replication-secret-file``; empty: none, and any client
    can pass for a node); ``ssl_context`` (None: this node has no TLS) is what its links to
    its peers verify their certificates with."""

    def __init__(self, options: Options, data_path: Path, secret: bytes = b"",
                 ssl_context: ssl.SSLContext | None = None):
        self.options = options
        self._data_path = data_path
        self._secret = secret
        self._ssl_context = ssl_context
        self.node_id = ""  # read (or made) by run, once the data directory is locked
        self.peers = Peers()
        #: publishes refused while a holder may hold their copies
        self.refused = RefusedPublishes(lambda: self.quorum.has_majority(), lambda: self.quorum.wait_majority(),
                                        options.replica_timeout)
        #: the sending side, the core's Copies
        self.copies = PeerCopies(options, self.peers, self._held_for_topic, self.node_stats, self.refused.settle,
                                 self.known_keys, self.forget_member)
        #: channels hold delivery while this node may have been taken for gone
        self.fence = ClockFence(max(1.0, options.replica_timeout / 2), lambda topic: self.copies.replicas(topic) > 1)
        #: the holding side, the TCP server's ReplicaReceiver
        self.holder = Holder(options, self.peers, secret, self._take_over_now, self._proven, self.known_keys,
                             lambda node: self._takeover.under_way(node) if self._takeover is not None else None)
        self._quorum: Quorum | None = None
        self._broker: Broker | None = None
        self._takeover: Takeover | None = None
        self._recopy: Recopy | None = None
        self._own: tuple[str, int] | None = None
        self._unlisted: dict[tuple[str, int], float] = {}  # links whose node the lookupds no longer list
        self._nodes: Nodes | None = None
        self._nursery: trio.Nursery | None = None
        self._lost_memory = False
        self._local_address: str | None = None
        #: takeovers and compactions read the log through and change it: one at a time
        self._log_lock = trio.Lock()

    # ---------------------------------------------------------------- lifecycle

    async def run(self, broker: Broker, nodes: Nodes, own: tuple[str, int], *,
                  task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Replicate ``broker``'s topics with the nodes ``nodes`` lists (nsqlookupd's ``/nodes``;
        ``own`` is this node's entry), hold copies for them and take over from the gone,
        until cancelled. Reports started once peers may connect; the fence opens later."""
        self.node_id = self.copies.node_id = self.holder.node_id = _node_id(self._data_path)
        self._quorum = Quorum(Members(self._data_path, self.node_id), self.peers, self.options.replica_timeout)
        confirms = self.copies.confirms = Confirms(self._quorum.confirm, self.options.replica_timeout,
                                                   self.fence, self._dispatch_all)
        held = await HeldCopies.open(self._data_path, durable=self.options.durable,
                                     max_record=self.options.max_body_size * 2 + (1 << 20),
                                     max_keys=self.options.dedup_max_keys)
        self._broker = broker
        self.holder.held = held
        self._takeover = Takeover(broker, self.node_id, self.peers, self.copies, held, self._quorum.members.majority)
        self._recopy = Recopy(broker, self.node_id, self.peers, self.copies)
        running = self._data_path / _RUNNING_FILE
        # without --durable a crash loses what was in memory: the peers then take over at once
        self._lost_memory = running.exists() and not self.options.durable
        running.touch()
        self._nodes = nodes
        self._own = own
        self._local_address = _dial_from(self.options.tcp_address)
        self.holder.own_address = f"{own[0]}:{own[1]}"  # from now on, peers' handshakes are answered
        self._takeover.wait_for(list(held.origins), trio.current_time())
        log.info("REPLICATION: node %s, %d replicas, holding %d copies for %d nodes", self.node_id,
                 self.options.replicas, held.live(), len(held.origins))
        if not self._secret:
            log.warning("REPLICATION: no --replication-secret-file: any client that reaches this node's TCP port "
                        "can pass for a node of the cluster, and drop or inject the copies of acknowledged messages")
        broker.listen(self)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._discover_loop)
                nursery.start_soon(self.copies.run_fins)
                nursery.start_soon(confirms.run)
                nursery.start_soon(self._takeover_loop)
                nursery.start_soon(self.recopy.run)
                nursery.start_soon(self._clock_loop)
                task_status.started()
                await self._catch_up()
                self.fence.starting = False
                self._dispatch_all()
                await trio.sleep_forever()
        finally:
            self.holder.own_address = None
            with trio.CancelScope(shield=True):
                await held.close()
            (self._data_path / _RUNNING_FILE).unlink(missing_ok=True)

    @property
    def broker(self) -> Broker:
        assert self._broker is not None, "run gives the broker"
        return self._broker

    @property
    def quorum(self) -> Quorum:
        assert self._quorum is not None, "run makes the quorum"
        return self._quorum

    def forget_member(self, node: str) -> bool:
        """``POST /replication/forget``: ``node`` no longer counts in this node's majorities."""
        return self._quorum is not None and self._quorum.members.forget(node)

    def _proven(self, node: str) -> None:
        """A node's connection to this one was proven: it is a member of the cluster."""
        if self._quorum is not None:
            self._quorum.members.proven(node, "")

    def known_keys(self, topic: str, keys: list[bytes]) -> list[bytes]:
        """Which of ``keys`` this node knows for ``topic`` within their dedup window: those of
        the copies it holds (and held: finished or taken over) and those its own topic stored,
        not those of publishes still waiting for their copies (two nodes that take the same key
        at the same moment both store it: a duplicate, never a loss)."""
        now = now_ns()
        held = self.holder.held
        found = set(held.known(topic, keys, now)) if held is not None else set()
        broker = self._broker
        own = broker.topics.get(topic) if broker is not None else None
        if own is not None and own.keys is not None:
            assert broker is not None
            broker.keys.expire(now)
            stored, waiting = own.keys.held, own.keys.pending
            found.update(key for key in keys if key in stored and key not in waiting)
        return [key for key in keys if key in found]

    @property
    def takeover(self) -> Takeover:
        assert self._takeover is not None, "run makes the takeovers"
        return self._takeover

    @property
    def recopy(self) -> Recopy:
        assert self._recopy is not None, "run makes the restores"
        return self._recopy

    async def _catch_up(self) -> None:
        """Return once every peer the lookupds list answered HELLO (or failed once), within
        ``--replica-timeout``: what was taken over from this node is known before its channels
        deliver (the fence holds them meanwhile)."""
        with trio.move_on_after(self.options.replica_timeout):
            while not await self._discover():
                await trio.sleep(0.1)
            for link in list(self.peers.links.values()):
                await link.tried.wait()

    # ---------------------------------------------------------------- registry (RegistryListener)

    def registry_changed(self, change: RegistryChange) -> None:
        if change.channel is not None or not change.created:
            self._post_channels(change.topic)

    def options_changed(self, options: Options) -> None:
        self.options = self.copies.options = self.holder.options = options

    async def channels_for(self, topic: str) -> list[str]:
        return []

    def peer_states(self) -> list[PeerState]:
        return []

    def _post_channels(self, topic: str, links: list[PeerLink] | None = None) -> None:
        found = self.broker.topics.get(topic)
        request = Channels(topic, sorted(found.channels) if found is not None else [])
        for link in links if links is not None else self.peers.links.values():
            link.post(request)

    # ---------------------------------------------------------------- peers

    async def _discover(self) -> bool:
        """Add a link for every node the lookupds list; False when no lookupd answered."""
        assert self._nodes is not None and self._nursery is not None
        nodes = await self._nodes()
        if nodes is None:
            return False
        links = self.peers.links
        for address in nodes:
            if address == self._own or address in links:
                continue
            link = PeerLink(address, self.node_id, self.options.replica_timeout, self._hello_answered,
                            self._link_connected, secret=self._secret, ssl_context=self._ssl_context,
                            lost_memory=self._lost_memory, local_address=self._local_address)
            links[address] = link
            self._nursery.start_soon(link.run)
        now = trio.current_time()
        for address in list(links):
            if address in nodes:
                self._unlisted.pop(address, None)
            elif links[address].hello_at < 0:  # never a node of this cluster: nothing kept for it
                self._unlisted.pop(address, None)
                links.pop(address).cancel_scope.cancel()
            elif now - self._unlisted.setdefault(address, now) > UNLISTED_GRACE:
                # gone for good: what was kept for it (FINs, takeovers) goes with the link
                del self._unlisted[address]
                links.pop(address).cancel_scope.cancel()
        return True

    async def _discover_loop(self) -> None:
        while True:
            try:
                await self._discover()
            except Exception as exc:  # a fault here must not take the node down
                log.error("REPLICATION: looking for peers failed: %s", exc, exc_info=exc)
            await trio.sleep(DISCOVERY_INTERVAL)

    def _hello_answered(self, link: PeerLink, answer: Any) -> None:
        """The peer told what it took over from this node (those messages are not delivered
        here), from every node (copies held here of those are dropped), and how many copies
        it holds for this node (see :mod:`.recopy`). Raises
        :class:`~broker.replication.wire.WireError` (the link breaks) for an answer that is
        not what a node says."""
        mine, everything = decode_hello_answer(answer)
        if link.peer_id is not None:
            self.takeover.heard_from(link.peer_id)
            self.recopy.heard(link.peer_id, decode_hello_holding(answer))
            self.quorum.members.proven(link.peer_id, f"{link.address[0]}:{link.address[1]}")
        held = self.holder.held
        assert held is not None
        for origin, topics in everything.items():
            for topic_name, ids in topics.items():
                if origin != self.node_id and ids:
                    held.drop(origin, topic_name, ids, by=link.peer_id)  # only what the peer held too
        guid = self.broker.guid
        for topic_name, ids in mine.items():
            self.refused.taken(topic_name, ids)
            if ids:  # learnt: the peer need not say them again (what is not skipped here was not ours)
                link.post(Forget(topic_name, ids), 17 * len(ids))
            issued = [msg_id for msg_id in ids if guid.could_have_issued(msg_id)]
            if len(issued) < len(ids):
                log.warning("REPLICATION: node %s says it took over %d messages of topic %s this node never "
                            "published: ignored", link.peer_id, len(ids) - len(issued), topic_name)
            topic = self.broker.topics.get(topic_name)
            if topic is None or not issued:
                continue
            count = topic.depth + sum(c.depth + len(c.in_flight) + len(c.deferred) for c in topic.channels.values())
            if len(issued) > count:  # more than the topic has: no node took over what is not here
                log.warning("REPLICATION: node %s says it took over %d messages of topic %s, which holds %d: "
                            "ignored", link.peer_id, len(issued), topic_name, count)
                continue
            topic.skip_taken(issued)
            log.info("REPLICATION: node %s took over %d messages of topic %s: not delivered here",
                     link.peer_id, len(issued), topic_name)

    def _link_connected(self, link: PeerLink) -> None:
        self.peers.link_connected()
        for name in list(self.broker.topics):
            self._post_channels(name, [link])

    # ---------------------------------------------------------------- this node stopped

    async def _clock_loop(self) -> None:
        """Notice this process was stopped (SIGSTOP) or starved for long enough that its peers
        may have taken over its messages: channels hold back (see :class:`ClockFence`) until
        every peer answered a fresh HELLO, or failed to, within ``--replica-timeout``."""
        fence = self.fence
        while True:
            await trio.sleep(CLOCK_TICK)
            now = time.monotonic()
            stopped = now - fence.last_tick > fence.limit
            fence.last_tick = now
            quorum = self.quorum
            # a stop is the clock's to judge
            minority = (quorum.tick() > fence.limit or quorum.silent() > max(fence.limit, 2 * HEARTBEAT)) \
                and not stopped
            if minority != fence.minority:
                if minority:
                    log.warning("REPLICATION: this node has heard from no majority of the cluster's %d nodes for "
                                "%.1fs: its replicated topics hold delivery", len(quorum.members), quorum.silent())
                else:  # the majority may have taken this node's messages over meanwhile
                    await self._hear_back()
                fence.minority = minority
                if not minority:
                    self._dispatch_all()
            if stopped and not fence.armed:
                fence.armed = True
                try:
                    await self._ask_again()
                finally:
                    fence.armed = False
                    self._dispatch_all()

    async def _ask_again(self) -> None:
        since = trio.current_time()
        log.warning("REPLICATION: this node was stopped or starved; delivery waits for its peers' answers")
        links = list(self.peers.links.values())
        for link in links:
            link.reconnect()
        with trio.move_on_after(self.options.replica_timeout):
            while not all(link.hello_at > since or link.failed_at > since for link in links):
                await trio.sleep(0.01)
                self.fence.last_tick = time.monotonic()

    async def _hear_back(self) -> None:
        """After a minority, before the channels deliver again: wait until the links up are a
        majority and every other has failed an attempt begun since, within ``--replica-timeout``
        (the clock task, which keeps the clock fence's tick meanwhile). A link that came up
        again was answered HELLO, which says what the peer took over from this node, and what
        it was told others took (a takeover is told to a majority before it delivers, so one
        of any majority knows). The majority reaching this node again is not enough: it dials
        this node too, and those connections make it reach a majority before its own links
        said HELLO."""
        log.info("REPLICATION: delivery waits for the peers' answers to HELLO")
        since = trio.current_time()
        links = list(self.peers.links.values())
        majority = self.quorum.members.majority
        with trio.move_on_after(self.options.replica_timeout):
            while not (all(link.connected or link.failed_from >= since for link in links) and
                       majority({link.peer_id for link in links if link.connected and link.peer_id is not None})):
                await trio.sleep(0.01)
                self.fence.last_tick = time.monotonic()

    def _dispatch_all(self) -> None:
        for topic in list(self.broker.topics.values()):
            for channel in list(topic.channels.values()):
                channel.dispatch()

    # ---------------------------------------------------------------- takeover

    async def _takeover_loop(self) -> None:
        while True:
            await trio.sleep(TAKEOVER_INTERVAL)
            try:
                await self._take_over_gone()
            except Exception as exc:  # tried again at the next tick; the copies stay
                log.error("REPLICATION: takeover failed: %s", exc, exc_info=exc)
                await trio.sleep(1.0)

    async def _take_over_gone(self) -> None:
        """Take over what the nodes gone for ``--replica-timeout`` left to this node; compact the log."""
        takeover = self.takeover
        for origin in takeover.gone(trio.current_time()):
            if not await self.quorum.agree_gone(origin):
                continue  # no majority of the cluster says so: it may be on the other side of a partition
            async with self._log_lock:
                await takeover.take_over(origin, takeover.mine(origin))
        held = self.holder.held
        assert held is not None
        if held.needs_compaction():
            async with self._log_lock:
                await held.compact()

    async def _take_over_now(self, origin: str) -> None:
        """Take over at once the copies of ``origin`` this node is the first holder of (a node
        that restarted after a crash without ``--durable``)."""
        async with self._log_lock:
            await self.takeover.take_over(origin, self.takeover.mine(origin), gone=False)

    # ---------------------------------------------------------------- stats

    def _held_for_topic(self, topic: str) -> int:
        held = self.holder.held
        return held.held_for_topic(topic) if held is not None else 0

    def node_stats(self) -> dict:
        peers = [{"address": f"{host}:{port}", "node_id": link.peer_id or "", "connected": link.connected}
                 for (host, port), link in sorted(self.peers.links.items())]
        held = self.holder.held
        by_origin = {origin: sum(len(copies) for copies in topics.values())
                     for origin, topics in sorted(held.origins.items())} if held is not None else {}
        quorum = self._quorum
        members = sorted(quorum.members.nodes) if quorum is not None else [self.node_id]
        return {"node_id": self.node_id, "replicas": self.options.replicas, "peers": peers,
                "members": members, "majority": quorum.has_majority() if quorum is not None else True,
                "copies_held": sum(by_origin.values()),
                "copies_held_by_origin": {k: v for k, v in by_origin.items() if v},
                "secret": bool(self._secret), "tls": self._ssl_context is not None,
                "log_records_lost": held.records_lost if held is not None else 0,
                "log_records_skipped": held.records_skipped if held is not None else 0,
                "copies_lost": held.copies_lost if held is not None else 0,
                "keys_held": held.keys_held if held is not None else 0,
                "keys_evicted": held.keys_evicted if held is not None else 0,
                "takeovers_remembered": sum(len(ids) for topics in held.taken.values() for ids in topics.values())
                if held is not None else 0,
                "handshakes_refused": self.holder.handshakes_refused + sum(
                    link.refusals for link in self.peers.links.values()),
                "requests_refused": self.holder.requests_refused,
                "takeover_failures": sum(stats.takeover_failures for stats in self.copies.stats.values()),
                "copies_missing": sum(stats.copies_missing for stats in self.copies.stats.values()),
                "copies_restored": self._recopy.restored if self._recopy is not None else 0}


def _dial_from(tcp_address: str) -> str | None:
    """The address links dial from: the IP address the TCP listener binds, when it binds one
    (not every address, not a name, not a unix socket)."""
    host, _, _ = tcp_address.rpartition(":")
    host = host.strip("[]")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    return None if address.is_unspecified else str(address)


def _node_id(data_path: Path) -> str:
    """This node's id: kept in the data directory (a wiped directory makes a new node)."""
    path = data_path / _NODE_ID_FILE
    try:
        value = path.read_text().strip()
        if is_valid_node_id(value):
            return value
    except FileNotFoundError:
        pass
    value = secrets.token_hex(16)
    replace_durably(str(path), (value + "\n").encode())
    return value
