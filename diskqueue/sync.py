"""One sync of a disk queue, as run in a worker thread.

The queue captures everything a sync needs on the Trio thread at one instant (descriptors
to fsync, the encoded checkpoint, the consumed segments to remove) into a ``SyncJob``; the
worker thread touches nothing else. ``Guard`` lets ``empty()``/``delete()`` on the Trio
thread stop a sync that is already running from installing a stale checkpoint or removing
files after them.
"""

from __future__ import annotations

import logging
import threading

from . import fileops
from .checkpoint import TEMP_SUFFIX, fsync_directory, write_temporary
from .recovery import set_aside

__all__ = ["Guard", "SyncJob"]


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
            fsync_directory(self.directory)  # new segments' names before a checkpoint naming them
        if self.data is None:
            return []
        tmp = write_temporary(self.meta_path, self.data)
        with self.guard.lock:
            if not self.current:
                fileops.unlink(tmp)
                return []
            fileops.replace(tmp, self.meta_path)
        fsync_directory(self.directory)
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
