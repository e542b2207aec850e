"""The sending side of replication: what the core sees of it (:class:`~broker.core.host.Copies`).

A publish's messages go in one ADD to ``replicas - 1`` connected peers, chosen per topic by
rendezvous hashing (so a topic's copies from one node sit on the same peers while they live);
the publish is queued once every one of them answered, or refused (:class:`CopiesRefused`)
when too few are connected or answer within ``--replica-timeout`` (a publish that comes
before the node has found enough peers waits for them, within the same time). The peers
that did take a copy are then told to drop it.

Keys: a keyed publish's ADD carries the keys, which its holders remember until their dedup
window ends, and every connected peer is asked (KEYS, before the ADD in the same body for
the holders) which of them it knows: one round trip to each peer, at the same time as the
copies'. The keys this node or a peer knows are returned, and the publisher drops their
messages as duplicates (their copies too).

Finishing: every FIN of a channel of a replicated topic is batched and posted to every peer
each :data:`FIN_INTERVAL` (:meth:`PeerCopies.run_fins`); a holder drops a copy once every
channel it knows of the topic finished it.

Attempts and due times: what a channel puts back in its queue (REQ with or without a delay,
a timeout, a kick) is posted the same way, one UPDATE per channel each interval with every
such message's attempts and due time as they are then (the latest state of each; a message
finished within the interval is left out: its FIN says all). What it delivers is posted one
interval later, if it is not finished by then: most messages are finished within
milliseconds, and cost nothing more. A takeover then queues each message in each channel as
it stood there: a message in flight when this node died comes back with that delivery
counted, as a timeout here would have counted it (unless it was delivered in the last
0.1-0.2 s: then with the attempts it had before).

Delivering: what a channel of a replicated topic chose for a consumer is written once a
majority of the cluster answered that it hears this node (:meth:`PeerCopies.confirm`, see
:mod:`.confirm`).

Where the copies are: :attr:`PeerCopies.placed` says, by topic, which peers took copies (and
about how many), so that those a gone peer held can be made again elsewhere (:mod:`.recopy`).
"""

from __future__ import annotations

import hashlib
import logging
import operator
from collections import defaultdict
from collections.abc import Awaitable, Callable

import trio

from broker.config.options import Options
from broker.core.host import CopiesRefused
from broker.core.message import Message
from broker.protocol import MAX_ATTEMPTS
from broker.replication.answers import decode_keys_answer
from broker.replication.confirm import Confirms
from broker.replication.links import NOT_SENT, PeerLink, Waiter
from broker.replication.peers import Peers
from broker.replication.wire import Add, Drop, Fin, Keys, Update, WireError, pack_entries

__all__ = ["PeerCopies", "ReplicaStats", "FIN_INTERVAL", "UNKNOWN"]

log = logging.getLogger("pynsqd.replication")

#: Seconds between two batches of FINs posted to the peers.
FIN_INTERVAL = 0.1
#: Where :attr:`PeerCopies.placed` counts copies that could not be made, or whose holders are
#: not known (not a node id: never reachable)
UNKNOWN = "?"
_ID = operator.attrgetter("id")
_ATTEMPTS = operator.attrgetter("attempts")


class ReplicaStats:
    """One topic's replication counters, for ``/stats`` and ``/metrics``."""

    __slots__ = ("copies_waiting", "takeovers", "publishes_refused", "takeover_failures", "copies_missing")

    def __init__(self) -> None:
        self.copies_waiting = 0
        #: copies a gone peer held that are not made again elsewhere yet (see :mod:`.recopy`)
        self.copies_missing = 0
        self.takeovers = 0
        self.publishes_refused = 0
        self.takeover_failures = 0


class PeerCopies:
    """The :class:`~broker.core.host.Copies` of a replicating node, over ``peers``.

    ``held_for_topic`` and ``node_stats`` are the replicator's: how many copies of a topic this
    node holds for others, and the node's block of ``/stats``."""

    def __init__(self, options: Options, peers: Peers, held_for_topic: Callable[[str], int],
                 node_stats: Callable[[], dict],
                 settle_refused: Callable[[str, list[bytes], list[PeerLink]], Awaitable[bool]] | None = None,
                 known_keys: Callable[[str, list[bytes]], list[bytes]] | None = None,
                 forget_member: Callable[[str], bool] | None = None):
        self.options = options
        self._forget_member = forget_member
        self._settle_refused = settle_refused
        self._known_keys = known_keys
        self.node_id = ""  # this node's, once the replicator has read it
        self._peers = peers
        self._held_for_topic = held_for_topic
        self._node_stats = node_stats
        self.stats: dict[str, ReplicaStats] = defaultdict(ReplicaStats)
        self._fins: dict[tuple[str, str], list[bytes]] = defaultdict(list)
        #: topic -> peer -> copies of the topic's messages it took since start (or said it held)
        self.placed: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        #: topic -> what is told of its FINs while its copies are made again (see :mod:`.recopy`)
        self.watches: dict[str, Callable[[str, list[Message]], None]] = {}
        # (topic, channel) -> id -> what the next batch posts: (attempts, due) of the messages
        # requeued since the last batch, the attempts of those delivered since (and not requeued
        # after), and of those delivered before the last batch and not finished in it (ints only:
        # nothing the cyclic garbage collector has to walk)
        self._moved: dict[tuple[str, str], dict[bytes, tuple[int, int]]] = {}
        self._delivered: dict[tuple[str, str], dict[bytes, int]] = {}
        self._aged: dict[tuple[str, str], dict[bytes, int]] = {}
        self._own_replicas: dict[str, int] = {}  # the topics with a number of their own
        #: deliveries wait for a majority (made by the replicator once it knows the cluster)
        self.confirms: Confirms | None = None

    def replicas(self, topic: str) -> int:
        return self._own_replicas.get(topic, self.options.replicas)

    def configure(self, topic: str, replicas: int | None) -> None:
        if replicas is None:
            self._own_replicas.pop(topic, None)
        else:
            self._own_replicas[topic] = replicas

    async def store(self, topic: str, messages: list[Message], dones: list[list[str] | None] | None = None,
                    *, best_effort: bool = False, keys: list[bytes] | None = None,
                    expires: int | list[int] = 0) -> set[bytes]:
        """Hold copies of ``messages`` on ``replicas - 1`` peers (see the module docstring);
        ``dones``: the channels that finished each already (a takeover's). ``best_effort``
        (a takeover's): as many as are connected, none refused. ``keys`` (one per message,
        ``b""``: none) and ``expires`` (when their window ends): the holders remember them; a
        publish (not ``best_effort``) also asks every connected peer which it knows, and
        returns those this node or a peer knows (their messages are duplicates)."""
        asked = [key for key in keys if key] if keys is not None and not best_effort and expires else []
        known = set(self._known_keys(topic, asked)) if asked and self._known_keys is not None else set()
        need = self.replicas(topic) - 1
        deadline = trio.current_time() + self.options.replica_timeout
        links = self._holders_for(topic)[:need]
        if len(links) < need and not best_effort:  # a node just started, or a peer is reconnecting
            with trio.move_on_at(deadline):
                while len(links) < need:
                    await self._peers.wait_changed()
                    links = self._holders_for(topic)[:need]
        stats = self.stats[topic]
        if len(links) < need and not best_effort:
            stats.publishes_refused += 1
            raise CopiesRefused(f"only {len(links) + 1} of {need + 1} copies: "
                                f"{len(links)} of {len(self._peers.links)} peers connected")
        if not links:
            self.took(topic, [], len(messages), need)
            return known
        holders = (self.node_id, *(link.peer_id or "" for link in links))
        entries = pack_entries(messages, dones, published=dones is None)
        ids = [msg.id for msg in messages]
        add = Add(topic, holders, ids, entries, None, keys, expires) if keys is not None and expires else \
            Add(topic, holders, ids, entries)
        asking: list[Waiter] = []
        if asked:
            question = Keys(topic, asked)
            size = sum(map(len, asked))
            asking = [link.request(question, size, inline=link in links) for link in self._peers.connected()]
        waiters = [link.request(add, len(entries), inline=True) for link in links]
        for link in links:
            await link.flush()
        waiting = len(messages) * len(links)
        stats.copies_waiting += waiting
        try:
            with trio.move_on_at(deadline):
                for waiter in (*waiters, *asking):
                    await waiter.done.wait()
        finally:
            stats.copies_waiting -= waiting
        for answer in asking:  # a peer that did not answer in time knows nothing, as far as this publish goes
            if answer.done.is_set() and answer.error is None:
                try:
                    known |= decode_keys_answer(answer.extra, topic, asked)
                except WireError as exc:
                    log.warning("REPLICATION: a peer's answer to KEYS is not one: %s", exc)
        stored = [link for link, waiter in zip(links, waiters) if waiter.done.is_set() and waiter.error is None]
        if len(stored) < need and not best_effort:
            # every holder the ADD was sent to may have stored the copies (its answer may be lost
            # with its connection), and then may take them over: see .refused
            holding = [link for link, waiter in zip(links, waiters) if waiter.error != NOT_SENT]
            if holding and self._settle_refused is not None and await self._settle_refused(topic, ids, holding):
                return known  # a holder took them over meanwhile: delivered there, so stored after all
            for link in links:  # those that answer late drop theirs too
                link.post(Drop(topic, ids))
            stats.publishes_refused += 1
            errors = sorted({waiter.error or "no answer" for waiter in waiters if waiter.error or not waiter.done.is_set()})
            log.warning("REPLICATION: publish to %s refused: %d of %d copies (%s)", topic, len(stored) + 1, need + 1,
                        ", ".join(errors))
            raise CopiesRefused(f"only {len(stored) + 1} of {need + 1} copies: {', '.join(errors)}")
        self.took(topic, [link.peer_id or "" for link in stored], len(messages), need - len(stored))
        return known

    def took(self, topic: str, peers: list[str], count: int, short: int = 0) -> None:
        """``peers`` took copies of ``count`` messages of ``topic``; ``short`` copies fewer than
        the topic's replicas were made (a takeover's): the topic has copies missing."""
        placed = self.placed[topic]
        for peer in peers:
            placed[peer] += count
        if short > 0:
            placed[UNKNOWN] += count

    def abandon(self, topic: str, messages: list[Message]) -> None:
        self._peers.post(Drop(topic, [msg.id for msg in messages]))

    def finished(self, topic: str, channel: str, messages: list[Message]) -> None:
        self._fins[(topic, channel)].extend(m.id for m in messages)
        watch = self.watches.get(topic)
        if watch is not None:
            watch(channel, messages)

    def requeued(self, topic: str, channel: str, messages: list[Message]) -> None:
        """Posted with the next batch, the newest state of each id (a topic with replicas only)."""
        if self.replicas(topic) < 2:
            return
        key = (topic, channel)
        moved = self._moved.get(key)
        if moved is None:
            moved = self._moved[key] = {}
        delivered = self._delivered.get(key)
        for msg in messages:
            moved[msg.id] = (msg.attempts, msg.due_ns)
            if delivered:
                delivered.pop(msg.id, None)  # delivered, then requeued: the requeue is newer

    def confirm(self, topic: str, send: Callable[[], None], back: Callable[[], None]) -> None:
        assert self.confirms is not None, "the fence holds every replicated topic until the replicator runs"
        self.confirms.add(topic, send, back)

    def delivered(self, topic: str, channel: str, messages: list[Message]) -> None:
        """Posted with the batch after next (the attempt counted, due at once) unless finished by
        then (a topic with replicas only)."""
        if self.replicas(topic) < 2:
            return
        key = (topic, channel)
        delivered = self._delivered.get(key)
        if delivered is None:
            delivered = self._delivered[key] = {}
        delivered.update(zip(map(_ID, messages), map(_ATTEMPTS, messages)))

    def _holders_for(self, topic: str) -> list[PeerLink]:
        """The connected peers in the topic's rendezvous order."""
        return sorted(self._peers.connected(), key=lambda link: _rank(topic, link.peer_id or ""))

    def holders_for(self, topic: str) -> list[PeerLink]:
        """The connected peers in the topic's rendezvous order: where its copies go."""
        return self._holders_for(topic)

    async def run_fins(self) -> None:
        """Post the FINs batched since the last batch to every peer, each :data:`FIN_INTERVAL`,
        after the UPDATEs of the same batch."""
        while True:
            await trio.sleep(FIN_INTERVAL)
            fins, self._fins = self._fins, defaultdict(list)
            if self._moved or self._delivered or self._aged:  # before the FINs: a peer that applied them applied these
                self._post_updates(fins)
            for (topic, channel), ids in fins.items():
                self._peers.post(Fin(topic, channel, ids), 17 * len(ids))

    def _post_updates(self, fins: dict[tuple[str, str], list[bytes]]) -> None:
        """One UPDATE per channel with the state of what it requeued since the last batch, or
        delivered before it, and has not finished since (``fins``: this batch's); what it
        delivered since the last batch (and did not requeue before) waits for the next one."""
        moved, self._moved = self._moved, {}
        delivered, self._delivered = self._delivered, {}
        aged, self._aged = self._aged, {}
        finished = {key: set(ids) for key, ids in fins.items() if key in moved or key in delivered or key in aged}
        for key, tried in delivered.items():
            left = tried.keys() - finished.get(key, set())
            new = moved.get(key)
            if new:  # requeued, then delivered again (a requeue forgets an earlier delivery): posted now
                again = left & new.keys()
                for msg_id in again:
                    new[msg_id] = (tried[msg_id], 0)
                left -= again
            if left:
                self._aged[key] = {msg_id: tried[msg_id] for msg_id in left}
        for key in moved.keys() | aged.keys():
            done = finished.get(key, set())
            states: dict[bytes, tuple[int, int]] = {}
            old = aged.get(key)
            if old:
                states.update((msg_id, (old[msg_id], 0)) for msg_id in old.keys() - done)
            new = moved.get(key)
            if new:  # requeued since: newer
                states.update((msg_id, new[msg_id]) for msg_id in new.keys() - done)
            if states:
                topic, channel = key
                attempts = [min(max(state[0], 0), MAX_ATTEMPTS) for state in states.values()]
                dues = [max(state[1], 0) for state in states.values()]
                self._peers.post(Update(topic, channel, list(states), attempts, dues), 30 * len(states))

    # ---------------------------------------------------------------- stats

    def counters(self, topic: str) -> tuple[int, int, int, int, int, int]:
        stats = self.stats.get(topic) or ReplicaStats()
        return (self.replicas(topic), self._held_for_topic(topic), stats.copies_waiting, stats.takeovers,
                stats.publishes_refused, stats.copies_missing)

    def node_stats(self) -> dict:
        return self._node_stats()

    def forget_member(self, node: str) -> bool:
        return self._forget_member is not None and self._forget_member(node)


def _rank(topic: str, node: str) -> bytes:
    return hashlib.blake2b(f"{topic}\0{node}".encode(), digest_size=8).digest()
