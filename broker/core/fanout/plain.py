"""How a topic's messages reach its channels: the topic's *fan-out*, chosen once when it is created.

:class:`Fanout` (memory spilling to disk; ephemeral topics): the topic's pump
takes a batch of ready messages from the topic's queue and hands the *same*
batch to every channel. A message is one object whatever the channel count: a
channel takes its own copy only when it delivers the message (see
:class:`~broker.core.message.Message`), and a batch that spills is encoded and
framed for disk once for every channel that spills it
(:class:`~broker.core.spill.SharedBatch`). So a fan-out costs a channel a
reference per message (a C-level list extend) and, once its memory is full,
one write of the batch's records: the cost of a message grows with its
channels by a few nanoseconds each, not by an object and an encoding each.
Deferred messages are rare and are copied per channel as they arrive.

:class:`~broker.core.fanout.durable.DurableFanout` (``--durable``) moves
the topic's disk records instead and commits them once every channel's copy
is on stable storage; what a publisher must await before its ``OK`` is the
fan-out's ``wait_stored`` (None here: a publish is final once queued).

**Holding.** While a topic has two or more channels and none of them has a
subscriber (and none is ephemeral), a copy per channel would only be written
to each channel's disk to wait there, so the plain fan-out *holds* instead:
the messages wait once, in the topic's own queue (memory, then its disk
queue), as if the channels shared one log whose read position they all have
in common. They belong to the channels already: ``held`` counts them (the
front of the topic's queue), ``/stats`` and ``/metrics`` show them in every
channel's depth and not in the topic's, and a channel created or emptied
meanwhile *skips* the ones it must not get. As soon as one channel has a
subscriber the pump hands everything over as before, and a channel nobody
reads then keeps its own copy (spilling to its own disk queue): holding saves
the copies only while the channels agree. A topic with one channel never
holds (its one copy goes where it always went), nor does a durable topic.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from broker.core.channel import Channel
from broker.core.host import CoreHost
from broker.core.message import Message
from broker.core.spill import REFILL_BATCH, SharedBatch, SpillQueue
from diskqueue import DiskQueueError

__all__ = ["Fanout", "PUMP_BATCH"]

log = logging.getLogger("pynsqd.topic")

#: Messages the pump moves before it lets other tasks run.
PUMP_BATCH = 4096


class Fanout:
    """The plain fan-out of the topic ``name``: ``ready`` is the topic's queue, ``channels``
    its (live) dict of channels."""

    #: what a publisher awaits before its answer (None: nothing)
    wait_stored: Callable[[], Awaitable[None]] | None = None
    #: whether this kind of fan-out may hold messages for its channels (see the module docstring)
    may_hold = True

    def __init__(self, name: str, ready: SpillQueue, channels: dict[str, Channel], host: CoreHost):
        self.name = name
        self.ready = ready
        self.channels = channels
        self.host = host
        self.may_hold = self.may_hold and ready.backend is not None
        #: messages at the front of the topic's queue that belong to the channels already
        self.held = 0
        # channel name -> how many of the held messages that channel does not get
        self._skips: dict[str, int] = {}

    def start(self, nursery: trio.Nursery) -> None:
        """Start the fan-out's own tasks in the topic's nursery (none here)."""

    def blocked(self) -> bool:
        """Whether the pump must wait before it moves more: a channel holds more in memory
        than it may because its disk refused a spill.

        Each such channel tries its spill again; while one still cannot, the topic
        keeps its messages (a topic that must spill and cannot refuses publishes),
        so memory stays bounded whatever the disk does.
        """
        full = [c.ready for c in self.channels.values() if c.ready.over_limit]
        return bool(full) and not all([ready.spill_excess() for ready in full])

    # ---------------------------------------------------------------- holding

    def holding(self) -> bool:
        """Whether the messages the channels own stay in the topic's queue for now."""
        channels = self.channels
        # stops at the first channel that is read: with many channels, what is usual costs one look
        return (self.may_hold and len(channels) > 1
                and not any(c.wants_messages or c.ephemeral for c in channels.values()))

    def published(self, count: int, paused: bool) -> None:
        """``count`` messages were queued at the topic: the channels own them unless the topic is paused."""
        if self.may_hold and self.channels and not paused:
            self.held += count

    def unpaused(self) -> None:
        """Everything queued at the topic now belongs to its channels."""
        if self.may_hold and self.channels:
            self.held = self.ready.depth

    def channel_added(self, name: str, paused: bool) -> None:
        """A channel was created: the first takes everything queued (unless paused); a later one
        skips what the others own already."""
        if not self.may_hold:
            return
        if len(self.channels) == 1:
            self.held = 0 if paused else self.ready.depth
        elif self.held:
            self._skips[name] = self.held

    def channel_removed(self, name: str) -> None:
        """A channel was deleted: with the last one goes what the channels owned."""
        self._skips.pop(name, None)
        if not self.channels and self.held:
            if self.held >= self.ready.depth:
                self.ready.empty()
            else:
                self._take_front(self.held)
            self.held = 0

    def channel_emptied(self, name: str) -> None:
        """``/channel/empty``: the channel skips everything held for it."""
        if self.held:
            self._skips[name] = self.held

    def held_for(self, name: str) -> tuple[int, int]:
        """What the topic holds for the channel ``name``: messages, and how many of them are on disk."""
        held = self.held
        if not held:
            return 0, 0
        skip = self._skips.get(name, 0)
        in_memory = len(self.ready.memory)
        return held - skip, max(0, held - max(skip, in_memory))

    def peek_held(self, name: str, n: int) -> list[Message]:
        """The first ``n`` messages held for the channel ``name``, in order, unchanged."""
        skip = self._skips.get(name, 0)
        n = min(n, self.held - skip)
        return self.ready.peek(skip + n)[skip:] if n > 0 else []

    def _take_front(self, count: int) -> list[Message]:
        """Take the first ``count`` messages of the topic's queue (fewer if it holds fewer)."""
        taken: list[Message] = []
        while len(taken) < count:
            batch = self.ready.take(count - len(taken), count - len(taken))
            if not batch:
                break
            taken.extend(batch)
        return taken

    # ---------------------------------------------------------------- moving

    def move(self, paused: bool = False) -> bool:
        """Hand the next batch of the topic's messages to every channel; False if there was none.

        While the topic is paused only what the channels own moves.
        """
        if paused:
            if not self.held:
                return False
            batch = self.ready.take(min(PUMP_BATCH, self.held), min(REFILL_BATCH, self.held))
        else:
            batch = self.ready.take(PUMP_BATCH, REFILL_BATCH)
        if not batch:
            return False
        if self.held:  # (unreadable records skipped on disk count as taken)
            self.held = min(max(0, self.held - len(batch)), self.ready.depth)
        if self._skips:
            self._deliver_skipping(batch)
        else:
            self.deliver(batch)
        return True

    def _deliver_skipping(self, batch: list[Message]) -> None:
        """Deliver ``batch`` to every channel but a skipping one's share of it."""
        skips = self._skips
        taken = len(batch)
        for msg in batch:  # some channels get part of it: every message may be held by several
            msg.shared = True
        everyone = []
        for name, channel in self.channels.items():
            skip = skips.pop(name, 0)
            if not skip:
                everyone.append(channel)
            elif skip >= taken:
                if skip > taken:
                    skips[name] = skip - taken
            else:
                rest = batch[skip:]
                channel.put_many([m for m in rest if not m.due_ns])
                for msg in rest:
                    if msg.due_ns:
                        channel.put_deferred(msg.copy())
        self.deliver(batch, everyone)

    def deliver(self, batch: list[Message], channels: list[Channel] | None = None) -> None:
        """Give every channel (or ``channels``) ``batch``: the same messages to each; deferred ones
        wait in each channel."""
        if channels is None:
            channels = list(self.channels.values())
        if not channels:
            return
        ready = [m for m in batch if not m.due_ns]
        deferred = [m for m in batch if m.due_ns] if len(ready) != len(batch) else []
        if len(channels) == 1:
            [channel] = channels
            if ready:
                channel.put_many(ready)
            for msg in deferred:
                channel.put_deferred(msg)
            return
        if ready:
            for msg in ready:
                msg.shared = True
            shared = SharedBatch(ready)
            for channel in channels:
                channel.put_many(ready, shared)
        for msg in deferred:
            for channel in channels:
                channel.put_deferred(msg.copy())

    def settle(self) -> int:
        """Shutdown, once the channels are closed: write what the topic holds in memory to its
        queue; returns how many messages could not be written (logged)."""
        backend = self.ready.backend
        records = self.ready.records()
        if backend is None or not records:
            return 0
        try:
            backend.put_many(records)
        except DiskQueueError as exc:
            log.error("topic %s: %d messages could not be written to disk: %s", self.name, len(records), exc)
            return len(records)
        return 0

    def settle_skips(self, paused: bool) -> None:
        """Shutdown, before the channels close: hand over what a channel skips (and, if the topic
        is paused, all it holds for them), so that what the topic's queue keeps for the next start
        is what every channel gets from it then (skips are not written to disk)."""
        while (self._skips or paused) and self.held:
            if not self.move(paused=True):
                break
        self._skips.clear()

    def empty(self) -> None:
        """``/topic/empty``: drop what the topic holds of its own; what it holds for its channels stays."""
        ready = self.ready
        held = self.held
        if not held:
            ready.empty()
            return
        if held >= ready.depth:
            return
        keep = self._take_front(held)
        ready.empty()
        ready.put(keep)
