"""Taking over the copies of a node that is gone.

A node is gone once it has been unreachable for ``--replica-timeout`` (see
:mod:`.peers`). For each copy it left, the first of the copy's other holders that is up (in
the order the origin listed them) takes it over; holders agree on that order, so two
holders that see the same nodes never both take a copy. The taker gives the message a new
id (ids of different nodes may collide), stores copies of it on its own peers as for a
publish (keeping the channels that had finished it), tells every peer of the takeover and waits
until a majority of the cluster's members knows of it (within ``--replica-timeout``), queues
it in the channels that had not (creating the topic and those channels, which registers them
with nsqlookupd) and records the takeover. A peer told drops its copies and says the takeover
in its HELLO answers to the origin as its own (:mod:`.holder`): an origin that comes back
learns of it from any majority it reaches, the taker out of its reach or not. The publish keys of the copies go with
the new copies, and this node goes on knowing them until their window ends.

A message goes back to each channel as it stood there when its origin last said (an UPDATE,
see :mod:`.copies`): with its attempts (a delivery counted) and its due time (a REQ's delay),
so that ``--max-attempts`` and dead letters count on, and a deferral is not cut short. A
channel whose state differs from the message's entry gets its own copy of it; the taker's
peers are told those states as its own channels' (an UPDATE each, with the next batch of
FINs). A message no channel said anything of is taken as today, at no extra cost. When the
origin's channels are not known (it never said them), states are not used: the message goes
through the topic to every channel, as it comes in the entry.

An origin that comes back during a takeover (it reaches this node again) keeps what was not
queued here yet: the copies just stored on the peers for it are dropped, and the origin
delivers those messages itself. Its HELLO is answered once the takeover ended
(:meth:`Takeover.under_way`), so the answer says every message taken, and no takeover of it
starts while the connection that said HELLO lasts (it is reachable).

The copies of an origin are read back from the log in one pass for all its topics, and each
topic's are queued :data:`TAKEOVER_PIECE` at a time; a failure is its topic's alone (logged
once a minute while it lasts, counted, tried again at the next tick). Takeovers and the
log's compaction read the log through and change it: the replicator runs one at a time.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from broker.core.message import Message
from broker.replication.copies import PeerCopies
from broker.replication.held import HeldCopies
from broker.replication.links import PeerLink, Waiter
from broker.replication.peers import Peers
from broker.replication.wire import Drop, Taken, WireError, WireLimits, check_entries, message_of, pack_entries
from diskqueue import DiskQueueError

if TYPE_CHECKING:
    from broker.core.broker import Broker

__all__ = ["Takeover", "TAKEOVER_PIECE"]

log = logging.getLogger("pynsqd.replication")

#: Messages taken over in one step.
TAKEOVER_PIECE = 1000
#: Seconds between two log lines about the same topic's failing takeover.
TAKEOVER_FAILURE_LOG = 60.0
#: What an entry read back from the log may hold: any size (``--max-msg-size`` was checked when it came).
_READ_BACK = WireLimits(1 << 62)


class Takeover:
    """The takeovers of this node (``node_id``) for ``broker``, from the copies in ``held``."""

    def __init__(self, broker: Broker, node_id: str, peers: Peers, copies: PeerCopies, held: HeldCopies,
                 majority: Callable[[set[str]], bool] = lambda nodes: True):
        self.broker = broker
        self._majority = majority  # whether this node and those nodes are a majority of the cluster's members
        self.node_id = node_id
        self.options = broker.options
        self._peers = peers
        self._copies = copies
        self._held = held
        #: when each origin was first seen unreachable
        self.gone_since: dict[str, float] = {}
        #: topics whose takeover failed, and when that was last logged
        self._failed: dict[tuple[str, str], float] = {}
        #: the origins whose takeover is under way, each with an event set when it ends
        self._under_way: dict[str, trio.Event] = {}

    def wait_for(self, origins: list[str], since: float) -> None:
        """Each of ``origins`` must show itself within ``--replica-timeout`` of ``since`` (a start)."""
        for origin in origins:
            self.gone_since.setdefault(origin, since)

    def heard_from(self, node: str) -> None:
        self.gone_since.pop(node, None)

    def gone(self, now: float) -> list[str]:
        """The origins of copies held here that have been unreachable for ``--replica-timeout``."""
        found = []
        for origin in list(self._held.origins):
            if origin == self.node_id or self._peers.reachable(origin):
                self.gone_since.pop(origin, None)
                continue
            since = self.gone_since.get(origin)
            if since is None:
                # silence counts from the last bytes heard from it: a paused node is gone after
                # --replica-timeout without an answer, not after the heartbeats gave up on it and then some
                since = self.gone_since[origin] = min(now, self._peers.last_heard(origin, now))
            if now - since >= self.options.replica_timeout:
                found.append(origin)
        return found

    def mine(self, origin: str) -> dict[str, set[bytes]]:
        """The copies of ``origin`` this node takes over (it is their first holder up), by topic."""
        mine: dict[str, set[bytes]] = {}
        for topic, copies in self._held.origins.get(origin, {}).items():
            ids = {msg_id for msg_id, holders in copies.holders.items()
                   if self.first_up(holders, origin) == self.node_id}
            if ids:
                mine[topic] = ids
        return mine

    def first_up(self, holders: tuple[str, ...], origin: str) -> str | None:
        """The first of ``holders`` other than ``origin`` that is up (this node is)."""
        for node in holders:
            if node != origin and (node == self.node_id or self._peers.reachable(node)):
                return node
        return None

    def under_way(self, origin: str) -> trio.Event | None:
        """An event set once the takeover of ``origin`` under way ends (None: none is)."""
        return self._under_way.get(origin)

    async def take_over(self, origin: str, mine: dict[str, set[bytes]], *, gone: bool = True) -> None:
        """Take over the copies ``mine`` of ``origin`` (see the module docstring); ``gone``: it
        is gone, and the takeover stops if it comes back (False: it is back, and asked for it)."""
        if not mine or gone and self._peers.reachable(origin):
            return
        ended = self._under_way[origin] = trio.Event()
        try:
            await self._take_over(origin, mine, gone)
        finally:
            del self._under_way[origin]
            ended.set()

    async def _take_over(self, origin: str, mine: dict[str, set[bytes]], gone: bool) -> None:
        pieces: dict[str, list[list]] = defaultdict(list)
        found: dict[str, set[bytes]] = defaultdict(set)
        failed: set[str] = set()
        async for _origin, topic, item in self._held.entries({(origin, topic): ids for topic, ids in mine.items()}):
            found[topic].add(item[0])
            if topic in failed:
                continue
            pieces[topic].append(item)
            if len(pieces[topic]) >= TAKEOVER_PIECE:
                if not await self._piece_guarded(origin, topic, pieces.pop(topic), failed, gone):
                    return
        for topic, items in pieces.items():
            if not await self._piece_guarded(origin, topic, items, failed, gone):
                return
        for topic, ids in mine.items():
            if topic in failed:
                continue
            self._failed.pop((origin, topic), None)
            missing = ids - found[topic]
            if missing:  # held, yet not in the log (damaged): nothing to deliver
                self._held.copies_lost += len(missing)
                log.error("REPLICATION: %d copies of topic %s from node %s were not found in the replication log "
                          "(it is damaged): those messages are lost unless another node holds them", len(missing),
                          topic, origin)
                self._held.mark_taken(origin, topic, sorted(missing))

    async def _piece_guarded(self, origin: str, topic: str, items: list[list], failed: set[str], gone: bool) -> bool:
        """Take over one piece; False when the origin came back (the takeover stops)."""
        try:
            return await self._piece(origin, topic, items, gone)
        except (DiskQueueError, OSError, ValueError, LookupError, TypeError) as exc:
            failed.add(topic)
            now = trio.current_time()
            key = (origin, topic)
            if now - self._failed.get(key, -TAKEOVER_FAILURE_LOG) >= TAKEOVER_FAILURE_LOG:
                self._failed[key] = now
                self._copies.stats[topic].takeover_failures += 1
                log.error("REPLICATION: taking over messages of topic %s from node %s failed (tried again): %s",
                          topic, origin, exc)
            return True

    async def _piece(self, origin: str, topic: str, items: list[list], gone: bool = True) -> bool:
        held = self._held
        copies = held.copies(origin, topic)
        channels = list(held.channels.get(origin, {}).get(topic, []))
        items = [item for item in items if copies is not None and item[0] in copies.holders]
        ids = [item[0] for item in items]
        new_ids = self.broker.guid.next_ids(len(items))
        queued: list[tuple[Message, list[str] | None]] = []
        messages: list[Message] = []  # one per message taken, as its entry says it (for the peers)
        dones: list[list[str] | None] = []
        stated: list[tuple[str, Message]] = []  # a channel, and its own copy of a message (for the peers)
        stateful = copies is not None and bool(copies.state) and bool(channels)
        keys: list[bytes] = []  # the keys travel with the new copies (b"": none)
        expiries: list[int] = []
        for item, new_id in zip(items, new_ids):
            if not _takeable(item):
                held.copies_lost += 1
                log.error("REPLICATION: a copy of topic %s from node %s in the replication log cannot be read: lost "
                          "unless another node holds it", topic, origin)
                continue
            done = copies.done.get(item[0]) if copies is not None else None
            only = [name for name in channels if name not in done] if done and channels else None
            if only == []:
                continue
            message = message_of(item, new_id)
            states = copies.states_of(item[0]) if stateful and copies is not None else None
            if states:
                parts = _by_state(message, only if only is not None else channels, states, whole=only is None)
                message = parts[0][0]
                stated.extend((name, msg) for msg, names in parts[1:] for name in names or ())
                queued.extend(parts)
            else:
                queued.append((message, only))
            messages.append(message)
            dones.append(sorted(done) if done else None)
            key = held.key_of(origin, topic, item[0])
            keys.append(key[0] if key is not None else b"")
            expiries.append(key[1] if key is not None else 0)
        if gone and self._peers.reachable(origin):
            return False
        if messages:
            keyed = any(keys)
            await self._copies.store(topic, messages, dones, best_effort=True,
                                     keys=keys if keyed else None, expires=expiries if keyed else 0)
            if gone and self._peers.reachable(origin):  # back while the copies were stored: they are not needed
                new = [msg.id for msg in messages]
                self._peers.post(Drop(topic, new), 17 * len(new))
                log.info("REPLICATION: node %s is back: %d messages of topic %s not taken over", origin,
                         len(messages), topic)
                return False
            # a majority knows of the takeover before a message of it is delivered (see the module docstring)
            await self._tell(Taken(origin, topic, ids))
            for name, msg in stated:  # before the channels have them: what they report next is newer
                self._copies.requeued(topic, name, [msg])
            await self.broker.put_taken(topic, channels, queued)
        else:
            self._peers.post(Taken(origin, topic, ids), 17 * len(ids))
        held.mark_taken(origin, topic, ids)
        if self.options.durable:
            await held.synced()
        self._copies.stats[topic].takeovers += len(messages)
        now = trio.current_time()
        log.info("REPLICATION: took over %d messages of topic %s from node %s (gone for %.1fs)", len(messages),
                 topic, origin, now - self.gone_since.get(origin, now))
        return True

    async def _tell(self, taken: Taken) -> None:
        """Tell every peer of ``taken``, at least once (a peer out of reach is told when it is
        back); return once a majority of the cluster's members, this node among them, has
        answered that it knows, or after ``--replica-timeout`` (the takeover goes on)."""
        size = 17 * len(taken.ids)
        asked = self._peers.ask(taken, size)
        knowing: set[str] = set()
        enough = trio.Event()

        async def wait(link: PeerLink, waiter: Waiter) -> None:
            await waiter.done.wait()
            if waiter.error is None and link.peer_id not in (None, taken.origin):  # (the origin learns by HELLO)
                knowing.add(link.peer_id)
                if self._majority(knowing):
                    enough.set()

        if not self._majority(knowing):
            with trio.move_on_after(self.options.replica_timeout):
                async with trio.open_nursery() as nursery:
                    for link, waiter in asked:
                        nursery.start_soon(wait, link, waiter)
                    await enough.wait()
                    nursery.cancel_scope.cancel()
        for link, waiter in asked:
            if waiter.done.is_set() and waiter.error is not None:
                link.post(taken, size)  # lost with its connection: told again when it is back


def _by_state(message: Message, channels: list[str], states: dict[str, tuple[int, int]], *,
              whole: bool) -> list[tuple[Message, list[str] | None]]:
    """``message`` for each group of ``channels`` where it stood alike (``states``: its attempts
    and due time in the channels that said; the others as ``message`` is), the group's channels
    beside it; the message and None (every channel, through the topic) when they all stood alike
    and ``whole`` (no channel had finished it)."""
    entry = (message.attempts, message.due_ns)
    groups: dict[tuple[int, int], list[str]] = {}
    for name in channels:
        groups.setdefault(states.get(name, entry), []).append(name)
    parts: list[tuple[Message, list[str] | None]] = [
        (message if state == entry else
         Message(message.id, message.body, message.timestamp, state[0], state[1], message.priority), names)
        for state, names in groups.items()]
    if len(parts) == 1 and whole:
        return [(parts[0][0], None)]
    return parts


def _takeable(item: list) -> bool:
    """Whether an entry read back from the log is one a message can be made of (entries were
    checked when they arrived; this catches a log written otherwise)."""
    try:
        check_entries(pack_entries([message_of(item)]), [item[0]], _READ_BACK)
    except (WireError, IndexError, TypeError, ValueError):
        return False
    return True
