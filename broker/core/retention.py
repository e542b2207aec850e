"""Where a channel keeps its messages: in memory only, or in memory spilling to disk.

A channel's retention is chosen once, when the channel is created, and owns
the channel's queues and stores. The channel decides where a message goes
next (ready again, deferred, retired); its retention carries that out:

* :class:`Retention` (ephemeral channels): a bounded memory queue, messages
  past it are dropped; deferred and buried messages live in memory.
* :class:`SpillRetention`: ready messages spill to the channel's disk queue
  (a failed write keeps them in memory and reports the disk error); the
  buried set is mirrored in a store; at shutdown memory and in-flight
  messages are appended to the queue and deferred ones stashed for the next
  start.
* :class:`~broker.core.durability.retention.DurableRetention` (``--durable``):
  every message stays on disk until it is finished.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from broker.core.deadletter import BuriedSet
from broker.core.durability.ledger import CommitLedger
from broker.core.durability.parked import ParkedStore
from broker.core.host import CoreHost
from broker.core.message import Message, decode_all, encode, now_ns
from broker.core.spill import REFILL_BATCH, SpillQueue
from broker.core.tasks import TaskSet
from diskqueue import DiskQueue, DiskQueueError

if TYPE_CHECKING:
    from broker.core.channel import Channel

__all__ = ["Retention", "SpillRetention", "store_name"]

log = logging.getLogger("pynsqd.channel")


def store_name(channel: Channel, kind: str) -> str:
    """The disk queue name of a channel's ``deferred`` or ``buried`` store.

    '#' can only appear in a name as '#ephemeral', and ephemeral channels
    have no files, so this never collides with a topic's or channel's queue.
    """
    return f"{channel.topic_name}:{channel.name}#{kind}"


class Retention:
    """Memory only (an ephemeral channel); the base of the other retentions.

    ``ready`` is the channel's queue of ready messages, ``buried`` its buried
    set, ``ledger`` commits what the channel's stores retired.
    """

    def __init__(self, channel: Channel, host: CoreHost, ready: SpillQueue | None = None,
                 buried: ParkedStore | None = None):
        self.channel = channel
        self.host = host
        if ready is None:
            ready = SpillQueue(None, host.options.mem_queue_size, where=f"channel {channel.where}", log=log)
        self.ready = ready
        self.buried = BuriedSet(buried)
        self.ledger = CommitLedger(self._floors(), host.disk_failed, self._notes())

    def _floors(self) -> list:
        store = self.buried.store
        return [] if store is None else [(store.acks, store.queue)]

    def _notes(self) -> list:
        """What the ledger writes in checkpoints besides the committed cursors (see ``CommitLedger``)."""
        return []

    def queues(self) -> list[DiskQueue]:
        """Every disk queue the channel owns."""
        store = self.buried.store
        ready = self.ready.backend
        return [] if store is None or ready is None else [ready, store.queue]

    def restore(self) -> None:
        """Load what a previous run left (called once the channel is set up)."""
        self.buried.restore()

    def start(self, tasks: TaskSet) -> None:
        """Have the queues' sync loops and the commit task started in ``tasks`` once they have work."""
        queues = self.queues()
        for queue in queues:
            queue.run_on_demand(tasks)
        if queues:
            self.ledger.run_on_demand(tasks)

    # ---------------------------------------------------------------- moves

    def put_records(self, records: list[bytes], number: int) -> int:
        """Take records copied from a durable topic; returns how many messages they held.

        ``number`` is the topic's number for the last record of the batch it copies
        (the records given may be fewer: those the channel already holds are left out);
        only a durable channel keeps it. Deferred records wait until they are due.
        """
        msgs = decode_all(records, log, self.ready.where)
        wall = now_ns()
        ready = [m for m in msgs if m.due_ns <= wall]
        if len(ready) != len(msgs):
            for msg in msgs:
                if msg.due_ns > wall:
                    self.defer([msg], msg.due_ns)
        for msg in ready:
            msg.due_ns = 0
        if ready:
            self.ready.put(ready)
        return len(msgs)

    def copied_through(self) -> tuple[int, int]:
        """How far a durable topic's copying into this channel got before a crash (see the durable retention)."""
        return -1, -1

    def append(self, msgs: list[Message]) -> bool:
        """Make ``msgs`` ready again, behind everything ready; False if that failed (nothing moved)."""
        self.ready.put(msgs)
        return True

    def requeue(self, msgs: list[Message]) -> bool:
        """Make in-flight ``msgs`` ready again (REQ, a timeout), retiring what they were; False if that
        failed (nothing moved)."""
        moved = self.append(msgs)
        if moved:
            self.retire(msgs)
        return moved

    def defer(self, msgs: list[Message], due_ns: int) -> bool:
        """Hold ``msgs`` until ``due_ns``; False if that failed (nothing moved)."""
        for msg in msgs:
            self.channel.defer_until(msg, due_ns)
        return True

    def release(self, msgs: list[Message]) -> None:
        """Deferred ``msgs`` are due: make them ready."""
        self.ready.put(msgs)

    def retire(self, msgs: list[Message]) -> None:
        """``msgs`` left the channel for good (finished, dropped) or were replaced by :meth:`append`."""

    def buried_replaced(self, tickets: list[int]) -> None:
        """Messages holding ``tickets`` were written to the buried store."""

    def bury(self, msgs: list[Message]) -> None:
        """Move messages that used up their attempts to the buried set."""
        old = [m.ticket for m in msgs]
        try:
            self.buried.bury(msgs)
        except DiskQueueError as exc:
            # kept in memory all the same; in durable mode their records stay unretired
            self.host.disk_failed(exc)
            return
        log.info("channel %s: buried %d message(s) after %d attempts", self.channel.where, len(msgs),
                 self.channel.bury_after)
        self.buried_replaced(old)

    def kick(self, msg_id: bytes | None, n: int) -> int:
        """Make the buried message ``msg_id``, or the ``n`` oldest, ready with 0 attempts; how many moved."""
        msgs = self.buried.take(msg_id, n)
        if not msgs:
            return 0
        for msg in msgs:
            msg.attempts = 0
        if not self.append(msgs):
            self.buried.bury(msgs)  # the old records are retired already; write new ones
            return 0
        self.commit_soon()
        return len(msgs)

    def delete_buried(self, msg_id: bytes | None, n: int) -> int:
        """Drop the buried message ``msg_id``, or the ``n`` oldest; how many went."""
        msgs = self.buried.take(msg_id, n)
        if msgs:
            self.commit_soon()
        return len(msgs)

    def refill(self, want: int) -> bool:
        """Move up to ``want`` messages from disk to memory; False if disk holds none."""
        ready = self.ready
        backend = ready.backend
        if backend is None or not backend.depth:
            return False
        records = backend.read_many(max(1, min(want, REFILL_BATCH)))
        if not records:
            return False
        memory = ready.memory
        wall = now_ns()
        for msg in decode_all(records, log, ready.where):
            if msg.due_ns > wall:
                self.channel.defer_until(msg, msg.due_ns)
            else:
                msg.due_ns = 0
                memory.append(msg)
        return True

    # ---------------------------------------------------------------- commits

    def commit_soon(self) -> None:
        """Records were retired: have the ledger commit them."""
        self.ledger.wake()

    async def wait_durable(self) -> None:
        """Return once everything written is on stable storage (nothing is, without ``--durable``)."""

    async def persist_buried(self) -> None:
        """Make a kick or delete final: commit what it retired and checkpoint the buried store."""
        store = self.buried.store
        if store is None:
            return
        store.settle(list(self.buried.messages.values()))
        await self.ledger.commit()
        await store.queue.sync()

    # ---------------------------------------------------------------- end

    async def close(self) -> int:
        """Shutdown: make the disk state final and close every queue; the number of
        messages that could not be written (a full disk), each failure logged."""
        return 0

    def delete(self) -> None:
        """Remove every file of the channel."""
        queues = self.queues()
        for queue in queues:
            queue.delete()
        if queues:
            self.host.queues.drop_stash(store_name(self.channel, "deferred"))

    def empty(self) -> None:
        """Drop every ready message (the channel dropped its in-flight and deferred ones)."""
        self.ready.empty()


class SpillRetention(Retention):
    """Memory spilling to disk; what memory holds is written out at shutdown."""

    def __init__(self, channel: Channel, host: CoreHost):
        queues = host.queues
        ready = SpillQueue(queues.open(channel.where), host.options.mem_queue_size,
                           where=f"channel {channel.where}", log=log, on_error=host.disk_failed)
        super().__init__(channel, host, ready, ParkedStore(queues.open(store_name(channel, "buried"),
                                                                       auto_commit=False)))

    def restore(self) -> None:
        super().restore()
        channel = self.channel
        records = self.host.queues.take_stash(store_name(channel, "deferred"))
        if records:
            for msg in decode_all(records, log, self.ready.where):
                channel.defer_until(msg, msg.due_ns)
            log.info("channel %s: restored %d deferred messages", channel.where, len(records))

    async def close(self) -> int:
        """Append memory and in-flight messages to the queue (in-flight ones keep their attempts) and
        stash the deferred ones for the next start; returns how many of them could not be written."""
        channel = self.channel
        store = self.buried.store
        assert store is not None and self.ready.backend is not None
        lost = 0
        ready = self.ready.records()
        ready.extend(encode(m) for m in channel.in_flight_timers.live())
        deferred = [encode(m) for m in channel.deferred_timers.live()]
        try:
            store.settle(list(self.buried.messages.values()))
            store.commit()
        except DiskQueueError as exc:
            lost += len(self.buried.messages)
            log.error("channel %s: %d buried messages could not be written to disk: %s", channel.where,
                      len(self.buried.messages), exc)
        try:
            if ready:
                self.ready.backend.put_many(ready)
        except DiskQueueError as exc:
            lost += len(ready)
            log.error("channel %s: %d ready messages could not be written to disk: %s", channel.where,
                      len(ready), exc)
            ready = []
        try:
            if deferred:
                await self.host.queues.stash(store_name(channel, "deferred"), deferred)
        except (DiskQueueError, OSError) as exc:
            lost += len(deferred)
            log.error("channel %s: %d deferred messages could not be written to disk: %s", channel.where,
                      len(deferred), exc)
            deferred = []
        log.info("channel %s: wrote %d ready and %d deferred messages to disk", channel.where, len(ready),
                 len(deferred))
        await close_all(self.queues(), f"channel {channel.where}")
        return lost


async def close_all(queues: list[DiskQueue], where: str) -> None:
    """Close every queue; one whose final sync fails (a full disk) is logged and the others
    still close."""
    for queue in queues:
        try:
            await queue.close()
        except DiskQueueError as exc:
            log.error("%s: closing disk queue %s failed: %s", where, queue.name, exc)
