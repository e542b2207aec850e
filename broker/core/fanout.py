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

:class:`~broker.core.durability.fanout.DurableFanout` (``--durable``) moves
the topic's disk records instead and commits them once every channel's copy
is on stable storage; what a publisher must await before its ``OK`` is the
fan-out's ``wait_stored`` (None here: a publish is final once queued).
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

    def __init__(self, name: str, ready: SpillQueue, channels: dict[str, Channel], host: CoreHost):
        self.name = name
        self.ready = ready
        self.channels = channels
        self.host = host

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

    def move(self) -> bool:
        """Hand the next batch of the topic's messages to every channel; False if there was none."""
        batch = self.ready.take(PUMP_BATCH, REFILL_BATCH)
        if batch:
            self.deliver(batch)
        return bool(batch)

    def deliver(self, batch: list[Message]) -> None:
        """Give every channel ``batch``: the same messages to each; deferred ones wait in each channel."""
        channels = list(self.channels.values())
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

    def empty(self) -> None:
        """The topic's queue was emptied (``/topic/empty``)."""
