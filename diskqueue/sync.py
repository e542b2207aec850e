"""When a disk queue syncs, and what one sync does in a worker thread.

Sync policy (nsqd's): :class:`SyncPolicy`'s loop syncs once ``sync_every`` records have
been written or read since the last sync (records *moved*, ``DiskQueue.moving()``, do not
count), within ``sync_timeout`` seconds of the first change not yet synced, promptly after a segment roll and after a segment has been read to
its end; and ``DiskQueue.close()`` syncs. These syncs always write the checkpoint. While
nothing needs a sync the loop waits without a timeout (an idle queue costs no wake-ups),
and with ``run_on_demand()`` it is not even started until the first change.

A segment roll happens inside ``put_many``, which cannot wait for an fsync: the finished
segment stays open, ``run()`` is woken, and the next sync fsyncs it (and the directory)
before writing a checkpoint that names anything after it. Consumed segments are removed
(or renamed ``.bad`` when corrupt) only by a sync, after a checkpoint whose committed
cursor is past them is durable: a crash never leaves the checkpoint pointing at a removed
file.

``sync()`` is the group commit: after many ``put_many`` calls one ``await sync()`` makes
all of them durable. When only records were added since the last checkpoint it is a
single data fsync: the checkpoint is a hint, and recovery keeps every complete, checksum-valid
record written after it. ``sync(commits=False)`` is always just that, and leaves a moved
committed cursor to the policy.

With ``inline_sync_below`` (seconds, 0 = never) a sync of records only (``sync(commits=False)``
or ``sync()`` with nothing else to write) runs on the calling thread, blocking it, while the
previous one took less than that: on a disk whose fdatasync takes a fraction of a
millisecond, the hand-off to a worker thread and back costs as much again. Once one takes
longer, the next ones go to the worker thread until one of those is quick again.

One sync: the queue captures everything it needs on the Trio thread at one instant
(descriptors to fsync, the encoded checkpoint, the consumed segments to remove) into a
``SyncJob``; the worker thread touches nothing else. ``Guard`` lets ``empty()``/``delete()``
on the Trio thread stop a sync that is already running from installing a stale checkpoint
or removing files after them.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

import trio

from . import fileops
from .checkpoint import TEMP_SUFFIX, fsync_path, write_temporary
from .errors import DiskQueueClosed, DiskQueueError, DiskQueueIOError, describe_os_error, os_error_reason
from .recovery import set_aside
from .writer import SegmentWriter

__all__ = ["AUTO", "FULL", "RECORDS", "Guard", "Spawner", "SyncHost", "SyncJob", "SyncPolicy", "sync_problem"]

# What a sync writes besides the data fsync: always a checkpoint (the policy, close), one
# when the checkpoint's content changed (sync()), none (sync(commits=False)).
FULL, AUTO, RECORDS = 0, 1, 2


class Spawner(Protocol):
    """What ``DiskQueue.run_on_demand`` starts the policy loop in: a nursery, or a wrapper."""

    def start_soon(self, async_fn: Callable[[], Awaitable[Any]]) -> Any: ...


class SyncHost(Protocol):
    """What the policy loop asks of the queue it syncs (passed to :meth:`SyncPolicy.run`,
    never stored: the policy holds no reference to its queue)."""

    @property
    def sync_needed(self) -> bool: ...

    def _sync_urgent(self) -> bool: ...

    async def _sync_full(self) -> None: ...


class SyncPolicy:
    """nsqd's sync policy for one queue: what the last sync does not cover, when a sync is
    due, the loop that syncs, and the running of one sync (see the module docstring).
    Owned by one ``DiskQueue``.

    ``dirty``: something changed since the last sync; ``meta_dirty``: the checkpoint's
    content other than the write cursor changed; ``ops``: records written and read since
    the last sync, while ``counting`` (the queue turns it off while records are moved).
    The queue sets them as it changes; capturing a sync clears them.
    """

    __slots__ = ("every", "timeout", "ops", "counting", "dirty", "meta_dirty", "idle", "syncs", "last_error",
                 "_inline_below", "_records_s", "_wakeup", "_changed_at", "_spawn", "_stopped", "_active",
                 "_deferred", "_name", "_log")

    def __init__(self, every: int, timeout: float, inline_below: float, name: str, log: logging.Logger) -> None:
        if every < 1 or not timeout > 0:
            raise ValueError("sync_every must be >= 1 and sync_timeout > 0")
        self.every = every
        self.timeout = timeout
        self.ops = 0
        self.counting = True
        self.dirty = False
        self.meta_dirty = False
        self.syncs = 0
        self.last_error: str | None = None
        self._active = False  # a sync is running: a worker thread may be fsyncing descriptors
        self._deferred: list[int] = []  # descriptors to close once it returns
        self.idle = True  # no policy loop is timing a sync: the next change must wake one
        self._inline_below = inline_below
        self._records_s = 0.0  # how long the last sync of records only took
        self._wakeup = trio.Event()
        self._changed_at = math.inf  # when the change that ended the last idle spell was made
        self._spawn: Spawner | None = None
        self._stopped = False
        self._name = name
        self._log = log

    def changed(self, ops: int, checkpoint: bool) -> bool:
        """Note a change a sync must cover: ``ops`` records written or read, and whether the
        checkpoint's content changed. Returns whether the loop must be woken: it is idle
        (the change starts the ``sync_timeout`` clock) or ``sync_every`` is reached."""
        if self.counting:
            self.ops += ops
        self.dirty = True
        if checkpoint:
            self.meta_dirty = True
        return self.idle or self.ops >= self.every

    def due(self, urgent: bool) -> bool:
        """Whether a sync is due now: ``sync_every`` reached, or something ``urgent``."""
        return self.ops >= self.every or urgent

    def wake(self) -> Spawner | None:
        """Something changed that a sync must cover: wake the loop. Returns where to start it
        when it is to be started on demand and has not been yet."""
        if self.idle:
            self.idle = False
            try:
                self._changed_at = trio.current_time()
            except RuntimeError:  # used outside trio.run (no policy loop to tell)
                pass
        self._wakeup.set()
        spawn = None if self._stopped else self._spawn
        if spawn is not None:
            self._spawn = None
        return spawn

    def on_demand(self, nursery: Spawner) -> None:
        """Let the next :meth:`wake` hand out ``nursery`` to start the loop in."""
        self._spawn = nursery

    def stop(self) -> None:
        """The queue is closed: the loop returns, nothing more is started."""
        self._stopped = True
        self._wakeup.set()

    def captured(self, job: SyncJob) -> None:
        """``job`` was just captured: what it covers is no longer owed.

        A job of records only that covers a new or finished segment still owes a checkpoint
        naming it: the next sync (at the latest, the one at close) writes it."""
        if job.data is None and (job.rolled or job.created):
            self.meta_dirty = True
        job.meta_dirty = self.meta_dirty
        if job.data is not None:
            self.meta_dirty = False
        if not self.meta_dirty:  # otherwise the loop still owes a checkpoint of the commits
            job.ops, self.ops = self.ops, 0
            self.dirty = False

    def owed(self, job: SyncJob) -> None:
        """``job`` failed: what it covered is owed again."""
        self.ops += job.ops
        self.dirty = True
        self.meta_dirty = self.meta_dirty or job.meta_dirty

    def close(self, fds: Iterable[int]) -> None:
        """Close descriptors now, or once the running sync returns (it may be fsyncing them)."""
        for fd in fds:
            if self._active:
                self._deferred.append(fd)
            else:
                fileops.close(fd)

    async def execute(self, job: SyncJob, records_only: bool, failed: Callable[[SyncJob], None]) -> list[int]:
        """Run ``job``: in a worker thread, or inline while syncs of records only are quick;
        then close the finished segments' descriptors it fsynced. Returns the segments it
        removed. On failure calls ``failed(job)`` first, then raises ``DiskQueueIOError``
        for what the OS refused (anything else as it is)."""
        self._active = True
        try:
            started = time.perf_counter()
            if records_only and self._records_s < self._inline_below:
                removed = job.run()
                await trio.lowlevel.cancel_shielded_checkpoint()
            else:
                removed = await trio.to_thread.run_sync(job.run)
            if records_only:
                self._records_s = time.perf_counter() - started
        except BaseException as exc:
            failed(job)
            if isinstance(exc, OSError):
                self.last_error = str(exc)
                raise DiskQueueIOError(f"disk queue {self._name!r}: sync failed: {sync_problem(exc)}",
                                       errno=exc.errno) from exc
            raise
        finally:
            self._active = False
            deferred, self._deferred = self._deferred, []
            for fd in deferred:
                fileops.close(fd)
        for _, fd in job.rolled:
            fileops.close(fd)
        self.syncs += 1
        self.last_error = None
        return removed

    async def run(self, host: SyncHost, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The loop: sync ``host`` when due (see the module docstring) until :meth:`stop`.

        A failed sync is logged and retried after ``sync_timeout``.
        """
        task_status.started()
        deadline = math.inf  # when the oldest change not yet synced must be synced
        while not self._stopped:
            if not self.due(host._sync_urgent()):
                if not host.sync_needed:
                    deadline = self._changed_at = math.inf
                    self.idle = True
                    await self._wakeup.wait()
                    self.idle = False
                    self._wakeup = trio.Event()
                    continue
                if deadline == math.inf:
                    deadline = min(self._changed_at, trio.current_time()) + self.timeout
                with trio.move_on_at(deadline):
                    await self._wakeup.wait()
                self._wakeup = trio.Event()
                if self._stopped:
                    return
                if not self.due(host._sync_urgent()) and trio.current_time() < deadline:
                    continue  # woken early: a change that is not due yet
            if self._stopped:
                return
            if not host.sync_needed:
                continue
            deadline = self._changed_at = math.inf  # changes from here on start a new clock
            try:
                await host._sync_full()
            except DiskQueueClosed:
                return
            except DiskQueueError as exc:
                self._log.error("DISKQUEUE(%s): %s", self._name, exc)
                await trio.sleep(self.timeout)


def sync_problem(exc: OSError) -> str:
    """What failed in a sync, in Go's words: the checkpoint's file when the call names one
    (creating the temporary file, renaming it), else the reason (a write or an fsync)."""
    if exc.filename2 is not None:
        return describe_os_error("rename", exc.filename, exc, exc.filename2)
    if exc.filename is not None:
        return describe_os_error("open", exc.filename, exc)
    return os_error_reason(exc)


class Guard:
    """A generation number and the lock that orders it against checkpoint installation."""

    __slots__ = ("lock", "epoch")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.epoch = 0

    def advance(self) -> None:
        """Invalidate every sync captured before now (caller holds ``lock``)."""
        self.epoch += 1


class SyncJob:
    """Data fsyncs, then (when ``data`` is given) an atomic checkpoint and the removal of
    consumed segments."""

    __slots__ = ("fds", "rolled", "created", "data", "meta_path", "directory", "removals",
                 "epoch", "guard", "ops", "meta_dirty", "log")

    def __init__(self, writer: SegmentWriter, removals: list[tuple[int, str, bool]], guard: Guard,
                 meta_path: str, directory: str, log: logging.Logger) -> None:
        """Take from ``writer`` the descriptors to fsync: the finished segments' and, when
        written to since, the current one's."""
        self.rolled = writer.take_rolled()
        self.fds = [fd for _, fd in self.rolled]
        if writer.fd is not None and writer.dirty:
            self.fds.append(writer.fd)
            writer.dirty = False
        self.created, writer.created = writer.created, False
        self.data: bytes | None = None  # the encoded checkpoint to install, if any
        self.meta_path = meta_path
        self.directory = directory
        self.removals = removals
        self.guard = guard
        self.epoch = guard.epoch
        self.ops = 0  # the policy's count of changes this job covers
        self.meta_dirty = False
        self.log = log

    def give_back(self, writer: SegmentWriter) -> None:
        """This job failed: ``writer`` owes again what was taken from it."""
        writer.rolled[:0] = self.rolled
        writer.created = writer.created or self.created
        writer.dirty = writer.fd is not None
        self.rolled = []

    @property
    def current(self) -> bool:
        """No ``empty()``/``delete()`` happened since this job was captured."""
        return self.epoch == self.guard.epoch

    def run(self) -> list[int]:
        """Blocking. Returns the numbers of the segments removed; raises ``OSError``."""
        for fd in self.fds:
            fileops.fdatasync(fd)
        if self.created:
            fsync_path(self.directory)  # new segments' names before a checkpoint naming them
        if self.data is None:
            return []
        tmp = write_temporary(self.meta_path, self.data)
        with self.guard.lock:
            if not self.current:
                fileops.unlink(tmp)
                return []
            fileops.replace(tmp, self.meta_path)
        fsync_path(self.directory)
        removed = []
        for number, path, bad in self.removals:
            with self.guard.lock:
                if not self.current:
                    break
                try:
                    if bad:
                        set_aside(path)
                    else:
                        fileops.unlink(path)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    self.log.warning("could not remove consumed segment %s: %s", path, exc)
                    continue
            removed.append(number)
        return removed

    def abandon_temporary(self) -> None:
        """Remove a temporary checkpoint a failed run may have left."""
        try:
            fileops.unlink(self.meta_path + TEMP_SUFFIX)
        except OSError:
            pass
