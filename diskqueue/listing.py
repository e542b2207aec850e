"""One listing of a data directory, handing each queue opened from it its own file names.

Opening a queue needs the names of its segment files, which takes a listing of the
directory. An owner that opens thousands of queues at once (a broker starting with
thousands of topics) would list the whole directory once per queue: time quadratic in the
number of queues. A ``DirectoryListing`` lists it once, groups the names by queue, and
each queue opened with it (``DiskQueue(..., listing=...)``, ``check(..., listing=...)``)
takes its group instead of listing the directory again.

A listing is a snapshot. A queue's files change only when that queue is opened or used, so
the snapshot stays true for every queue not yet handed its group, including every queue
that had no files: an owner that keeps the listing (and holds the directory, as a broker
does with its lock) opens queues it creates later without listing the directory again.
Once a queue was handed its group (:meth:`take`), later requests for the same name get
None and list the directory themselves, until the queue is deleted
(``DiskQueue.delete()`` tells the listing it opened from: :meth:`released`), after which
the name has no files again. The owner must not create or remove a queue's files by
other means while it keeps the listing, or must tell it (:meth:`released`).
"""

from __future__ import annotations

import os
import re

from . import fileops

__all__ = ["DirectoryListing", "QUEUE_INFIX"]

#: What every queue file name holds after the queue's name: ``<name>.diskqueue.<rest>``,
#: where ``<rest>`` (``000000.dat``, ``meta.dat``, ``meta.dat.tmp``, ``000000.dat.bad``)
#: never contains it again, so the last occurrence ends the name.
QUEUE_INFIX = ".diskqueue."
#: The rest of the name of a segment or checkpoint file: what makes a queue exist.
_QUEUE_FILE_REST = re.compile(r"(?:\d{6,}|meta)\.dat")


class DirectoryListing:
    """The queue file names in ``data_path``, from one listing made on construction.

    Raises ``OSError`` when the directory cannot be listed. Holds no file descriptors.
    """

    __slots__ = ("data_path", "_groups", "_taken")

    def __init__(self, data_path: str | os.PathLike[str]) -> None:
        self.data_path = os.fspath(data_path)
        groups: dict[str, list[str]] = {}
        for entry in fileops.listdir(self.data_path):
            at = entry.rfind(QUEUE_INFIX)
            if at > 0:
                groups.setdefault(entry[:at], []).append(entry)
        self._groups = groups
        self._taken: set[str] = set()

    def names(self) -> list[str]:
        """The names of the queues that had a segment or checkpoint file when the directory
        was listed, sorted."""
        skip = len(QUEUE_INFIX)
        return sorted(name for name, entries in self._groups.items()
                      if any(_QUEUE_FILE_REST.fullmatch(e, len(name) + skip) for e in entries))

    def peek(self, name: str) -> list[str] | None:
        """The file names (no directory) of queue ``name`` as listed, without handing them out;
        None once :meth:`take` handed them out."""
        if name in self._taken:
            return None
        return list(self._groups.get(name, ()))

    def take(self, name: str, data_path: str | None = None) -> list[str] | None:
        """The file names of queue ``name`` (``[]`` when it had none), for the one caller that
        opens the queue now; None when they were handed out before (the files may have
        changed since: list the directory). Raises ``ValueError`` when ``data_path`` is
        given and is not the listed directory."""
        if data_path is not None and data_path != self.data_path:
            raise ValueError(f"the listing is of {self.data_path!r}, not of {data_path!r}")
        if name in self._taken:
            return None
        self._taken.add(name)
        return list(self._groups.get(name, ()))

    def released(self, name: str) -> None:
        """Every segment and checkpoint file of queue ``name`` was removed (the queue was
        deleted): the next :meth:`take` gives ``[]`` without listing the directory."""
        self._taken.discard(name)
        self._groups.pop(name, None)
