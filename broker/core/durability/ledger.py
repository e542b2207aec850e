"""A channel's commit ledger: when the retired records of its queues may be committed.

A channel moves messages between its queues: REQ and timeouts append a new
record to the ready queue, a deferral writes one to the deferred store, a
burial to the buried store, a due message or a kick back to the ready queue.
Each move retires the old record (marks its ticket done in that queue's
:class:`~broker.core.durability.ackfloor.AckFloor`) right after writing the new one, but the
new record is only in the page cache. Committing the old one before the new
one is on stable storage would lose the message in a power failure, so the
ledger commits in steps:

1. take how far each floor advanced, and the set of queues written with
   replacements since the last step;
2. sync those queues (group commits, shared with everyone else waiting);
3. ``commit(n)`` each queue, set the notes its owner keeps in the
   checkpoint (taken in step 1, so they too only speak of records whose
   replacements are durable), and sync it, which writes its checkpoint.

Steps run one at a time (a second could commit over records whose
replacements the first is still waiting for) and at most every
:data:`~broker.core.durability.ackfloor.COMMIT_INTERVAL` seconds from the ledger's task.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from broker.core.durability.ackfloor import COMMIT_INTERVAL, AckFloor
from broker.core.durability.groupcommit import GroupCommit
from broker.core.tasks import TaskSet
from diskqueue import DiskQueue, DiskQueueClosed, DiskQueueError

__all__ = ["CommitLedger"]


class CommitLedger:
    """The commit steps for one channel's queues; owned by the channel, which runs :meth:`run`.

    ``floors`` pairs each queue read without auto-commit with its ack floor;
    ``notes`` pairs queues with a function giving the note (``DiskQueue.note``) to
    write with their next checkpoint, or None to leave it; ``on_error`` is told of
    a failed sync (the step is then retried).
    """

    __slots__ = ("_floors", "_notes", "_unsynced", "_wanted", "_lock", "_on_error", "_spawn")

    def __init__(self, floors: list[tuple[AckFloor, DiskQueue]], on_error: Callable[[Exception], None],
                 notes: list[tuple[DiskQueue, Callable[[], bytes | None]]] | None = None):
        self._floors = floors
        self._notes = notes or []
        self._unsynced: set[GroupCommit] = set()
        self._wanted = trio.Event()
        self._lock = trio.Lock()
        self._on_error = on_error
        self._spawn: TaskSet | None = None

    def run_on_demand(self, tasks: TaskSet) -> None:
        """Have :meth:`run` started in ``tasks`` by the first step asked for, instead of by the owner."""
        self._spawn = tasks
        if self._wanted.is_set():
            self._start()

    def _start(self) -> None:
        tasks, self._spawn = self._spawn, None
        if tasks is not None:
            tasks.start_soon(self.run)

    def wake(self) -> None:
        """Something was retired: schedule a step."""
        self._wanted.set()
        if self._spawn is not None:
            self._start()

    def replaced(self, group: GroupCommit) -> None:
        """A record was written to ``group``'s queue in place of one being retired."""
        self._unsynced.add(group)
        self._wanted.set()
        if self._spawn is not None:
            self._start()

    async def run(self) -> None:
        """Commit steps as records are retired, until cancelled or the queues close."""
        while True:
            await self._wanted.wait()
            self._wanted = trio.Event()
            try:
                await self.commit()
            except DiskQueueClosed:
                return
            except DiskQueueError as exc:
                self._on_error(exc)
                self._wanted.set()
            await trio.sleep(COMMIT_INTERVAL)

    async def commit(self) -> None:
        """One step: commit everything retired so far, once its replacements are durable.

        Raises the queues' ``DiskQueueError`` (nothing is committed then).
        """
        async with self._lock:
            taken = [(acks, acks.take(), acks.epoch, queue) for acks, queue in self._floors]
            notes = [(queue, note) for queue, make in self._notes if (note := make()) is not None]
            unsynced, self._unsynced = self._unsynced, set()
            try:
                for group in unsynced:
                    await group.wait()
            except BaseException:
                for acks, n, epoch, _queue in taken:
                    if acks.epoch == epoch:
                        acks.untake(n)
                self._unsynced |= unsynced
                raise
            committed = []
            for acks, n, epoch, queue in taken:
                if n and acks.epoch == epoch:
                    queue.commit(n)
                    committed.append(queue)
            for queue, note in notes:
                queue.note = note
                if queue.sync_needed and queue not in committed:
                    committed.append(queue)
            # The checkpoint at once, not at the queue's next policy sync (up to --sync-timeout
            # later): a crash then re-delivers only what was finished in the last step or so.
            for queue in committed:
                await queue.sync()
