"""The read end of the queue: the read and committed cursors, and reading past damage.

``QueueReader`` is to reading what ``SegmentWriter`` is to writing: it holds the read
cursor (the next record ``read_many`` hands out), the committed cursor (the ack floor), the
records handed out in between (``pending.py``), the segment being read and where reading it
stops, and what reading found damaged. ``SegmentReader`` does the I/O: large positioned
reads into a buffer, records sliced out of it.

Damage. When a record is invalid, reading resumes at the next valid record after it (see
``scan.resync``) and the segment is set aside once consumed; when none follows, reading
that segment stops there and goes on with the next one. How many records were lost is
known when the reader leaves a segment: the next segment's header holds the sequence
number of its first record. Nothing is ever appended after damage: when it is in the
segment being written, the writer moves on to a new segment.
"""

from __future__ import annotations

import logging
import os
from bisect import bisect_right
from collections.abc import Iterator

from . import fileops
from .checkpoint import Checkpoint, Cursor
from .format import HEADER_SIZE, decode_records, next_record_size
from .pending import Uncommitted
from .scan import read_header, resync
from .writer import SegmentWriter

__all__ = ["READ_CHUNK", "QueueReader", "SegmentReader"]

READ_CHUNK = 1 << 20


class SegmentReader:
    """Reads records from one segment file through a read-ahead buffer.

    One ``pread`` fills the buffer with up to ``READ_CHUNK`` bytes (more for a record that
    needs it), never past the caller's ``limit``, so the buffer holds only bytes the writer
    has finished. Records are decoded from it with ``struct.unpack_from`` and slicing; their
    checksums are verified per batch. Owns its descriptor; ``close()`` releases it.
    """

    __slots__ = ("number", "fd", "size", "_buf", "_buf_start")

    def __init__(self, path: str, number: int) -> None:
        self.number = number
        self.fd = fileops.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self.size = fileops.fstat(self.fd).st_size
        self._buf = b""
        self._buf_start = 0

    def read(
        self, pos: int, want: int, limit: int, min_size: int, max_size: int
    ) -> tuple[list[bytes], int, str | None]:
        """Up to ``want`` records starting at byte ``pos``, not reading past ``limit``.

        Returns ``(payloads, next_pos, problem)``; ``problem`` names why the record at
        ``next_pos`` is invalid (the payloads before it are valid), else None.
        """
        out: list[bytes] = []
        while want > 0 and pos < limit:
            buf = self._buf
            rel = pos - self._buf_start
            if 0 <= rel < len(buf):
                got, rel, problem = decode_records(buf, rel, want, min_size, max_size)
                if got:
                    if out:
                        out.extend(got)
                    else:
                        out = got
                    want -= len(got)
                    pos = self._buf_start + rel
                if problem is not None:
                    return out, pos, problem
                if want == 0 or pos >= limit:
                    break
            else:
                rel = len(buf)
            need, problem = next_record_size(buf, rel, max_size)
            if problem is not None:
                return out, pos, problem
            size = min(limit - pos, max(READ_CHUNK, need))
            if size < need:
                return out, pos, "record extends past the end of the segment"
            buf = fileops.pread(self.fd, size, pos)
            if len(buf) < size:
                self._buf = b""
                return out, pos, f"segment ends at {pos + len(buf)}, before {pos + size}"
            self._buf = buf
            self._buf_start = pos
        return out, pos, None

    def close(self) -> None:
        """Release the descriptor and the buffer."""
        self._buf = b""
        fileops.close(self.fd)


class QueueReader:
    """The read side of one queue (see the module docstring); owned by its ``DiskQueue``.

    ``writer`` is the queue's writer (where the written data ends; rolled on damage in the
    segment being written) and ``segments`` its list of segment numbers, which the queue
    changes in place only. ``bad`` maps a damaged segment to where reading it stops,
    ``accounted`` lists the segments whose loss is already counted; both are in the
    checkpoint. ``file``/``pos``/``seq`` are the read cursor (``at`` as a ``Cursor``),
    ``committed`` the committed one. ``depth`` counts the records written and not yet read
    (the queue adds what it writes), ``lost`` the records found lost since the queue was
    opened. After a read that moved to another segment or found damage, ``changed`` is set;
    the queue resets it. Owns the descriptor of the segment it reads; ``close()`` releases it.
    """

    __slots__ = ("_writer", "_segments", "_min", "_max", "_auto", "_name", "_log", "file", "pos", "seq",
                 "_committed", "end", "segment", "pending", "bad", "accounted", "depth", "lost", "changed")

    def __init__(self, writer: SegmentWriter, segments: list[int], start: Cursor, depth: int, lost: int,
                 bad: dict[int, int], accounted: set[int], min_size: int, max_size: int, auto_commit: bool,
                 name: str, log: logging.Logger) -> None:
        self._writer = writer
        self._segments = segments
        self._min = min_size
        self._max = max_size
        self._auto = auto_commit
        self._name = name
        self._log = log
        # the read cursor, as plain fields (like SegmentWriter's): it moves on every read
        self.file, self.pos, self.seq = start.file, start.pos, start.seq
        self._committed: Cursor | None = start  # None: at the read cursor (auto_commit keeps it there)
        self.end: int | None = None  # where reading the read segment stops, once it is finished
        self.segment: SegmentReader | None = None
        self.pending = Uncommitted()
        self.bad = bad
        self.accounted = accounted
        self.depth = depth
        self.lost = lost
        self.changed = False

    @property
    def at(self) -> Cursor:
        """The read cursor."""
        return Cursor(self.file, self.pos, self.seq)

    @property
    def committed(self) -> Cursor:
        """The committed cursor (the ack floor)."""
        c = self._committed
        return Cursor(self.file, self.pos, self.seq) if c is None else c

    def read(self, want: int) -> list[bytes]:
        """Up to ``want`` records from the read cursor on, moving it (and, with
        ``auto_commit``, the committed cursor); invalid data is read past, never returned."""
        w = self._writer
        out: list[bytes] | None = None
        while want:
            file, pos = self.file, self.pos
            if file == w.number:
                limit = w.pos
                if pos >= limit:
                    break
                if self.segment is None and not self._open():
                    continue
            else:
                if self.end is None and not self._open():
                    continue
                end = self.end
                assert end is not None  # _open sets it for a finished segment
                limit = end
                if pos >= limit:
                    self._cross()
                    continue
                if self.segment is None and not self._open():
                    continue
            segment = self.segment
            assert segment is not None
            try:
                got, self.pos, problem = segment.read(pos, want, limit, self._min, self._max)
            except OSError as exc:
                got, problem = [], f"read failed: {exc}"
            if got:
                n = len(got)
                if not self._auto:
                    self.pending.hand_out(file, pos, self.seq, got)
                self.seq += n
                want -= n
                if out is None:
                    out = got
                else:
                    out.extend(got)
            if problem is not None:
                self._corrupt(problem)
        self._cross_finished()
        if out is None:
            return []
        n = len(out)
        if n > self.depth:
            self._log.error("DISKQUEUE(%s): depth %d below records read %d; correcting", self._name, self.depth, n)
            self.depth = n
        self.depth -= n
        if self.depth and self.file == w.number and self.pos >= w.pos:
            self._log.error("DISKQUEUE(%s): reader caught up with depth %d left; correcting to 0",
                            self._name, self.depth)
            self.depth = 0
        if self._auto:
            self._committed = None
        return out

    def commit(self, n: int | None) -> bool | None:
        """Move the committed cursor past the ``n`` oldest handed-out records (all when None).

        Returns whether it moved to another segment, None when ``n`` is 0. Raises
        ``ValueError`` when ``n`` is negative or more than were handed out.
        """
        count = self.pending.count
        if n is None:
            n = count
        if n < 0 or n > count:
            raise ValueError(f"cannot commit {n} record(s): {count} uncommitted")
        if not n:
            return None
        c = self.pending.commit(n)
        if not self.pending:
            c = self.at
        moved_file = c.file != self.committed.file
        self._committed = c
        return moved_file

    def peek(self, max_records: int) -> list[bytes]:
        """Up to ``max_records`` of the records ``read`` would return next; nothing moves."""
        w = self._writer
        at = self.at
        out: list[bytes] = []
        later = [n for n in self._segments if n > at.file]
        if w.number > at.file and w.number not in later:
            later.append(w.number)
        for number in [at.file, *later]:
            want = max_records - len(out)
            if want <= 0 or (number == w.number and w.fd is None):
                break  # enough, or the write segment is not created yet
            out.extend(self.records(number, at.pos if number == at.file else HEADER_SIZE, want))
        return out

    def scan(self, batch: int) -> Iterator[list[bytes]]:
        """What ``peek`` of every record would return, ``batch`` records at most at a time (see
        ``DiskQueue.scan``); each segment is read through a reader of its own."""
        w = self._writer
        at = self.at
        later = [n for n in self._segments if n > at.file]
        if w.number > at.file and w.number not in later:
            later.append(w.number)
        for number in [at.file, *later]:
            if number == w.number and w.fd is None:
                return  # the write segment is not created yet
            limit = w.pos if number == w.number else self.end if number == self.file else self.bad.get(number)
            try:
                reader = SegmentReader(w.path(number), number)
            except OSError:
                continue
            try:
                start = at.pos if number == at.file else HEADER_SIZE
                end = reader.size if limit is None else limit
                while start < end:
                    got, start, problem = reader.read(start, batch, end, self._min, self._max)
                    if got:
                        yield got
                    if problem is not None:
                        resume = resync(reader.fd, start, end, self._min, self._max)
                        if resume is None:
                            break
                        start = resume
                    elif not got:
                        break
            except OSError:
                pass
            finally:
                reader.close()

    def records(self, number: int, start: int, want: int) -> list[bytes]:
        """Up to ``want`` valid records of segment ``number`` from offset ``start`` on, moving nothing."""
        w = self._writer
        if number == w.number:
            limit: int | None = w.pos
        elif number == self.file and self.end is not None:
            limit = self.end
        else:
            limit = self.bad.get(number)
        out: list[bytes] = []
        own = self.segment if number == self.file else None
        try:
            reader = own if own is not None else SegmentReader(w.path(number), number)
        except OSError:
            return out
        try:
            # a fresh reader's size is current; the queue's own reader always has a limit
            end = reader.size if limit is None else limit
            while want > 0 and start < end:
                got, start, problem = reader.read(start, want, end, self._min, self._max)
                out.extend(got)
                want -= len(got)
                resume = None if problem is None else resync(reader.fd, start, end, self._min, self._max)
                if resume is None:
                    break
                start = resume
        except OSError:
            pass
        finally:
            if own is None:
                reader.close()
        return out

    def newest(self, since_ns: int) -> Iterator[list[bytes]]:
        """The records of each segment file, newest first (see ``DiskQueue.newest_records``)."""
        w = self._writer
        numbers = sorted(set(self._segments) | ({w.number} if w.fd is not None else set()), reverse=True)
        for number in numbers:
            if since_ns:
                try:
                    if fileops.stat(w.path(number)).st_mtime_ns < since_ns:
                        return
                except OSError:
                    continue
            yield self.records(number, HEADER_SIZE, 1 << 62)

    def checkpoint(self, write: Cursor, note: bytes) -> Checkpoint:
        """The checkpoint of this read side, with the written end ``write`` and the owner's ``note``."""
        committed = self.committed
        floor = committed.file
        return Checkpoint(
            commit=committed,
            write=write,
            depth=self.depth + self.pending.count,
            bad=tuple(sorted((f, e) for f, e in self.bad.items() if f >= floor)),
            accounted=tuple(sorted(f for f in self.accounted if f >= floor)),
            note=note,
        )

    def roll_writer(self) -> None:
        """Finish the segment being written (``SegmentWriter.roll``), noting where reading it stops."""
        w = self._writer
        finished, end = w.number, w.pos
        w.roll()
        if self.file == finished:
            self.end = min(end, self.bad.get(finished, end))

    def forget(self, removed: set[int]) -> None:
        """Segments removed from the disk: drop what is known of their damage."""
        for number in removed:
            self.bad.pop(number, None)
            self.accounted.discard(number)

    def close(self) -> None:
        """Release the descriptor of the segment being read."""
        if self.segment is not None:
            self.segment.close()
            self.segment = None

    def _open(self) -> bool:
        """Open the read segment; on failure mark it corrupt and return False."""
        number = self.file
        try:
            segment = SegmentReader(self._writer.path(number), number)
        except OSError as exc:
            self._corrupt(f"cannot open segment: {exc}")
            return False
        self.segment = segment
        if number != self._writer.number:
            self.end = min(segment.size, self.bad.get(number, segment.size))
        return True

    def _corrupt(self, problem: str) -> None:
        """Read past the invalid record at the read cursor, or stop reading its segment there.

        When a valid record follows (see ``resync``) reading resumes at it and the segment
        is set aside once consumed; the records skipped are counted when the reader leaves
        the segment. Otherwise reading stops at the damage and ``_cross`` skips to the next
        segment.
        """
        number, pos = self.file, self.pos
        w = self._writer
        limit = w.pos if number == w.number else self.end
        resume = None
        if self.segment is not None and limit is not None:
            resume = resync(self.segment.fd, pos, limit, self._min, self._max)
        self.changed = True
        if resume is not None and limit is not None:
            self._log.warning("DISKQUEUE(%s): segment %06d offset %d: %s; skipped %d byte(s) "
                              "to the next valid record", self._name, number, pos, problem, resume - pos)
            self.bad[number] = max(limit, self.bad.get(number, 0))
            if self._committed is None:
                self._committed = self.at  # it stays where it is until records are read
            self.pos = resume
        else:
            self._log.warning("DISKQUEUE(%s): segment %06d offset %d: %s; skipping to the next segment",
                              self._name, number, pos, problem)
            self.bad[number] = pos
        if number == w.number:
            self.roll_writer()  # nothing more may be appended after damage: write into a new segment
        if resume is None:
            self.end = pos

    def _cross_finished(self) -> None:
        """Move the read cursor off segments that have been read to their end."""
        w = self._writer
        while self.file != w.number:
            if self.end is None and not self._open():
                continue
            assert self.end is not None
            if self.pos < self.end:
                return
            self._cross()

    def _cross(self) -> None:
        """Move the read cursor from the end of the read segment to the start of the next."""
        left, end, seq = self.file, self.pos, self.seq
        self.close()
        w = self._writer
        i = bisect_right(self._segments, left)
        nxt = self._segments[i] if i < len(self._segments) else w.number
        if nxt == w.number and w.fd is None:
            first: int | None = w.seq  # the write segment is not created yet
        else:
            header, _, problem = read_header(w.path(nxt), nxt)
            first = header.first_seq if header is not None else None
            if header is None:
                self._log.warning("DISKQUEUE(%s): segment %06d: %s; skipping it", self._name, nxt, problem)
                self.bad[nxt] = HEADER_SIZE
                if nxt == w.number:
                    self.roll_writer()
        if first is None:
            first = seq
        else:
            self._count_loss(left, end, nxt, first, seq)
        self.file, self.pos, self.seq = nxt, HEADER_SIZE, first
        self.end = None
        if self.pending:
            self.pending.crossed(left, end, self.at)
        else:
            self._committed = self.at
        self.changed = True

    def _count_loss(self, left: int, end: int, nxt: int, first: int, seq: int) -> None:
        """The reader left segment ``left`` at offset ``end``, having counted up to record
        ``seq``, for segment ``nxt``, whose first record is ``first``."""
        lost = first - seq
        if lost > 0 and left not in self.accounted:
            self.accounted.add(left)
            self.lost += lost
            self.depth = max(0, self.depth - lost)
            if left in self.bad:
                self._log.warning("DISKQUEUE(%s): %d record(s) lost to damage in segment %06d",
                                  self._name, lost, left)
            else:
                self._log.warning("DISKQUEUE(%s): %d record(s) lost between segment %06d offset %d and "
                                  "segment %06d", self._name, lost, left, end, nxt)
        elif lost < 0:
            self._log.warning("DISKQUEUE(%s): segment %06d starts at record %d, behind %d",
                              self._name, nxt, first, seq)
