"""The data directory: its lock, its disk queues and its metadata file, handed to the broker together."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from broker.config.options import Options
from broker.storage.metadata import MetadataFile
from broker.storage.nsqdimport import NsqdImportError, import_nsqd_queues
from broker.storage.queuestore import QueueStore
from diskqueue import DiskQueueError, describe_os_error, os_error_reason

__all__ = ["DataDirectory", "DataPathError", "DataPathLocked"]


class DataPathError(RuntimeError):
    """The data directory cannot be created or locked; the message is nsqd's
    (``failed to lock data-path: ...``)."""


class DataPathLocked(DataPathError):
    """Another process holds the data directory."""


class DataDirectory:
    """``--data-path`` (the current directory if empty); implements :class:`broker.core.host.BrokerStorage`.

    :meth:`lock` creates the directory and takes an exclusive ``flock`` on it
    for the life of the broker, so two brokers never share one. A directory it
    created is removed again by :meth:`unlock` if nothing was written in it (a
    start that failed, e.g. on a port in use, leaves no empty directory behind).
    """

    def __init__(self, options: Options):
        self.path = Path(options.data_path or os.getcwd()).resolve()
        self.max_msg_size = options.max_msg_size
        self.queues = QueueStore(self.path, options)
        self.metadata = MetadataFile(self.path)
        self._lock_fd: int | None = None
        #: the directories :meth:`lock` created (the data path and missing parents), deepest first
        self._created: list[Path] = []

    def lock(self) -> None:
        """Create and lock the directory, and check that the metadata file can be written there.

        Raises :class:`DataPathLocked` if another broker holds it, :class:`DataPathError`
        if it cannot be created or opened, and
        :class:`~broker.storage.metadata.MetadataWriteError` when it is read-only (nothing
        has been read or changed then).
        """
        missing = []
        for directory in (self.path, *self.path.parents):
            if directory.exists():
                break
            missing.append(directory)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._created = missing
        except OSError as exc:
            raise DataPathError(f"failed to lock data-path: {describe_os_error('mkdir', str(self.path), exc)}") \
                from None
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError as exc:
            raise DataPathError(f"failed to lock data-path: {describe_os_error('open', str(self.path), exc)}") \
                from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            raise DataPathLocked(f"failed to lock data-path: cannot flock directory {self.path} - "
                                 f"{os_error_reason(exc)} "
                                 "(possibly in use by another instance of nsqd)") from None
        self._lock_fd = fd
        try:
            self.metadata.check_writable()
        except OSError:
            self.unlock()
            raise

    async def import_nsqd_queues(self) -> None:
        """Import the disk queues an nsqd left here into pynsqd's own (see
        :mod:`broker.storage.nsqdimport`); call with the lock held, before any queue opens.

        Raises ``OSError`` when nsqd's files cannot be renamed or removed and
        :class:`~broker.storage.nsqdimport.NsqdImportError` when pynsqd's queue cannot be
        written; nothing is lost then, and the next start carries on.
        """
        try:
            await import_nsqd_queues(self.path, self.queues, self.max_msg_size)
        except DiskQueueError as exc:
            raise NsqdImportError(f"importing nsqd's queues failed - {exc}") from exc

    def unlock(self) -> None:
        """Release the lock (a no-op if not held), and remove the directories :meth:`lock`
        created that are still empty."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        created, self._created = self._created, []
        for directory in created:
            try:
                directory.rmdir()  # only an empty one: whatever was written there stays
            except OSError:
                break
