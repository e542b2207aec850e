"""A disk that refuses, simulated: ``diskqueue.fileops`` calls that fail with a chosen errno.

:class:`FaultyDisk` takes the place of the file layer the disk queues and ``nsqd.dat`` go
through (``diskqueue/fileops.py``). While :attr:`FaultyDisk.error` is set, calls on files
whose name ``matches`` fail with that ``OSError``: with ``EROFS`` (a file system gone
read-only) every call that would change a file (``pwrite``/``write``, ``ftruncate``,
``fsync``/``fdatasync``, opening for writing, ``rename``/``replace``, ``unlink``); with
``ENOSPC`` (a full disk) only those that need new space: writes and creating a file. Reads
go through, as on a real full or read-only disk.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from typing import Any

from diskqueue import fileops
from tests.support.file_layer import FileLayer

__all__ = ["FULL_DISK_CALLS", "FaultyDisk"]

#: The calls a full disk refuses (a read-only file system refuses every change).
FULL_DISK_CALLS = frozenset({"pwrite", "write", "fallocate", "create"})
_EVERY_CHANGE = FULL_DISK_CALLS | {"open", "ftruncate", "fsync", "rename", "unlink"}
_WRITING = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class FaultyDisk(FileLayer):
    """The disk queues' file layer with faults switched on and off by the test.

    ``matches`` picks the files (by name, without the directory) that fail; every file by
    default. Install it with :meth:`installed` around the broker's whole life (a call
    already running in a worker thread keeps the function it started with). Thread-safe.
    """

    def __init__(self, matches: Callable[[str], bool] = lambda name: True):
        self.matches = matches
        self.error: int | None = None
        self.refused = 0  # calls that failed so far
        self._lock = threading.Lock()
        self._names: dict[int, str] = {}

    @property
    def calls_failing(self) -> frozenset[str]:
        """The kinds of call that fail now (see the module docstring)."""
        return FULL_DISK_CALLS if self.error == errno.ENOSPC else _EVERY_CHANGE

    def fail(self, error: int | None) -> None:
        """Make matching changes fail with ``error`` from now on (None: succeed again)."""
        self.error = error

    def calls(self) -> dict[str, Callable[..., Any]]:
        """The replacements: each refuses when it must, then makes the real call."""
        real = {name: getattr(fileops, name) for name in
                ("open", "close", "pwrite", "write", "fallocate", "ftruncate", "fsync", "fdatasync", "rename",
                 "replace", "unlink")}

        def refuse(call: str, name: str | None) -> None:
            error = self.error
            if error is not None and call in self.calls_failing and name is not None and self.matches(name):
                with self._lock:
                    self.refused += 1
                raise OSError(error, os.strerror(error))

        def by_fd(call: str, function: Callable[..., Any]) -> Callable[..., Any]:
            def wrapped(fd: int, *args: Any) -> Any:
                refuse(call, self._names.get(fd))
                return function(fd, *args)
            return wrapped

        def by_path(call: str, function: Callable[..., Any]) -> Callable[..., Any]:
            def wrapped(path: Any, *args: Any) -> Any:
                refuse(call, os.path.basename(os.fspath(path)))
                return function(path, *args)
            return wrapped

        def open_(path: Any, flags: int, mode: int = 0o777) -> int:
            name = os.path.basename(os.fspath(path))
            if flags & _WRITING:
                creating = flags & (os.O_CREAT | os.O_TRUNC) and not os.path.isdir(path)
                refuse("create" if creating else "open", name)
            fd = real["open"](path, flags, mode)
            with self._lock:
                self._names[fd] = name
            return fd

        def close(fd: int) -> None:
            with self._lock:
                self._names.pop(fd, None)
            real["close"](fd)

        return {
            "open": open_,
            "close": close,
            "pwrite": by_fd("pwrite", real["pwrite"]),
            "write": by_fd("write", real["write"]),
            "fallocate": by_fd("fallocate", real["fallocate"]),
            "ftruncate": by_fd("ftruncate", real["ftruncate"]),
            "fsync": by_fd("fsync", real["fsync"]),
            "fdatasync": by_fd("fsync", real["fdatasync"]),
            "rename": by_path("rename", real["rename"]),
            "replace": by_path("rename", real["replace"]),
            "unlink": by_path("unlink", real["unlink"]),
        }

