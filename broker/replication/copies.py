"""The sending side of replication: what the core sees of it (:class:`~broker.core.host.Copies`).

A publish's messages go in one ADD to ``replicas - 1`` connected peers, chosen per topic by
rendezvous hashing (so a topic's copies from one node sit on the same peers while they live);
the publish is queued once every one of them answered, or refused (:class:`CopiesRefused`)
when too few are connected or answer within ``--replica-timeout`` (a publish that comes
before the node has found enough peers waits for them, within the same time). The peers
that did take a copy are then told to drop it.

Finishing: every FIN of a channel of a replicated topic is batched and posted to every peer
each :data:`FIN_INTERVAL` (:meth:`PeerCopies.run_fins`); a holder drops a copy once every
channel it knows of the topic finished it.

Where the copies are: :attr:`PeerCopies.placed` says, by topic, which peers took copies (and
about how many), so that those a gone peer held can be made again elsewhere (:mod:`.recopy`).
"""

from __future__ import annotations

import hashlib
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable

import trio

from broker.config.options import Options
from broker.core.host import CopiesRefused
from broker.core.message import Message
from broker.replication.links import PeerLink
from broker.replication.peers import Peers
from broker.replication.wire import Add, Drop, Fin, pack_entries

__all__ = ["PeerCopies", "ReplicaStats", "FIN_INTERVAL", "UNKNOWN"]

log = logging.getLogger("pynsqd.replication")

#: Seconds between two batches of FINs posted to the peers.
FIN_INTERVAL = 0.1
#: Where :attr:`PeerCopies.placed` counts copies that could not be made, or whose holders are
#: not known (not a node id: never reachable)
UNKNOWN = "?"


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
                 settle_refused: Callable[[str, list[bytes]], Awaitable[bool]] | None = None):
        self.options = options
        self._settle_refused = settle_refused
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

    def replicas(self, topic: str) -> int:
        return self.options.replicas

    async def store(self, topic: str, messages: list[Message], dones: list[list[str] | None] | None = None,
                    *, best_effort: bool = False) -> None:
        """Hold copies of ``messages`` on ``replicas - 1`` peers (see the module docstring);
        ``dones``: the channels that finished each already (a takeover's). ``best_effort``
        (a takeover's): as many as are connected, none refused."""
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
            return
        holders = (self.node_id, *(link.peer_id or "" for link in links))
        entries = pack_entries(messages, dones, published=dones is None)
        ids = [msg.id for msg in messages]
        add = Add(topic, holders, ids, entries)
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
            unsure = any(not waiter.done.is_set() for waiter in waiters)  # may have stored, unheard
            if unsure and self._settle_refused is not None and await self._settle_refused(topic, ids):
                return  # a holder took them over meanwhile: delivered there, so stored after all
            for link in links:  # those that answer late drop theirs too
                link.post(Drop(topic, ids))
            stats.publishes_refused += 1
            errors = sorted({waiter.error or "no answer" for waiter in waiters if waiter.error or not waiter.done.is_set()})
            log.warning("REPLICATION: publish to %s refused: %d of %d copies (%s)", topic, len(stored) + 1, need + 1,
                        ", ".join(errors))
            raise CopiesRefused(f"only {len(stored) + 1} of {need + 1} copies: {', '.join(errors)}")
        self.took(topic, [link.peer_id or "" for link in stored], len(messages), need - len(stored))

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

    def _holders_for(self, topic: str) -> list[PeerLink]:
        """The connected peers in the topic's rendezvous order."""
        return sorted(self._peers.connected(), key=lambda link: _rank(topic, link.peer_id or ""))

    def holders_for(self, topic: str) -> list[PeerLink]:
        """The connected peers in the topic's rendezvous order: where its copies go."""
        return self._holders_for(topic)

    async def run_fins(self) -> None:
        """Post the FINs batched since the last batch to every peer, each :data:`FIN_INTERVAL`."""
        while True:
            await trio.sleep(FIN_INTERVAL)
            fins, self._fins = self._fins, defaultdict(list)
            for (topic, channel), ids in fins.items():
                self._peers.post(Fin(topic, channel, ids), 17 * len(ids))

    # ---------------------------------------------------------------- stats

    def counters(self, topic: str) -> tuple[int, int, int, int, int, int]:
        stats = self.stats.get(topic) or ReplicaStats()
        return (self.replicas(topic), self._held_for_topic(topic), stats.copies_waiting, stats.takeovers,
                stats.publishes_refused, stats.copies_missing)

    def node_stats(self) -> dict:
        return self._node_stats()


def _rank(topic: str, node: str) -> bytes:
    return hashlib.blake2b(f"{topic}\0{node}".encode(), digest_size=8).digest()
