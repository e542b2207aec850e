"""The append end of the queue: the segment being written and the finished ones awaiting fsync."""

from __future__ import annotations

import os

from . import fileops
from .format import HEADER_SIZE, encode_header, segment_filename

__all__ = ["SegmentWriter"]

_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
_APPEND_FLAGS = os.O_WRONLY | os.O_CLOEXEC


class SegmentWriter:
    """Writes whole records at the end of the current segment.

    Data goes straight to the file with ``pwrite`` (no user-space buffer), so once a write
    returns it is in the page cache and visible to readers, and an fsync of the descriptor
    covers it. A segment is created lazily by the first write into it. ``roll()`` moves the
    finished segment's descriptor to ``rolled``: it stays open until a sync has fsynced it.
    The owner closes descriptors; this class never closes one that it handed out.
    """

    __slots__ = ("_dir", "_name", "number", "pos", "seq", "fd", "rolled", "created", "dirty", "_stale_tail")

    def __init__(self, data_path: str, name: str, number: int, pos: int, seq: int, exists: bool) -> None:
        self._dir = data_path
        self._name = name
        self.number = number
        self.pos = pos
        self.seq = seq
        self.fd: int | None = None
        self.rolled: list[tuple[int, int]] = []
        self.created = False  # a segment file was created since the last directory fsync
        self.dirty = False  # bytes written to ``fd`` since it was last handed to a sync
        self._stale_tail = False  # a failed write may have left bytes past ``pos``
        if exists:
            self.fd = fileops.open(self.path(number), _APPEND_FLAGS)
            if fileops.fstat(self.fd).st_size > pos:
                self._stale_tail = True

    def path(self, number: int) -> str:
        """Path of segment ``number``."""
        return os.path.join(self._dir, segment_filename(self._name, number))

    def write(self, data: bytes | memoryview, records: int) -> None:
        """Append ``records`` complete records (``data``) to the current segment.

        All or nothing: on an ``OSError`` the segment is cut back to where it was and the
        error propagates; ``pos`` and ``seq`` advance only on success.
        """
        if self.fd is None:
            self._create()
        fd = self.fd
        assert fd is not None
        if self._stale_tail:
            fileops.ftruncate(fd, self.pos)
            self._stale_tail = False
        view = memoryview(data)
        pos = self.pos
        try:
            while view:
                written = fileops.pwrite(fd, view, pos)
                if written == 0:
                    raise OSError("pwrite wrote no bytes")
                view = view[written:]
                pos += written
        except OSError:
            if pos != self.pos:
                try:
                    fileops.ftruncate(fd, self.pos)
                except OSError:
                    self._stale_tail = True  # retried before the next write
            raise
        self.pos = pos
        self.seq += records
        self.dirty = True

    def _create(self) -> None:
        path = self.path(self.number)
        fd = fileops.open(path, _CREATE_FLAGS, 0o644)
        try:
            header = encode_header(self.number, self.seq)
            if fileops.pwrite(fd, header, 0) != len(header):
                raise OSError(f"short write of the header of {path}")
        except BaseException:
            fileops.close(fd)
            try:
                fileops.unlink(path)
            except OSError:
                pass
            raise
        self.fd = fd
        self.pos = HEADER_SIZE
        self.created = True
        self.dirty = True

    def roll(self) -> None:
        """Finish the current segment; the next write creates segment ``number + 1``."""
        if self.fd is not None:
            self.rolled.append((self.number, self.fd))
            self.fd = None
        self.number += 1
        self.pos = HEADER_SIZE
        self.dirty = False

    @property
    def is_empty_segment(self) -> bool:
        """True when the current segment holds no record yet (it may not exist)."""
        return self.pos <= HEADER_SIZE

    def take_rolled(self) -> list[tuple[int, int]]:
        """Hand the finished, unsynced segments' descriptors to a sync (which closes them)."""
        rolled, self.rolled = self.rolled, []
        return rolled

    def descriptors(self) -> list[int]:
        """Every descriptor this writer holds, for the owner to close."""
        fds = [fd for _, fd in self.rolled]
        if self.fd is not None:
            fds.append(self.fd)
        self.rolled = []
        self.fd = None
        return fds
