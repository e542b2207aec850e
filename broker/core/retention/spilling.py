"""Memory spilling to disk (the default retention of a channel).

Ready messages spill to the channel's disk queue (a failed write keeps them in
memory and reports the disk error); the buried set is mirrored in a store; at
shutdown memory and in-flight messages are appended to the queue and deferred
ones stashed for the next start.
"""

from __future__ import annotations

from broker.core.deferred import Deferred
from broker.core.durability.parked import ParkedStore
from broker.core.host import CoreHost
from broker.core.message import Message, decode_all, encode, record_rank
from broker.core.ranking import Key
from broker.core.retention.memory import MemoryRetention, close_all, log, store_name
from broker.core.spill import SpillQueue
from diskqueue import DiskQueueError

__all__ = ["SpillRetention"]


class SpillRetention(MemoryRetention):
    """Memory spilling to disk; what memory holds is written out at shutdown."""

    def __init__(self, where: str, host: CoreHost, deferred: Deferred):
        queues = host.queues
        ready = SpillQueue(queues.open(where), host.options.mem_queue_size,
                           where=f"channel {where}", log=log, on_error=host.disk_failed)
        super().__init__(where, host, deferred, ready,
                         ParkedStore(queues.open(store_name(where, "buried"), auto_commit=False)))

    def sweep_batch(self, want: int, keep: int) -> int:
        """A record that ranks after everything a full memory holds is appended again as it was
        read (its rank read from its bytes, :func:`~broker.core.message.record_rank`); only
        those that may stay are decoded."""
        ready = self.ready
        backend = ready.backend
        assert backend is not None
        before = backend.depth
        records = backend.read_many(want)
        if not records:
            return 0
        read = max(1, before - backend.depth)
        memory = ready.memory
        back: list[bytes] = []
        back_keys: list[Key] = []
        stay = records
        if len(memory) >= keep:
            last = memory.key(memory[-1])  # type: ignore[attr-defined]
            default = ready.default_priority
            stay = []
            for record in records:
                rank = record_rank(record, default)
                if rank is not None and rank > last:
                    back.append(record)
                    back_keys.append(rank)
                else:
                    stay.append(record)
        taken = self.take_in(stay)
        excess = len(memory) - keep
        popped = [memory.pop() for _ in range(excess)] if excess > 0 else []
        try:
            backend.put_many([*back, *(encode(m) for m in popped)])
        except DiskQueueError as exc:
            self.host.disk_failed(exc)
            memory.extend(popped)
            memory.extend(decode_all(back, log, ready.where))
            self.sweep_refused(len(back) + len(popped))
            return 0
        ready.wrote_keys(back_keys)
        ready.wrote(popped)
        ready.sweep_read(read, taken, back_keys)
        return read

    def restore(self) -> None:
        super().restore()
        records = self.host.queues.take_stash(store_name(self.where, "deferred"))
        if records:
            for msg in decode_all(records, log, self.ready.where):
                self.deferred.hold(msg, msg.due_ns)
            log.info("channel %s: restored %d deferred messages", self.where, len(records))

    async def close(self, in_flight: list[Message]) -> int:
        """Append memory and in-flight messages to the queue (in-flight ones keep their attempts) and
        stash the deferred ones for the next start; returns how many of them could not be written."""
        where = self.where
        store = self.buried.store
        assert store is not None and self.ready.backend is not None
        lost = 0
        ready = self.ready.records()
        ready.extend(encode(m) for m in in_flight)
        deferred = [encode(m) for m in self.deferred.timers.live()]
        try:
            store.settle(list(self.buried.messages.values()))
            store.commit()
        except DiskQueueError as exc:
            lost += len(self.buried.messages)
            log.error("channel %s: %d buried messages could not be written to disk: %s", where,
                      len(self.buried.messages), exc)
        try:
            if ready:
                self.ready.backend.put_many(ready)
        except DiskQueueError as exc:
            lost += len(ready)
            log.error("channel %s: %d ready messages could not be written to disk: %s", where,
                      len(ready), exc)
            ready = []
        try:
            if deferred:
                await self.host.queues.stash(store_name(where, "deferred"), deferred)
        except (DiskQueueError, OSError) as exc:
            lost += len(deferred)
            log.error("channel %s: %d deferred messages could not be written to disk: %s", where,
                      len(deferred), exc)
            deferred = []
        log.info("channel %s: wrote %d ready and %d deferred messages to disk", where, len(ready),
                 len(deferred))
        await close_all(self.queues(), f"channel {where}")
        return lost
