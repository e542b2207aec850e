"""The data directory: its lock, its disk queues and its metadata file, handed to the broker together."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from broker.config.options import Options
from broker.storage.metadata import MetadataFile
from broker.storage.queuestore import QueueStore

__all__ = ["DataDirectory", "DataPathLocked"]


class DataPathLocked(RuntimeError):
    """Another process holds the data directory."""


class DataDirectory:
    """``--data-path`` (the current directory if empty); implements :class:`broker.core.host.BrokerStorage`.

    :meth:`lock` creates the directory and takes an exclusive ``flock`` on it
    for the life of the broker, so two brokers never share one.
    """

    def __init__(self, options: Options):
        self.path = Path(options.data_path or os.getcwd()).resolve()
        self.queues = QueueStore(self.path, options)
        self.metadata = MetadataFile(self.path)
        self._lock_fd: int | None = None

    def lock(self) -> None:
        """Create and lock the directory. Raises :class:`DataPathLocked` if another broker holds it."""
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise DataPathLocked(f"--data-path={self.path} in use (possibly by another instance of nsqd)") from None
        self._lock_fd = fd

    def unlock(self) -> None:
        """Release the lock (a no-op if not held)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
