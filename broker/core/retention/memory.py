"""Memory only (ephemeral channels), and what every retention shares.

:class:`MemoryRetention` keeps a bounded memory queue (messages past it are
dropped, as nsqd drops them) and the deferred and buried messages in memory.
The other retentions (:mod:`.spilling`, :mod:`.durable`) extend it with files.
"""

from __future__ import annotations

import logging

from broker.core.deadletter import BuriedSet
from broker.core.deferred import Deferred
from broker.core.durability.ledger import CommitLedger
from broker.core.durability.parked import ParkedStore
from broker.core.host import CoreHost
from broker.core.message import Message, decode_all, now_ns
from broker.core.spill import REFILL_BATCH, SpillQueue
from broker.core.tasks import TaskSet
from diskqueue import DiskQueue, DiskQueueError

__all__ = ["MemoryRetention", "RETRY_DELAY", "SWEEP_STEP", "close_all", "store_name"]

log = logging.getLogger("pynsqd.channel")

#: Seconds before a write the disk refused is tried again.
RETRY_DELAY = 1.0
#: Records a sweep reads in one step at most (:meth:`MemoryRetention.sweep_step`): under a
#: millisecond spilling, one or two with ``--durable``; the broker's other work runs between steps.
SWEEP_STEP = 256


def store_name(where: str, kind: str) -> str:
    """The disk queue name of the ``deferred`` or ``buried`` store of the channel ``where``
    (``topic:channel``).

    '#' can only appear in a name as '#ephemeral', and ephemeral channels
    have no files, so this never collides with a topic's or channel's queue.
    """
    return f"{where}#{kind}"


class MemoryRetention:
    """Memory only (an ephemeral channel); the base of the other retentions.

    ``where`` names the channel (``topic:channel``), ``deferred`` is its
    deferred index (a retention holds messages back there, never through the
    channel), ``ready`` its queue of ready messages, ``buried`` its buried
    set, ``ledger`` commits what the channel's stores retired.
    """

    def __init__(self, where: str, host: CoreHost, deferred: Deferred, ready: SpillQueue | None = None,
                 buried: ParkedStore | None = None):
        self.where = where
        self.host = host
        self.deferred = deferred
        if ready is None:
            ready = SpillQueue(None, host.options.mem_queue_size, where=f"channel {where}", log=log)
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
            self.deferred.hold(msg, due_ns)
        return True

    def release(self, msgs: list[Message]) -> None:
        """Deferred ``msgs`` are due: make them ready."""
        self.ready.put(msgs)

    def retire(self, msgs: list[Message]) -> None:
        """``msgs`` left the channel for good (finished, dropped) or were replaced by :meth:`append`."""

    def buried_replaced(self, tickets: list[int]) -> None:
        """Messages holding ``tickets`` were written to the buried store."""

    def bury(self, msgs: list[Message]) -> bool:
        """Move messages that used up their attempts to the buried set; False if their store
        refused them (they are buried in memory all the same)."""
        old = [m.ticket for m in msgs]
        try:
            self.buried.bury(msgs)
        except DiskQueueError as exc:
            # kept in memory all the same; in durable mode their records stay unretired
            self.host.disk_failed(exc)
            return False
        self.buried_replaced(old)
        return True

    def kick(self, msg_id: bytes | None, n: int) -> list[Message]:
        """Make the buried message ``msg_id``, or the ``n`` oldest, ready with 0 attempts; those that moved."""
        msgs = self.buried.take(msg_id, n)
        if not msgs:
            return []
        for msg in msgs:
            msg.attempts = 0
        if not self.append(msgs):
            self.buried.bury(msgs)  # the old records are retired already; write new ones
            return []
        self.commit_soon()
        return msgs

    def delete_buried(self, msg_id: bytes | None, n: int) -> int:
        """Drop the buried message ``msg_id``, or the ``n`` oldest; how many went."""
        msgs = self.buried.take(msg_id, n)
        if msgs:
            self.commit_soon()
        return len(msgs)

    def begin_sweep(self) -> bool:
        """Ranked: start a sweep of every record unread now, unless one runs already (see
        :mod:`broker.core.ranking`); False when the disk holds none. Its owner then calls
        :meth:`sweep_step` until it returns False, with a checkpoint between calls."""
        return self.ready.start_sweep()

    def sweep_step(self) -> bool:
        """Ranked, a bounded step of a sweep: read :data:`SWEEP_STEP` of the records it has
        left, keep the most urgent messages in memory (its limit, or
        ``REFILL_BATCH`` with a limit of 0) and append the others behind as new records
        (:meth:`sweep_batch`). Returns whether records are left to read, False once the sweep
        is over: the front of memory is then the most urgent ready message.

        When the disk refuses to take the others back they stay in memory (past the limit), and
        until the next sweep the order covers only what was read.
        """
        ready = self.ready
        left = ready.sweep_left
        backend = ready.backend
        if not left or backend is None:
            return False
        with backend.moving():  # the queue's sync policy need not sync records moved
            read = self.sweep_batch(min(left, SWEEP_STEP), ready.limit or REFILL_BATCH)
        if not read:
            ready.sweep_read(left)  # nothing could be read: the sweep is over
            return False
        return bool(ready.sweep_left)

    def sweep_batch(self, want: int, keep: int) -> int:
        """Ranked, a step of a sweep: read up to ``want`` records, keep at most ``keep``
        messages in memory and append the others to the queue again, and tell the queue what
        was read (:meth:`~broker.core.spill.SpillQueue.sweep_read`). Returns how many records
        were read, 0 when none was or the disk refused (:meth:`sweep_refused`). Each retention
        with a disk queue writes them its own way."""
        raise NotImplementedError(f"{type(self).__name__} keeps no disk queue to sweep")

    def sweep_refused(self, count: int) -> None:
        """A sweep could not append ``count`` messages again: they stay in memory, the sweep
        ends, and what is left unread waits for the next sweep (when memory runs out)."""
        log.warning("channel %s: a sweep could not write back %d messages; until the disk takes writes "
                    "again, priority order covers only those read", self.where, count)
        self.ready.swept()

    def read_ahead(self, want: int) -> bool:
        """Move up to ``want`` messages from disk to memory, in the order written; False if disk
        holds none. (A ranked queue is swept instead: :meth:`begin_sweep`.)"""
        ready = self.ready
        backend = ready.backend
        if backend is None or not backend.depth:
            return False
        records = backend.read_many(max(1, min(want, REFILL_BATCH)))
        if not records:
            return False
        self.take_in(records)
        return True

    def take_in(self, records: list[bytes]) -> list[Message]:
        """The messages of ``records`` read from the queue: into memory, or held until due.
        Returns them (unreadable records are skipped)."""
        memory = self.ready.memory
        wall = now_ns()
        msgs = decode_all(records, log, self.ready.where)
        for msg in msgs:
            if msg.due_ns > wall:
                self.deferred.hold(msg, msg.due_ns)
            else:
                msg.due_ns = 0
                memory.append(msg)
        return msgs

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

    async def close(self, in_flight: list[Message]) -> int:
        """Shutdown: make the disk state final (``in_flight``: the messages still in flight)
        and close every queue; the number of messages that could not be written (a full
        disk), each failure logged."""
        return 0

    def delete(self) -> None:
        """Remove every file of the channel."""
        queues = self.queues()
        for queue in queues:
            queue.delete()
        if queues:
            self.host.queues.drop_stash(store_name(self.where, "deferred"))

    def empty(self) -> None:
        """Drop every ready message (the channel dropped its in-flight and deferred ones)."""
        self.ready.empty()


async def close_all(queues: list[DiskQueue], where: str) -> None:
    """Close every queue; one whose final sync fails (a full disk) is logged and the others
    still close."""
    for queue in queues:
        try:
            await queue.close()
        except DiskQueueError as exc:
            log.error("%s: closing disk queue %s failed: %s", where, queue.name, exc)
