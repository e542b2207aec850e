"""The append end of the queue: the segment being written and the finished ones awaiting fsync."""

from __future__ import annotations

import os
from collections.abc import Callable

from . import fileops
from .batch import RecordBatch
from .checkpoint import FILE_MODE, Cursor
from .errors import DiskQueueIOError, MessageSizeError, describe_os_error
from .format import HEADER_SIZE, RECORD_HEADER_SIZE, encode_header, segment_filename

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

    With ``preallocate`` > 0 the segment being written is extended ahead of its data, that
    many bytes at a time (``posix_fallocate``: blocks reserved, reading as zeros), so that
    most syncs find no change of the file's size or blocks to journal, only data: a
    ``fdatasync`` then costs one disk write instead of two. The zero bytes past the data are
    cut off when the segment is rolled (:meth:`roll`) and before the final sync
    (:meth:`trim`); after a crash, recovery reads them as the end of the data (zero bytes
    never form a valid record) and cuts them off.
    """

    __slots__ = ("_dir", "_name", "number", "pos", "seq", "fd", "rolled", "created", "dirty", "_stale_tail",
                 "preallocate", "_allocated", "_limit")

    def __init__(self, data_path: str, name: str, number: int, pos: int, seq: int, exists: bool,
                 preallocate: int = 0) -> None:
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
        self.preallocate = preallocate
        self._allocated = 0  # the current segment's size when it was last extended ahead
        self._limit = 0  # the most bytes a segment is extended to (the queue's segment size)
        if exists:
            self.fd = fileops.open(self.path(number), _APPEND_FLAGS)
            if fileops.fstat(self.fd).st_size > pos:
                self._stale_tail = True

    @classmethod
    def resume(cls, data_path: str, name: str, end: Cursor, exists: bool, preallocate: int = 0) -> SegmentWriter:
        """The writer after recovery found the written data ending at ``end``.

        Never append after bytes this process did not write: a record there that rots would
        make the reader skip the rest of the segment, new records included. So writing
        continues in a new segment when the last one already holds records.
        """
        if exists and end.pos > HEADER_SIZE:
            return cls(data_path, name, end.file + 1, HEADER_SIZE, end.seq, False, preallocate)
        return cls(data_path, name, end.file, end.pos, end.seq, exists, preallocate)

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
            self._allocated = 0
        view = memoryview(data)
        pos = self.pos
        if self.preallocate and pos + len(view) > self._allocated:
            self._extend(fd, pos + len(view))
        try:
            while view:
                written = fileops.pwrite(fd, view, pos)
                if written == 0:
                    raise OSError("pwrite wrote no bytes")
                view = view[written:]
                pos += written
        except OSError:
            if pos != self.pos or self._allocated:
                try:
                    fileops.ftruncate(fd, self.pos)
                    self._allocated = 0
                except OSError:
                    self._stale_tail = True  # retried before the next write
            raise
        self.pos = pos
        self.seq += records
        self.dirty = True

    def _extend(self, fd: int, end: int) -> None:
        """Extend the segment ahead of a write that ends at ``end`` (see the class docstring);
        where the file system refuses, the write extends it as usual."""
        size = max(end, min(end + self.preallocate, self._limit))
        start = max(self._allocated, self.pos)
        try:
            fileops.fallocate(fd, start, size - start)
        except OSError:
            # A refusal may have extended the file part of the way all the same: whatever is
            # past the data is cut off with the rest (a full disk refuses the write itself).
            try:
                self._allocated = fileops.fstat(fd).st_size
            except OSError:
                self._allocated = size
            return
        self._allocated = size

    def trim(self) -> None:
        """Cut the current segment's preallocated zero bytes off, so that it ends with its data
        (the next sync makes that stable). Raises ``OSError`` if the file system refuses."""
        if self.fd is not None and self._allocated > self.pos:
            fileops.ftruncate(self.fd, self.pos)
        self._allocated = 0

    def append(self, batch: RecordBatch, size_bounds: tuple[int, int], max_bytes: int, segments: list[int],
               roll: Callable[[], None]) -> None:
        """Append the records of ``batch``, one ``pwrite`` per segment, calling ``roll`` (which calls
        :meth:`roll`) whenever the next record would take the current segment past
        ``max_bytes``; a record bigger than a whole segment goes alone into one. Adds each
        segment written into to ``segments``.

        Raises ``MessageSizeError`` (nothing written) when a payload's size is outside
        ``size_bounds`` (inclusive), ``DiskQueueIOError`` naming the file when the OS
        refuses a write (its ``accepted`` records were written, the rest not).
        """
        lo, hi = size_bounds
        self._limit = max_bytes
        lengths = batch.lengths
        if batch.shortest < lo or batch.longest > hi:
            index = next(i for i, n in enumerate(lengths) if not lo <= n <= hi)
            raise MessageSizeError(lengths[index], lo, hi, index)
        count = len(lengths)
        if self.pos + batch.size <= max_bytes:
            self._append(batch.joined(), count, 0, segments)
            return
        parts = batch.parts
        i = 0
        while i < count:
            room = max_bytes - self.pos
            j, size = i, 0
            while j < count and size + lengths[j] + RECORD_HEADER_SIZE <= room:
                size += lengths[j] + RECORD_HEADER_SIZE
                j += 1
            if j == i:
                if not self.is_empty_segment:
                    try:
                        roll()
                    except OSError as exc:  # the finished segment's preallocated rest could not be cut off
                        what = describe_os_error("truncate", self.path(self.number), exc)
                        if i:
                            what += f" (the first {i} record(s) of the batch were written)"
                        raise DiskQueueIOError(what, errno=exc.errno, accepted=i) from exc
                    continue
                j = i + 1
            self._append(b"".join(parts[2 * i : 2 * j]), j - i, i, segments)
            i = j

    def _append(self, data: bytes, count: int, accepted: int, segments: list[int]) -> None:
        try:
            self.write(data, count)
        except OSError as exc:
            # creating the segment is the only call here that names a file
            what = describe_os_error("open", exc.filename, exc) if exc.filename else \
                describe_os_error("write", self.path(self.number), exc)
            if accepted:
                what += f" (the first {accepted} record(s) of the batch were written)"
            raise DiskQueueIOError(what, errno=exc.errno, accepted=accepted) from exc
        if not segments or segments[-1] != self.number:
            segments.append(self.number)

    def _create(self) -> None:
        path = self.path(self.number)
        fd = fileops.open(path, _CREATE_FLAGS, FILE_MODE)
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
        """Finish the current segment; the next write creates segment ``number + 1``.

        Raises ``OSError`` (nothing changed) if its preallocated rest cannot be cut off."""
        self.trim()
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
