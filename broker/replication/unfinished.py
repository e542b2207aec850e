"""The messages of one of this node's topics that some channel has not finished, read without
moving anything: what :mod:`.recopy` makes copies of again.

They are in the topic's own queue (memory, then its disk queue: every channel is still to get
them) and in each channel: ready (memory and disk queue), in flight, deferred and buried.
:func:`batches` hands them over a batch at a time, each with the *mask* of the channels it was
found in (bit ``i``: the ``i``-th of the channel names it is given; :data:`EVERY`: the topic's
queue). A disk queue is scanned (:meth:`~diskqueue.DiskQueue.scan`) :data:`SCAN_BATCH` records
at a time with other tasks running between batches, before the channel's memory, in-flight,
deferred and buried messages are looked at in one synchronous step. Messages another node took
over (the topic's ``taken``) are left out.

Clients keep working meanwhile, so a message that moves while it is looked for (read from disk
into memory, say) may be seen twice or, rarely, not at all: a caller that must find every one
looks again for those it did not find.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING

import trio

from broker.core.message import Message, decode_all
from broker.core.spill import SpillQueue

if TYPE_CHECKING:
    from broker.core.topic import Topic

__all__ = ["EVERY", "SCAN_BATCH", "batches", "estimate"]

log = logging.getLogger("pynsqd.replication")

#: The mask of a message found in the topic's own queue: every channel is still to get it.
EVERY = -1
#: Messages handed over in one batch at most (other tasks run between batches).
SCAN_BATCH = 1024


def estimate(topic: Topic) -> int:
    """About how many unfinished messages ``topic`` holds, from its counters alone: its own
    queue and its fullest channel (channels mostly hold the same messages)."""
    fullest = max((channel.depth + len(channel.in_flight) + len(channel.deferred) + len(channel.buried)
                   for channel in topic.channels.values()), default=0)
    return topic.depth + fullest


async def batches(topic: Topic, channels: list[str]) -> AsyncIterator[tuple[list[Message], int]]:
    """The unfinished messages of ``topic`` (see the module docstring), a batch at a time, each
    batch with the mask of the channels it was found in (bit ``i``: ``channels[i]``)."""
    taken = topic.taken
    async for found in _queue(topic.ready, topic.name, ()):
        yield _kept(found, taken), EVERY
    for index, name in enumerate(channels):
        channel = topic.channels.get(name)
        if channel is None:
            continue
        # one step, once its disk is scanned: what is in memory, in flight, deferred and buried now
        async for found in _queue(channel.ready, channel.where, (
                channel.in_flight.values(), channel.deferred.values(), channel.buried.messages.values())):
            yield _kept(found, taken), 1 << index


async def _queue(queue: SpillQueue, where: str, others: Iterable[Iterable[Message]]) -> AsyncIterator[list[Message]]:
    """A queue's messages on disk, a batch at a time, then those in its memory and in ``others``."""
    backend = queue.backend
    if backend is not None and backend.depth:
        for records in backend.scan(SCAN_BATCH):
            yield decode_all(records, log, where)
            await trio.lowlevel.checkpoint()
    now = list(queue.memory)
    for more in others:
        now.extend(more)
    for start in range(0, len(now), SCAN_BATCH):
        if start:
            await trio.lowlevel.checkpoint()
        yield now[start:start + SCAN_BATCH]


def _kept(found: list[Message], taken: set[bytes] | None) -> list[Message]:
    return [msg for msg in found if msg.id not in taken] if taken else found
