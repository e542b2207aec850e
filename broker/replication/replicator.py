"""The node's replication: copies out on publish, copies held for peers, and takeovers.

Publishing (:meth:`Replicator.store`, the core's :class:`~broker.core.host.Copies`): the
messages of a publish go in one ADD to ``replicas - 1`` connected peers, chosen per topic
by rendezvous hashing (so a topic's copies from one node sit on the same peers while they
live); the publish is queued here and answered once every one of them answered, or refused
(``CopiesRefused``) when too few are connected or answer within ``--replica-timeout``. The
peers that did take a copy are then told to drop it.

Finishing: every FIN of a channel of a replicated topic is batched and posted to every peer
each :data:`FIN_INTERVAL`; a holder drops a copy once every channel it knows of the topic
finished it. The topic's channels are posted when they change and when a link connects.

Holding (:meth:`Replicator.receive`, from the TCP server): requests from a peer are applied
to :class:`~broker.replication.held.HeldCopies`; an ADD is answered once its record is on
stable storage with ``--durable``.

Takeover: a node is gone once no connection to or from it has been up for
``--replica-timeout``. For each copy it left, the first of the copy's other holders that is
up (in the order the origin listed them) takes it over: it gives the message a new id
(this node's ids never collide with another's), stores copies of it on its own peers as for a
publish (keeping the channels that had finished it), queues it in the channels that had not
(creating the topic and those channels, which registers them with nsqlookupd), records the
takeover and tells the other holders to drop theirs. A node that comes back learns what was
taken over from it in the answer to its HELLO, and its channels skip those messages
(:meth:`~broker.core.topic.Topic.skip_taken`); the daemon waits for those answers (at most
``--replica-timeout``) before it serves consumers.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import ssl
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from broker.config.options import Options
from broker.core.host import CopiesRefused, Fence, PeerState, RegistryChange
from broker.core.message import Message
from broker.protocol.replica import (
    ACCEPTOR,
    CONNECTOR,
    Challenge,
    is_valid_node_id,
    new_nonce,
    proof,
    proof_holds,
)
from broker.replication.held import HeldCopies
from broker.replication.links import PeerLink
from broker.replication.notice import Notices, printable
from broker.replication.wire import (
    Add,
    Channels,
    Drop,
    Fin,
    Hello,
    Request,
    Taken,
    WireError,
    WireLimits,
    check_entries,
    decode_hello_answer,
    decode_requests,
    message_of,
    pack,
    pack_entries,
)
from diskqueue import DiskQueueError
from diskqueue.checkpoint import replace_durably

if TYPE_CHECKING:
    from broker.core.broker import Broker

__all__ = ["Replicator", "ReplicaStats", "FIN_INTERVAL"]

log = logging.getLogger("pynsqd.replication")

#: Seconds between two batches of FINs posted to the peers.
FIN_INTERVAL = 0.1
#: Seconds between two looks at nsqlookupd's ``/nodes``.
DISCOVERY_INTERVAL = 1.0
#: Seconds between two checks for nodes gone.
TAKEOVER_INTERVAL = 0.25
#: Seconds a link to a node the lookupds stopped listing is kept (a node that restarts comes
#: back to the FINs and takeovers kept for it meanwhile).
UNLISTED_GRACE = 300.0
#: Seconds between two ticks of the clock that notices this process was stopped.
CLOCK_TICK = 0.1
#: Messages taken over in one step.
TAKEOVER_PIECE = 1000
#: Requests of one REPL body applied in one step (other tasks run between steps).
APPLY_PIECE = 1000
#: Seconds between two log lines about the same topic's failing takeover.
TAKEOVER_FAILURE_LOG = 60.0
_NODE_ID_FILE = "replication.id"
#: There while the node runs: found at a start, the last run ended in a crash.
_RUNNING_FILE = "replication.running"

Nodes = Callable[[], Awaitable[set[tuple[str, int]] | None]]


class ReplicaStats:
    """One topic's replication counters, for ``/stats`` and ``/metrics``."""

    __slots__ = ("copies_waiting", "takeovers", "publishes_refused", "takeover_failures")

    def __init__(self) -> None:
        self.copies_waiting = 0
        self.takeovers = 0
        self.publishes_refused = 0
        self.takeover_failures = 0


class Replicator:
    """Replication for ``broker`` (``--replicas`` > 1); its data lives in ``data_path``.

    ``secret`` is the cluster's (``--replication-secret-file``; empty: none, and any client
    can pass for a node); ``ssl_context`` (None: this node has no TLS) is what its links to
    its peers verify their certificates with."""

    def __init__(self, broker: Broker, data_path: Path, secret: bytes = b"",
                 ssl_context: ssl.SSLContext | None = None):
        self.broker = broker
        self.options: Options = broker.options
        self._data_path = data_path
        self._secret = secret
        self._ssl_context = ssl_context
        self._limits = WireLimits(self.options.max_msg_size)
        #: connections from others that failed to prove they come from a node of the cluster, since start
        self.handshakes_refused = 0
        #: REPL requests refused because a field was wrong, since start
        self.requests_refused = 0
        self._notices = Notices(log)
        #: takeovers and compactions read the log through and change it: one at a time
        self._log_lock = trio.Lock()
        #: topics whose takeover failed, and when that was last logged (logged once a minute)
        self._takeover_failed: dict[tuple[str, str], float] = {}
        self._handlers: dict[type, Callable[[str, Any], None]] = {
            Add: self._on_add, Fin: self._on_fin, Drop: self._on_drop, Channels: self._on_channels,
            Taken: self._on_taken,
        }
        self.node_id = ""  # read (or made) by run, once the data directory is locked
        self._held: HeldCopies | None = None  # opened by run
        self.links: dict[tuple[str, int], PeerLink] = {}
        self.stats: dict[str, ReplicaStats] = defaultdict(ReplicaStats)
        self._inbound: dict[str, set[object]] = defaultdict(set)
        self._gone_since: dict[str, float] = {}
        self._heard: dict[str, float] = {}  # when a closed connection from a node last received bytes
        self._fins: dict[tuple[str, str], list[bytes]] = defaultdict(list)
        self._own: tuple[str, int] | None = None
        self._unlisted: dict[tuple[str, int], float] = {}  # links whose node the lookupds no longer list
        self._nodes: Nodes | None = None
        self._nursery: trio.Nursery | None = None
        self._lost_memory = False
        #: channels hold delivery while this node may have been taken for gone (see _clock_loop),
        #: and from the start until the peers said what they took over (see run)
        self.fence = Fence(max(1.0, self.options.replica_timeout / 2))
        self._peers_changed = trio.Event()  # set (and replaced) when a link connects
        # publishes go through this replicator from the first: one that comes before the node
        # found its peers waits for them, as for its copies
        broker.host.replication.fence = self.fence
        broker.host.replication.copies = self

    # ---------------------------------------------------------------- lifecycle

    async def run(self, nodes: Nodes, own: tuple[str, int], *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Find peers through ``nodes`` (nsqlookupd's ``/nodes``; ``own`` is this node's entry),
        hold copies for them and take over from the gone, until cancelled."""
        self.node_id = _node_id(self._data_path)
        self._held = await HeldCopies.open(self._data_path, durable=self.options.durable,
                                          max_record=self.options.max_body_size * 2 + (1 << 20))
        running = self._data_path / _RUNNING_FILE
        # without --durable a crash loses what was in memory: the peers then take over at once
        self._lost_memory = running.exists() and not self.options.durable
        running.touch()
        self._nodes = nodes
        self._own = own  # from now on, peers' handshakes are answered
        started = trio.current_time()
        for origin in self.held.origins:  # each must show itself within --replica-timeout
            self._gone_since.setdefault(origin, started)
        log.info("REPLICATION: node %s, %d replicas, holding %d copies for %d nodes", self.node_id,
                 self.options.replicas, self.held.live(), len(self.held.origins))
        if not self._secret:
            log.warning("REPLICATION: no --replication-secret-file: any client that reaches this node's TCP port "
                        "can pass for a node of the cluster, and drop or inject the copies of acknowledged messages")
        self.broker.listen(self)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._discover_loop)
                nursery.start_soon(self._fin_loop)
                nursery.start_soon(self._takeover_loop)
                nursery.start_soon(self._clock_loop)
                task_status.started()
                await self._catch_up()
                self.fence.starting = False
                self._dispatch_all()
                await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await self.held.close()
            (self._data_path / _RUNNING_FILE).unlink(missing_ok=True)

    @property
    def held(self) -> HeldCopies:
        """The copies this node holds for others (open from the start of :meth:`run`)."""
        assert self._held is not None, "run opens the log before anything uses it"
        return self._held

    async def _catch_up(self) -> None:
        """Return once every peer the lookupds list answered HELLO (or failed once), within
        ``--replica-timeout``: what was taken over from this node is known before its channels
        deliver (the fence holds them meanwhile)."""
        with trio.move_on_after(self.options.replica_timeout):
            while not await self._discover():
                await trio.sleep(0.1)
            for link in list(self.links.values()):
                await link.tried.wait()

    # ---------------------------------------------------------------- publishing (Copies)

    def replicas(self, topic: str) -> int:
        return self.options.replicas

    async def store(self, topic: str, messages: list[Message], dones: list[list[str] | None] | None = None,
                    *, best_effort: bool = False) -> None:
        need = self.replicas(topic) - 1
        deadline = trio.current_time() + self.options.replica_timeout
        links = self._holders_for(topic)[:need]
        if len(links) < need and not best_effort:  # a node just started, or a peer is reconnecting
            with trio.move_on_at(deadline):
                while len(links) < need:
                    await self._peers_changed.wait()
                    links = self._holders_for(topic)[:need]
        stats = self.stats[topic]
        if len(links) < need and not best_effort:
            stats.publishes_refused += 1
            raise CopiesRefused(f"only {len(links) + 1} of {need + 1} copies: "
                                f"{len(links)} of {len(self.links)} peers connected")
        holders = [self.node_id, *(link.peer_id or "" for link in links)]
        entries = pack_entries(messages, dones, published=dones is None)
        ids = [msg.id for msg in messages]
        add = Add(topic, tuple(holders), ids, entries)
        waiters = [link.request(add, len(entries), inline=True) for link in links]
        for link in links:
            await link.flush()
        waiting = len(messages) * len(links)
        stats.copies_waiting += waiting
        try:
            with trio.move_on_at(deadline):
                for waiter in waiters:
                    await waiter.done.wait()
        finally:
            stats.copies_waiting -= waiting
        stored = [link for link, waiter in zip(links, waiters) if waiter.done.is_set() and waiter.error is None]
        if len(stored) < need and not best_effort:
            for link in links:  # those that answer late drop theirs too
                link.post(Drop(topic, ids))
            stats.publishes_refused += 1
            errors = sorted({waiter.error or "no answer" for waiter in waiters if waiter.error or not waiter.done.is_set()})
            log.warning("REPLICATION: publish to %s refused: %d of %d copies (%s)", topic, len(stored) + 1, need + 1,
                        ", ".join(errors))
            raise CopiesRefused(f"only {len(stored) + 1} of {need + 1} copies: {', '.join(errors)}")

    def abandon(self, topic: str, messages: list[Message]) -> None:
        ids = [msg.id for msg in messages]
        for link in self.links.values():
            link.post(Drop(topic, ids))

    def finished(self, topic: str, channel: str, ids: list[bytes]) -> None:
        self._fins[(topic, channel)].extend(ids)

    def _holders_for(self, topic: str) -> list[PeerLink]:
        """The connected peers in the topic's rendezvous order."""
        links = [link for link in self.links.values() if link.connected and link.peer_id is not None]
        return sorted(links, key=lambda link: _rank(topic, link.peer_id or ""))

    # ---------------------------------------------------------------- registry (RegistryListener)

    def registry_changed(self, change: RegistryChange) -> None:
        if change.channel is not None or not change.created:
            self._post_channels(change.topic)

    def options_changed(self, options: Options) -> None:
        self.options = options

    async def channels_for(self, topic: str) -> list[str]:
        return []

    def peer_states(self) -> list[PeerState]:
        return []

    def _post_channels(self, topic: str, links: list[PeerLink] | None = None) -> None:
        found = self.broker.topics.get(topic)
        channels = sorted(found.channels) if found is not None else []
        for link in links if links is not None else self.links.values():
            link.post(Channels(topic, channels))

    # ---------------------------------------------------------------- holding (ReplicaReceiver)

    def opened(self, peer: str, link: object) -> None:
        self._inbound[peer].add(link)
        self._gone_since.pop(peer, None)

    def closed(self, peer: str, link: object, last_heard: float) -> None:
        links = self._inbound[peer]
        links.discard(link)
        self._heard[peer] = max(self._heard.get(peer, last_heard), last_heard)

    def challenge(self, peer: str, peer_nonce: str, address: str, remote: str) -> Challenge | None:
        own = self._own_address()
        if own is None or address != own:
            self.handshakes_refused += 1
            self._notices.warn(("dialled", remote), "REPLICATION: client(%s) said it was node %s dialling %s, and "
                               "this node is %s: refused (a relay between nodes, or a stale nsqlookupd entry)",
                               remote, peer, printable(address), own)
            return None
        return Challenge(peer, peer_nonce, new_nonce(), address)

    def accepting_proof(self, challenge: Challenge) -> str:
        return proof(self._secret, ACCEPTOR, challenge.nonce, challenge.peer_nonce, self.node_id, challenge.peer,
                     challenge.address)

    def proven(self, challenge: Challenge | None, peer: str, given: object, remote: str) -> bool:
        if challenge is not None and challenge.peer == peer and proof_holds(
                given, self._secret, CONNECTOR, challenge.peer_nonce, challenge.nonce, peer, self.node_id,
                challenge.address):
            return True
        self.handshakes_refused += 1
        self._notices.warn(("proof", remote.rsplit(":", 1)[0]), "REPLICATION: client(%s) said it was node %s and "
                           "did not prove it belongs to this cluster (is --replication-secret-file the same on "
                           "both?)", remote, peer)
        return False

    def _own_address(self) -> str | None:
        """This node's address as the lookupds list it (``host:port``), once it runs."""
        return None if self._own is None else f"{self._own[0]}:{self._own[1]}"

    def receive(self, peer: str, body: bytes) -> bytes | Awaitable[bytes]:
        """Apply the requests of a ``REPL`` from ``peer``: every one is checked before any is
        applied, and a body with one that is wrong changes nothing and is answered with why."""
        try:
            seq, requests = decode_requests(body, self._limits)
            for request in requests:
                self._check_from(peer, request, seq)
        except WireError as exc:
            self.requests_refused += 1
            self._notices.warn(("request", peer), "REPLICATION: refused a REPL from node %s: %s", peer, exc)
            return pack([exc.seq, f"bad request: {exc}", None])
        if requests and type(requests[0]) is Hello:  # alone in its body (decode_requests checks)
            if requests[0].lost_memory:
                return self._hello_after_loss(peer, seq)
            return pack([seq, None, self._taken_from(peer)])
        if len(requests) > APPLY_PIECE:
            return self._apply_in_pieces(peer, seq, requests)
        try:
            self._apply(peer, requests)
        except DiskQueueError as exc:
            log.error("REPLICATION: storing what node %s sent failed: %s", peer, exc)
            return pack([seq, f"storing failed: {exc}", None])
        answer = pack([seq, None, None])
        if self.options.durable and any(type(request) is Add for request in requests):
            return self._synced(seq, answer)
        return answer

    def _apply(self, peer: str, requests: list[Request]) -> None:
        handlers = self._handlers
        for request in requests:
            handlers[type(request)](peer, request)

    async def _apply_in_pieces(self, peer: str, seq: int, requests: list[Request]) -> bytes:
        """A large body's requests, :data:`APPLY_PIECE` at a time with the other tasks running
        between pieces (its connection's next command waits for the answer, so order holds)."""
        try:
            for start in range(0, len(requests), APPLY_PIECE):
                if start:
                    await trio.lowlevel.checkpoint()
                self._apply(peer, requests[start:start + APPLY_PIECE])
        except DiskQueueError as exc:
            log.error("REPLICATION: storing what node %s sent failed: %s", peer, exc)
            return pack([seq, f"storing failed: {exc}", None])
        answer = pack([seq, None, None])
        if self.options.durable and any(type(request) is Add for request in requests):
            return await self._synced(seq, answer)
        return answer

    def _check_from(self, peer: str, request: Request, seq: int) -> None:
        """What a node may say of itself and of others: it adds copies of its own messages, held by
        this node among others, and takes over from a node other than itself."""
        problem = None
        if type(request) is Add and (request.holders[0] != peer or self.node_id not in request.holders[1:]):
            problem = WireError("an ADD's holders must be its sender, then this node among others")
        if type(request) is Taken and request.origin in (peer, self.node_id):
            problem = WireError("a node takes over from another node")
        if problem is not None:
            problem.seq = seq
            raise problem

    def _on_add(self, peer: str, request: Add) -> None:
        self.held.add(peer, request.topic, list(request.holders), request.ids, request.entries, request.dones)

    def _on_fin(self, peer: str, request: Fin) -> None:
        self.held.finish(peer, request.topic, request.channel, request.ids)

    def _on_drop(self, peer: str, request: Drop) -> None:
        self.held.drop(peer, request.topic, request.ids)

    def _on_channels(self, peer: str, request: Channels) -> None:
        self.held.set_channels(peer, request.topic, request.channels)

    def _on_taken(self, peer: str, request: Taken) -> None:
        self.held.drop(request.origin, request.topic, request.ids, by=peer)  # only what the sender held too

    def _taken_from(self, peer: str) -> list:
        """HELLO's answer: what this node took over from ``peer``, and from every node (so that a
        peer that was down meanwhile drops the copies it holds of those before it acts on them)."""
        everything = {origin: {topic: sorted(ids) for topic, ids in topics.items()}
                      for origin, topics in self.held.taken.items()}
        return [everything.get(peer, {}), everything]

    async def _hello_after_loss(self, peer: str, seq: int) -> bytes:
        """HELLO from a node that restarted after a crash without ``--durable``: what it held in
        memory is gone, so its copies held here are taken over now (those this node is the first
        holder of), and the answer tells it which, so that what it kept on disk is not
        delivered twice."""
        log.warning("REPLICATION: node %s restarted after a crash without --durable: taking over its copies",
                    peer)
        async with self._log_lock:
            await self._take_over(peer, self._mine(peer))
        return pack([seq, None, self._taken_from(peer)])

    async def _synced(self, seq: int, answer: bytes) -> bytes:
        try:
            await self.held.synced()
        except DiskQueueError as exc:
            return pack([seq, f"sync failed: {exc}", None])
        return answer

    # ---------------------------------------------------------------- peers

    async def _discover(self) -> bool:
        """Add a link for every node the lookupds list; False when no lookupd answered."""
        assert self._nodes is not None and self._nursery is not None
        nodes = await self._nodes()
        if nodes is None:
            return False
        for address in nodes:
            if address == self._own or address in self.links:
                continue
            link = PeerLink(address, self.node_id, self.options.replica_timeout, self._hello_answered,
                            self._link_connected, secret=self._secret, ssl_context=self._ssl_context,
                            lost_memory=self._lost_memory)
            self.links[address] = link
            self._nursery.start_soon(link.run)
        now = trio.current_time()
        for address in list(self.links):
            if address in nodes:
                self._unlisted.pop(address, None)
            elif now - self._unlisted.setdefault(address, now) > UNLISTED_GRACE:
                # gone for good: what was kept for it (FINs, takeovers) goes with the link
                del self._unlisted[address]
                self.links.pop(address).cancel_scope.cancel()
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
        here) and from every node (copies held here of those are dropped). Raises
        :class:`WireError` (the link breaks) for an answer that is not what a node says."""
        mine, everything = decode_hello_answer(answer)
        if link.peer_id is not None:
            self._gone_since.pop(link.peer_id, None)
        for origin, topics in everything.items():
            for topic_name, ids in topics.items():
                if origin != self.node_id and ids:
                    self.held.drop(origin, topic_name, ids)
        guid = self.broker.guid
        for topic_name, ids in mine.items():
            issued = [msg_id for msg_id in ids if guid.could_have_issued(msg_id)]
            if len(issued) < len(ids):
                log.warning("REPLICATION: node %s says it took over %d messages of topic %s this node never "
                            "published: ignored", link.peer_id, len(ids) - len(issued), topic_name)
            topic = self.broker.topics.get(topic_name)
            if topic is None or not issued:
                continue
            held = topic.depth + sum(c.depth + len(c.in_flight) + len(c.deferred) for c in topic.channels.values())
            if len(issued) > held:  # more than the topic has: no node took over what is not here
                log.warning("REPLICATION: node %s says it took over %d messages of topic %s, which holds %d: "
                            "ignored", link.peer_id, len(issued), topic_name, held)
                continue
            if issued:
                topic.skip_taken(issued)
                log.info("REPLICATION: node %s took over %d messages of topic %s: not delivered here",
                         link.peer_id, len(issued), topic_name)

    def _link_connected(self, link: PeerLink) -> None:
        self._peers_changed.set()
        self._peers_changed = trio.Event()
        for name in list(self.broker.topics):
            self._post_channels(name, [link])

    def _reachable(self, node: str) -> bool:
        if self._inbound.get(node):
            return True
        return any(link.connected and link.peer_id == node for link in self.links.values())

    # ---------------------------------------------------------------- this node stopped

    async def _clock_loop(self) -> None:
        """Notice this process was stopped (SIGSTOP) or starved for long enough that its peers
        may have taken over its messages: channels hold back (see :class:`Fence`) until every
        peer answered a fresh HELLO, or failed to, within ``--replica-timeout``."""
        fence = self.fence
        while True:
            await trio.sleep(CLOCK_TICK)
            now = time.monotonic()
            stopped = now - fence.last_tick > fence.limit
            fence.last_tick = now
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
        links = list(self.links.values())
        for link in links:
            link.reconnect()
        with trio.move_on_after(self.options.replica_timeout):
            while not all(link.hello_at > since or link.failed_at > since for link in links):
                await trio.sleep(0.01)
                self.fence.last_tick = time.monotonic()

    def _dispatch_all(self) -> None:
        for topic in list(self.broker.topics.values()):
            for channel in list(topic.channels.values()):
                channel.dispatch()

    # ---------------------------------------------------------------- FIN batches

    async def _fin_loop(self) -> None:
        while True:
            await trio.sleep(FIN_INTERVAL)
            fins, self._fins = self._fins, defaultdict(list)
            for (topic, channel), ids in fins.items():
                for link in self.links.values():
                    link.post(Fin(topic, channel, ids), 17 * len(ids))

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
        now = trio.current_time()
        for origin in list(self.held.origins):
            if origin == self.node_id or self._reachable(origin):
                self._gone_since.pop(origin, None)
                continue
            since = self._gone_since.get(origin)
            if since is None:
                # silence counts from the last bytes heard from it: a paused node is gone after
                # --replica-timeout without an answer, not after the heartbeats gave up on it and then some
                since = self._gone_since[origin] = min(now, self._last_heard(origin, now))
            if now - since < self.options.replica_timeout:
                continue
            async with self._log_lock:
                await self._take_over(origin, self._mine(origin))
        if self.held.needs_compaction():
            async with self._log_lock:
                await self.held.compact()

    def _mine(self, origin: str) -> dict[str, set[bytes]]:
        """The copies of ``origin`` this node takes over (it is their first holder up), by topic."""
        mine: dict[str, set[bytes]] = {}
        for topic, copies in self.held.origins.get(origin, {}).items():
            ids = {msg_id for msg_id, holders in copies.holders.items()
                   if self._first_up(holders, origin) == self.node_id}
            if ids:
                mine[topic] = ids
        return mine

    def _last_heard(self, node: str, default: float) -> float:
        """When this node last received bytes from ``node`` on any connection (``default`` if never)."""
        times = [link.last_heard for link in self.links.values() if link.peer_id == node]
        if node in self._heard:
            times.append(self._heard[node])
        return max(times, default=default)

    def _first_up(self, holders: tuple[str, ...], origin: str) -> str | None:
        for node in holders:
            if node != origin and (node == self.node_id or self._reachable(node)):
                return node
        return None

    async def _take_over(self, origin: str, mine: dict[str, set[bytes]]) -> None:
        """Take over the copies ``mine`` of ``origin``, by topic: their entries are read back in one
        pass over the log, and each topic's are queued :data:`TAKEOVER_PIECE` at a time. A
        failure is its topic's alone: logged (once a minute while it lasts), counted, and tried
        again at the next tick, while the other topics go on."""
        if not mine:
            return
        pieces: dict[str, list[list]] = defaultdict(list)
        found: dict[str, set[bytes]] = defaultdict(set)
        failed: set[str] = set()
        async for _origin, topic, item in self.held.entries({(origin, topic): ids for topic, ids in mine.items()}):
            found[topic].add(item[0])
            if topic in failed:
                continue
            pieces[topic].append(item)
            if len(pieces[topic]) >= TAKEOVER_PIECE:
                await self._take_over_guarded(origin, topic, pieces.pop(topic), failed)
        for topic, items in pieces.items():
            await self._take_over_guarded(origin, topic, items, failed)
        for topic, ids in mine.items():
            missing = ids - found[topic]
            if missing and topic not in failed:  # held, yet not in the log (damaged): nothing to deliver
                self.held.copies_lost += len(missing)
                log.error("REPLICATION: %d copies of topic %s from node %s were not found in the replication log "
                          "(it is damaged): those messages are lost unless another node holds them", len(missing),
                          topic, origin)
                self.held.mark_taken(origin, topic, sorted(missing))
            if topic not in failed:
                self._takeover_failed.pop((origin, topic), None)

    async def _take_over_guarded(self, origin: str, topic: str, items: list[list], failed: set[str]) -> None:
        try:
            await self._take_over_piece(origin, topic, items)
        except (DiskQueueError, OSError, ValueError, LookupError, TypeError) as exc:
            failed.add(topic)
            now = trio.current_time()
            key = (origin, topic)
            if now - self._takeover_failed.get(key, -TAKEOVER_FAILURE_LOG) >= TAKEOVER_FAILURE_LOG:
                self._takeover_failed[key] = now
                self.stats[topic].takeover_failures += 1
                log.error("REPLICATION: taking over messages of topic %s from node %s failed (tried again): %s",
                          topic, origin, exc)

    async def _take_over_piece(self, origin: str, topic: str, items: list[list]) -> None:
        copies = self.held.copies(origin, topic)
        channels = list(self.held.channels.get(origin, {}).get(topic, []))
        items = [item for item in items if copies is not None and item[0] in copies.holders]
        ids = [item[0] for item in items]
        new_ids = self.broker.guid.next_ids(len(items))
        messages: list[tuple[Message, list[str] | None]] = []
        dones: list[list[str] | None] = []
        for item, new_id in zip(items, new_ids):
            if not _takeable(item):
                self.held.copies_lost += 1
                log.error("REPLICATION: a copy of topic %s from node %s in the replication log cannot be read: lost "
                          "unless another node holds it", topic, origin)
                continue
            done = copies.done.get(item[0]) if copies is not None else None
            only = [name for name in channels if name not in done] if done and channels else None
            if only == []:
                continue
            messages.append((message_of(item, new_id), only))
            dones.append(sorted(done) if done else None)
        if messages:
            await self.store(topic, [msg for msg, _ in messages], dones, best_effort=True)
            await self.broker.put_taken(topic, channels, messages)
        self.held.mark_taken(origin, topic, ids)
        if self.options.durable:
            await self.held.synced()
        for link in self.links.values():
            link.post(Taken(origin, topic, ids), 17 * len(ids))
        self.stats[topic].takeovers += len(messages)
        log.info("REPLICATION: took over %d messages of topic %s from node %s (gone for %.1fs)", len(messages),
                 topic, origin, trio.current_time() - self._gone_since.get(origin, trio.current_time()))

    # ---------------------------------------------------------------- stats

    def counters(self, topic: str) -> tuple[int, int, int, int, int]:
        stats = self.stats.get(topic) or ReplicaStats()
        held = self._held.held_for_topic(topic) if self._held is not None else 0
        return (self.replicas(topic), held, stats.copies_waiting, stats.takeovers, stats.publishes_refused)

    def node_stats(self) -> dict:
        peers = [{"address": f"{host}:{port}", "node_id": link.peer_id or "", "connected": link.connected}
                 for (host, port), link in sorted(self.links.items())]
        log_ = self._held
        held = {origin: sum(len(copies) for copies in topics.values())
                for origin, topics in sorted(log_.origins.items())} if log_ is not None else {}
        return {"node_id": self.node_id, "replicas": self.options.replicas, "peers": peers,
                "copies_held": sum(held.values()), "copies_held_by_origin": {k: v for k, v in held.items() if v},
                "secret": bool(self._secret), "tls": self._ssl_context is not None,
                "log_records_lost": log_.records_lost if log_ is not None else 0,
                "log_records_skipped": log_.records_skipped if log_ is not None else 0,
                "copies_lost": log_.copies_lost if log_ is not None else 0,
                "handshakes_refused": self.handshakes_refused + sum(link.refusals for link in self.links.values()),
                "requests_refused": self.requests_refused,
                "takeover_failures": sum(stats.takeover_failures for stats in self.stats.values())}


#: What an entry read back from the log may hold: any size (``--max-msg-size`` was checked when it came).
_READ_BACK = WireLimits(1 << 62)


def _takeable(item: list) -> bool:
    """Whether an entry read back from the log is one a message can be made of (entries were
    checked when they arrived; this catches a log written otherwise)."""
    try:
        check_entries(pack_entries([message_of(item)]), [item[0]], _READ_BACK)
    except (WireError, IndexError, TypeError, ValueError):
        return False
    return True


def _rank(topic: str, node: str) -> bytes:
    return hashlib.blake2b(f"{topic}\0{node}".encode(), digest_size=8).digest()


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
