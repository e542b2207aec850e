"""Group commit: many tasks wait for their writes to one disk queue to be durable, one fsync serves them all.

A task that has just written records calls :meth:`GroupCommit.wait`. If no
sync is running it becomes the leader and runs one (``DiskQueue.sync`` of the
records only, normally one data fsync, in a worker thread); tasks that arrive while it runs wait for the *next* sync,
because the running one may have captured the file state before their write.
When that next sync starts, all of them are covered by it, so with N
concurrent publishers a queue does about one sync per fsync latency instead
of N, and throughput grows with concurrency::

    publisher A: write ──wait──── sync #1 ───────► OK
    publisher B:     write ──wait───────────────── sync #2 ──► OK
    publisher C:        write ──wait────────────── (sync #2) ─► OK
"""

from __future__ import annotations

import trio

from diskqueue import DiskQueue

__all__ = ["GroupCommit"]


class GroupCommit:
    """Shared syncs of one :class:`DiskQueue`; owned by the queue's owner.

    Syncs are numbered: ``started`` counts syncs begun, ``completed`` is the
    number of the latest one that succeeded, ``finished`` of the latest that
    ended either way.
    """

    __slots__ = ("queue", "_started", "_finished", "_completed", "_running", "_idle", "_error")

    def __init__(self, queue: DiskQueue):
        self.queue = queue
        self._started = 0
        self._finished = 0
        self._completed = 0
        self._running = False
        self._idle = trio.Event()
        self._error: BaseException | None = None

    @property
    def syncs(self) -> int:
        """Syncs completed so far (each may have served many waiters)."""
        return self._completed

    async def wait(self) -> None:
        """Return once everything written to the queue before this call is on stable storage.

        Raises the queue's ``DiskQueueError`` if the sync that was to cover
        this call failed (a later successful sync is not awaited for it: the
        caller reports the failure, as a publisher must not be told ``OK``).
        """
        need = self._started + 1  # the first sync that starts after our write
        while self._completed < need:
            if self._finished >= need:
                assert self._error is not None
                raise self._error
            if self._running:
                await self._idle.wait()
            else:
                await self._lead()

    async def _lead(self) -> None:
        self._running = True
        self._started += 1
        number = self._started
        try:
            await self.queue.sync(commits=False)
        except Exception as exc:
            self._error = exc
            self._finished = number
        else:
            self._completed = self._finished = number
        finally:
            # Cancelled leaders leave ``finished`` alone: a waiter then leads a new sync.
            self._running = False
            idle, self._idle = self._idle, trio.Event()
            idle.set()
