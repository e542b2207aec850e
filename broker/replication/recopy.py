"""Copies made again: when a peer that holds copies of this node's messages is gone, every
unfinished message of the topics it held copies of gets a new copy on another peer, so that each
message has ``--replicas`` nodes again before this node may be lost too.

**Where the copies are.** :attr:`PeerCopies.placed <.copies.PeerCopies.placed>` counts, by topic,
the copies each peer took since start, and a peer's HELLO answer says how many it holds for this
node, by topic (a restart loses nothing of it but the peers that do not come back). A topic
counts copies at :data:`~.copies.UNKNOWN` when a takeover made fewer than its replicas, and,
``--replica-timeout`` after start, when its known holders hold fewer copies of it than its
unfinished messages call for (a holder that did not come back while this node was down).

**When.** A peer of ``placed`` unreachable for ``--replica-timeout`` (as a node is gone for a
takeover; no majority is asked: making a copy takes nothing from anyone), or ``UNKNOWN``, makes
its topics' copies *missing*. Restores run in the background, one topic at a time, a piece of
:data:`RECOPY_PIECE` messages at a time, each piece's ADD answered before the next is sent (a
publish to the same peer waits at most for one piece):

1. the topic's unfinished messages are counted, with the channels each is in (:mod:`.unfinished`),
   and its FINs watched from then on (``PeerCopies.watches``);
2. for each piece, the peers of ``placed`` that are up are asked which of its copies they hold
   (HOLDS); a message held by fewer than ``replicas - 1`` of them gets new copies on the next
   peers of the topic's rendezvous order (the gone left out), in an ADD whose holders are this
   node, then the peers up that hold it, then the new ones, and whose entries name the channels
   that finished it (those it is not in, and those that finished it since it was counted: a FIN
   that comes later is sent after the ADD);
3. the peers up that hold it are told its holders (HOLDS with holders), so that every holder
   agrees which is the first one up should this node go too (:mod:`.takeover`);
4. the gone peer is told to drop its copies (DROP, posted: delivered if it comes back). Kept, a
   returning peer would be a second first holder up after this node's loss (its copies list it
   first), and would keep them for ever.

A message not found again (finished meanwhile, or moving while it was looked for) is looked for
in :data:`RECOPY_PASSES` passes in all, then taken for finished. A piece that fails (a peer does
not answer) is tried again after :data:`RETRY_INTERVAL`; a message no peer can take stays missing
until the connected peers change. A gone peer that comes back ends the restore: it holds what was
not made again yet. ``copies_missing`` counts what is missing, per topic (an estimate from the
topic's counters until its restore has counted its messages), for ``/stats`` and ``/metrics``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

import trio

from broker.core.message import Message
from broker.replication.answers import decode_holds_answer
from broker.replication.copies import UNKNOWN, PeerCopies
from broker.replication.links import PeerLink, Waiter
from broker.replication.notice import Notices
from broker.replication.peers import Peers
from broker.replication.unfinished import EVERY, batches, estimate
from broker.replication.wire import Add, Drop, Holds, WireError, pack_entries

if TYPE_CHECKING:
    from broker.core.broker import Broker
    from broker.core.topic import Topic

__all__ = ["Recopy", "RECOPY_PIECE", "RECOPY_PASSES", "RECOPY_INTERVAL", "RETRY_INTERVAL"]

log = logging.getLogger("pynsqd.replication")

#: Messages copied again in one step.
RECOPY_PIECE = 1000
#: Passes over a topic's messages that look for those counted at the start of its restore.
RECOPY_PASSES = 3
#: Seconds between two looks for peers gone.
RECOPY_INTERVAL = 0.25
#: Seconds before a restore that failed is tried again.
RETRY_INTERVAL = 1.0


class _Later(Exception):
    """A piece could not be copied now (a peer did not answer, or is not linked): tried again later."""


class _Back(Exception):
    """A gone peer came back: it holds its copies again."""


class Recopy:
    """The restores of the copies of this node's (``node_id``) messages, for ``broker``'s topics
    (see the module docstring); owned by the replicator, which runs :meth:`run`."""

    def __init__(self, broker: Broker, node_id: str, peers: Peers, copies: PeerCopies):
        self.broker = broker
        self.node_id = node_id
        self._peers = peers
        self._copies = copies
        #: when each peer holding copies was first seen unreachable
        self.gone_since: dict[str, float] = {}
        #: copies made again since start
        self.restored = 0
        self._started = trio.current_time()
        self._start_checked = False
        self._left: dict[str, int] = {}  # topic -> messages its last restore left missing
        self._retry_at: dict[str, float] = {}  # topic -> when a failed restore is tried again
        self._short: dict[str, frozenset[str]] = {}  # topic -> the peers connected when none could take a copy
        self._notices = Notices(log)

    # ---------------------------------------------------------------- what peers hold

    def heard(self, peer: str, holding: dict[str, int]) -> None:
        """``peer`` answered HELLO: it holds ``holding`` copies of this node's messages, by topic."""
        placed = self._copies.placed
        for topic, counts in placed.items():
            if peer in counts and topic not in holding:
                del counts[peer]
        for topic, count in holding.items():
            placed[topic][peer] = count
        self.gone_since.pop(peer, None)

    def gone(self, now: float) -> set[str]:
        """The peers holding copies of this node's messages that have been unreachable for
        ``--replica-timeout``, counted from the last bytes heard from them."""
        holders = {peer for counts in self._copies.placed.values() for peer in counts if peer != UNKNOWN}
        found = set()
        for peer in holders:
            if self._peers.reachable(peer):
                self.gone_since.pop(peer, None)
                continue
            since = self.gone_since.get(peer)
            if since is None:
                since = self.gone_since[peer] = min(now, self._peers.last_heard(peer, now))
            if now - since >= self._copies.options.replica_timeout:
                found.add(peer)
        for peer in [peer for peer in self.gone_since if peer not in holders]:
            del self.gone_since[peer]
        return found

    def missing(self) -> dict[str, set[str]]:
        """The topics with copies missing, and the peers (or :data:`UNKNOWN`) that held them."""
        gone = self.gone(trio.current_time())
        due = {}
        for topic, counts in self._copies.placed.items():
            lost = {peer for peer in counts if peer == UNKNOWN or peer in gone}
            if lost:
                due[topic] = lost
        return due

    # ---------------------------------------------------------------- the loop

    async def run(self) -> None:
        """Restore what is missing, every :data:`RECOPY_INTERVAL`, until cancelled."""
        while True:
            await trio.sleep(RECOPY_INTERVAL)
            try:
                await self.tick()
            except Exception as exc:  # tried again at the next tick; nothing is lost meanwhile
                log.error("REPLICATION: making copies again failed: %s", exc, exc_info=exc)
                await trio.sleep(RETRY_INTERVAL)

    async def tick(self) -> None:
        """Count what is missing, and restore each topic that can be, one after the other."""
        copies = self._copies
        now = trio.current_time()
        if not self._start_checked and now - self._started >= copies.options.replica_timeout:
            self._start_checked = True
            self._check_start()
        due = self.missing()
        for name, stats in copies.stats.items():
            if name not in due:
                stats.copies_missing = 0
                self._left.pop(name, None)
        for name, lost in list(due.items()):
            topic = self.broker.topics.get(name)
            if topic is None:  # deleted: nothing of it is left to copy
                self._forget(name, lost)
                del due[name]
                continue
            left = self._left.get(name)
            copies.stats[name].copies_missing = (estimate(topic) if left is None else left) * self._per(name, lost)
        for name, lost in due.items():
            if now < self._retry_at.get(name, now) or self._short.get(name) == self._connected():
                continue
            await self.restore(name, lost)

    def _check_start(self) -> None:
        """``--replica-timeout`` after start: a topic whose known holders (those that said so in
        HELLO, or took copies since) hold fewer copies than its unfinished messages call for lost
        a holder while this node was down."""
        copies = self._copies
        for name, topic in list(self.broker.topics.items()):
            need = copies.replicas(name) - 1
            count = estimate(topic)
            if need < 1 or not count:
                continue
            counts = copies.placed[name]
            held = sum(n for peer, n in counts.items() if peer != UNKNOWN)
            if held < need * count:
                counts[UNKNOWN] += count
                log.warning("REPLICATION: the peers hold %d copies of topic %s, whose %d messages need %d: "
                            "copies are made again", held, name, count, need * count)

    # ---------------------------------------------------------------- one topic

    async def restore(self, name: str, lost: set[str]) -> None:
        """Make again the copies of topic ``name``'s unfinished messages that ``lost`` held (see the
        module docstring)."""
        topic = self.broker.topics.get(name)
        if topic is None or topic.exiting:
            return
        if not self._candidates(name, lost):  # counted missing; tried again once another peer connects
            self._short[name] = self._connected()
            return
        self._short.pop(name, None)
        copies = self._copies
        channels = sorted(topic.channels)
        pending: dict[bytes, int] = {}  # id -> the mask of the channels it was found in
        fins: dict[bytes, set[str]] = {}  # id -> channels that finished it since

        def watch(channel: str, messages: list[Message]) -> None:
            for msg in messages:
                if msg.id in pending:
                    fins.setdefault(msg.id, set()).add(channel)

        copies.watches[name] = watch
        started = trio.current_time()
        made = self.restored
        unknown = copies.placed.get(name, {}).get(UNKNOWN, 0)  # a takeover may add more meanwhile
        short: set[bytes] = set()
        try:
            async for found, mask in batches(topic, channels):
                for msg in found:
                    pending[msg.id] = pending.get(msg.id, 0) | mask
            counted = len(pending)
            self._set_left(name, lost, len(pending))
            log.info("REPLICATION: %s, holding copies of topic %s, gone: making %d messages' copies again",
                     _names(lost), name, counted)
            for _ in range(RECOPY_PASSES):
                piece: dict[bytes, Message] = {}
                async for found, _mask in batches(topic, channels):
                    for msg in found:
                        if msg.id in pending and msg.id not in short:
                            piece.setdefault(msg.id, msg)
                            if len(piece) >= RECOPY_PIECE:
                                short |= await self._piece(name, topic, lost, piece, pending, fins, channels)
                                piece = {}
                if piece:
                    short |= await self._piece(name, topic, lost, piece, pending, fins, channels)
                if len(pending) <= len(short):
                    break
        except _Later as exc:
            self._retry_at[name] = trio.current_time() + RETRY_INTERVAL
            self._left[name] = len(pending)
            self._notices.warn(("later", name), "REPLICATION: making copies of topic %s again paused (tried again): "
                               "%s", name, exc)
            return
        except _Back:
            return
        finally:
            if copies.watches.get(name) is watch:
                del copies.watches[name]
        unfound = len(pending) - len(short)
        if short:
            self._short[name] = self._connected()
            self._set_left(name, lost, len(short))
            log.warning("REPLICATION: %d messages of topic %s have fewer than %d copies: no other peer can take one "
                        "(tried again when one connects)", len(short), name, copies.replicas(name))
            return
        self._forget(name, lost, unknown)
        log.info("REPLICATION: made %d copies of topic %s again in %.1fs, for %d messages (%d not found again: "
                 "finished meanwhile)", self.restored - made, name, trio.current_time() - started, counted, unfound)

    async def _piece(self, name: str, topic: Topic, lost: set[str], piece: dict[bytes, Message],
                     pending: dict[bytes, int], fins: dict[bytes, set[str]], channels: list[str]) -> set[bytes]:
        """Copy the messages of ``piece`` again where they have too few copies (see the module
        docstring); the ids of those no peer could take. Raises :class:`_Later`, :class:`_Back`."""
        copies = self._copies
        if topic.exiting:
            raise _Later("the topic is deleted")
        if any(peer != UNKNOWN and self._peers.reachable(peer) for peer in lost):
            raise _Back()
        ids = list(piece)
        counts = copies.placed.get(name, {})
        ranked = copies.holders_for(name)
        live = [link for link in ranked if link.peer_id in counts and link.peer_id not in lost]
        unlinked = set(counts) - lost - {UNKNOWN} - {link.peer_id for link in live}
        if unlinked:
            raise _Later(f"{_names(unlinked)} holding copies of the topic not linked now")
        holding: dict[bytes, list[str]] = {msg_id: [] for msg_id in ids}
        for link in live:
            answer = await self._ask(link, Holds(name, ids))
            for msg_id, held in zip(ids, answer):
                if held:
                    holding[msg_id].append(link.peer_id or "")
        # from here until the ADDs are queued no other task runs: a FIN that comes later is sent after them
        need = copies.replicas(name) - 1
        candidates = [link for link in copies.holders_for(name) if link.peer_id not in lost]
        current = list(topic.channels)
        bits = {channel: 1 << index for index, channel in enumerate(channels)}
        adds: dict[tuple[str, ...], tuple[list[PeerLink], list[Message], list[list[str] | None]]] = {}
        relists: dict[tuple[tuple[str, ...], tuple[str, ...]], list[bytes]] = {}  # (holders, those up) -> ids
        short: set[bytes] = set()
        settled: list[bytes] = []  # finished, or held by enough peers once the ADDs are answered
        complete: list[bytes] = []
        for msg_id, msg in piece.items():
            mask = pending[msg_id]
            done = set(fins.get(msg_id, ()))
            if mask != EVERY:
                done.update(channel for channel in current if not mask & bits.get(channel, 0))
                if done.issuperset(current):
                    settled.append(msg_id)  # finished by every channel meanwhile
                    continue
            have = holding[msg_id]
            new = [link for link in candidates if link.peer_id not in have][:max(0, need - len(have))]
            if len(have) + len(new) < need:
                short.add(msg_id)
            holders = (self.node_id, *have, *(link.peer_id or "" for link in new))
            if new:
                links, msgs, dones = adds.setdefault(holders, (new, [], []))
                msgs.append(msg)
                dones.append(sorted(done) or None)
            if msg_id not in short:
                settled.append(msg_id)
                complete.append(msg_id)
                if have:
                    relists.setdefault((holders, tuple(have)), []).append(msg_id)
        waiters: list[tuple[PeerLink, int, Waiter]] = []
        for holders, (links, msgs, dones) in adds.items():
            entries = pack_entries(msgs, dones if any(dones) else None)
            add = Add(name, holders, [msg.id for msg in msgs], entries)
            waiters.extend((link, len(msgs), link.request(add, len(entries), inline=True)) for link in links)
        for link in {link for link, _, _ in waiters}:
            await link.flush()
        with trio.move_on_after(copies.options.replica_timeout):
            for _link, _count, waiter in waiters:
                await waiter.done.wait()
        for link, count, waiter in waiters:
            if waiter.error is None and waiter.done.is_set():
                copies.took(name, [link.peer_id or ""], count)
                self.restored += count
        failed = [f"{link.peer_id}: {waiter.error or 'no answer'}" for link, _, waiter in waiters
                  if waiter.error is not None or not waiter.done.is_set()]
        if failed:
            raise _Later(f"copies not stored ({', '.join(sorted(set(failed)))})")
        by_peer = {link.peer_id: link for link in live}
        for (holders, up), relisted in relists.items():
            for peer in up:
                await self._ask(by_peer[peer], Holds(name, relisted, holders))
        if complete:
            for link in self._links_of(lost):
                link.post(Drop(name, complete), 17 * len(complete))
        for msg_id in settled:
            del pending[msg_id]
            fins.pop(msg_id, None)
        self._set_left(name, lost, len(pending))
        return short

    async def _ask(self, link: PeerLink, request: Holds) -> list[bool]:
        """HOLDS's answer from ``link``'s peer; raises :class:`_Later` when there is none."""
        waiter = link.request(request, 17 * len(request.ids))
        with trio.move_on_after(self._copies.options.replica_timeout):
            await waiter.done.wait()
        if waiter.error is not None or not waiter.done.is_set():
            raise _Later(f"node {link.peer_id} did not say which copies it holds: {waiter.error or 'no answer'}")
        try:
            return decode_holds_answer(waiter.extra, len(request.ids))
        except WireError as exc:
            raise _Later(f"node {link.peer_id} said which copies it holds wrongly: {exc}") from exc

    # ---------------------------------------------------------------- helpers

    def _candidates(self, name: str, lost: set[str]) -> list[PeerLink]:
        return [link for link in self._copies.holders_for(name) if link.peer_id not in lost]

    def _connected(self) -> frozenset[str]:
        return frozenset(link.peer_id or "" for link in self._peers.connected())

    def _links_of(self, peers: Iterable[str]) -> list[PeerLink]:
        wanted = set(peers)
        return [link for link in self._peers.links.values() if link.peer_id in wanted]

    def _per(self, name: str, lost: set[str]) -> int:
        """Copies missing per message: one per peer lost, at most the copies a message has."""
        return min(len(lost), self._copies.replicas(name) - 1)

    def _set_left(self, name: str, lost: set[str], left: int) -> None:
        self._left[name] = left
        self._copies.stats[name].copies_missing = left * self._per(name, lost)

    def _forget(self, name: str, lost: set[str], unknown: int | None = None) -> None:
        """The copies of topic ``name`` that ``lost`` held are made again (or the topic is gone);
        ``unknown``: of those counted at :data:`UNKNOWN`, how many (None: all)."""
        counts = self._copies.placed.get(name)
        if counts is not None:
            for peer in lost:
                if peer == UNKNOWN and unknown is not None and counts.get(peer, 0) > unknown:
                    counts[peer] -= unknown
                else:
                    counts.pop(peer, None)
            if not counts:
                del self._copies.placed[name]
        self._left.pop(name, None)
        self._retry_at.pop(name, None)
        self._short.pop(name, None)
        stats = self._copies.stats.get(name)
        if stats is not None:
            stats.copies_missing = 0


def _names(peers: Iterable[str]) -> str:
    names = sorted("an unknown holder" if peer == UNKNOWN else f"node {peer}" for peer in peers)
    return ", ".join(names)
