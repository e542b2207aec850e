"""When a disk queue syncs, and what one sync does in a worker thread.

Sync policy (nsqd's): :class:`SyncPolicy`'s loop syncs once ``sync_every`` records have
been written or read since the last sync, within ``sync_timeout`` seconds of the first
change not yet synced, promptly after a segment roll and after a segment has been read to
its end; and ``DiskQueue.close()`` syncs. These syncs always write the checkpoint. While
nothing needs a sync the loop waits without a timeout (an idle queue costs no wake-ups),
and with ``run_on_demand()`` it is not even started until the first change.

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
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import trio

from . import fileops
from .checkpoint import TEMP_SUFFIX, fsync_path, write_temporary
from .errors import DiskQueueClosed, DiskQueueError, describe_os_error, os_error_reason
from .recovery import set_aside

__all__ = ["Guard", "Spawner", "SyncHost", "SyncJob", "SyncPolicy", "sync_problem"]


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
    """nsqd's sync policy for one queue: counts the changes, decides when a sync is due, and
    runs the loop that syncs (see the module docstring). Owned by one ``DiskQueue``."""

    __slots__ = ("every", "timeout", "ops", "idle", "_inline_below", "_records_s", "_wakeup",
                 "_changed_at", "_spawn", "_stopped", "_name", "_log")

    def __init__(self, every: int, timeout: float, inline_below: float, name: str, log: logging.Logger) -> None:
        if every < 1 or not timeout > 0:
            raise ValueError("sync_every must be >= 1 and sync_timeout > 0")
        self.every = every
        self.timeout = timeout
        self.ops = 0  # records written and read since the last sync
        self.idle = True  # no policy loop is timing a sync: the next change must wake one
        self._inline_below = inline_below
        self._records_s = 0.0  # how long the last sync of records only took
        self._wakeup = trio.Event()
        self._changed_at = math.inf  # when the change that ended the last idle spell was made
        self._spawn: Spawner | None = None
        self._stopped = False
        self._name = name
        self._log = log

    def nudge(self) -> bool:
        """Whether a change just made must wake the loop: it is idle (the change starts the
        ``sync_timeout`` clock) or ``sync_every`` is reached."""
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

    async def execute(self, job: SyncJob, records_only: bool) -> list[int]:
        """Run ``job``: in a worker thread, or inline while syncs of records only are quick.
        Returns the segments it removed; raises what ``job.run`` raises."""
        started = time.perf_counter()
        if records_only and self._records_s < self._inline_below:
            removed = job.run()
            await trio.lowlevel.cancel_shielded_checkpoint()
        else:
            removed = await trio.to_thread.run_sync(job.run)
        if records_only:
            self._records_s = time.perf_counter() - started
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

    def __init__(self, *, fds: list[int], rolled: list[tuple[int, int]], created: bool, data: bytes | None,
                 meta_path: str, directory: str, removals: list[tuple[int, str, bool]],
                 guard: Guard, ops: int, meta_dirty: bool, log: logging.Logger) -> None:
        self.fds = fds
        self.rolled = rolled
        self.created = created
        self.data = data
        self.meta_path = meta_path
        self.directory = directory
        self.removals = removals
        self.guard = guard
        self.epoch = guard.epoch
        self.ops = ops
        self.meta_dirty = meta_dirty
        self.log = log

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
