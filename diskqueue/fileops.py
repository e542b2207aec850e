"""The operating-system calls the disk queue makes, in one place.

Every module of the package reaches the file system through this module's names
(``fileops.pwrite(fd, data, pos)``, never ``os.pwrite``), so a test can put a recording
or fault-injecting implementation in their place with :func:`substitute` (the power-loss
simulation in ``tests/support/powercut.py`` does). The names are the ``os`` functions
themselves, bound at import: a call costs one module attribute lookup, as ``os.pwrite``
does. ``os.path`` string functions (``join``, ``dirname``) do no I/O and are called
directly.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "close",
    "exists",
    "fallocate",
    "fdatasync",
    "fstat",
    "fsync",
    "ftruncate",
    "getsize",
    "listdir",
    "makedirs",
    "open",
    "pread",
    "pwrite",
    "read_file",
    "rename",
    "replace",
    "stat",
    "substitute",
    "unlink",
    "write",
]


#: Bytes asked for by a file read's first system call: more than a checkpoint holds.
_FIRST_READ = 8192


def _read_file(path: str) -> bytes:
    """The whole contents of the file at ``path``. Raises ``OSError`` (``FileNotFoundError``).

    Plain system calls: a queue's checkpoint is read on every open, and a buffered file
    object costs more than the read itself for a file this small.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, _FIRST_READ)
        if len(data) < _FIRST_READ:
            return data
        chunks = [data]
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _no_fallocate(fd: int, offset: int, length: int) -> None:
    raise OSError(errno.EOPNOTSUPP, "posix_fallocate is not available on this platform")


open = os.open
close = os.close
pread = os.pread
pwrite = os.pwrite
write = os.write
fstat = os.fstat
stat = os.stat
ftruncate = os.ftruncate
# Reserves blocks and extends the file (with zero bytes) from offset to offset + length.
fallocate = getattr(os, "posix_fallocate", _no_fallocate)
fsync = os.fsync
# Data and size only: what a segment's records need (fsync where the platform has no fdatasync).
fdatasync = getattr(os, "fdatasync", os.fsync)
rename = os.rename
replace = os.replace
unlink = os.unlink
listdir = os.listdir
makedirs = os.makedirs
exists = os.path.exists
getsize = os.path.getsize
read_file = _read_file

_NAMES = frozenset(__all__) - {"substitute"}


def substitute(calls: Mapping[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """Replace the named calls (``{"pwrite": f, ...}``) for every module of the package.

    Returns the calls replaced, to pass back to ``substitute`` to restore them. Raises
    ``KeyError`` for a name that is not one of this module's calls (nothing is replaced).
    Meant for tests: swap before the queues are opened and restore after they are closed,
    because a call already running in a worker thread keeps the function it started with.
    """
    unknown = set(calls) - _NAMES
    if unknown:
        raise KeyError(f"not a file operation of diskqueue: {', '.join(sorted(unknown))}")
    module = globals()
    previous = {name: module[name] for name in calls}
    module.update(calls)
    return previous
