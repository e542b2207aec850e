"""``DiskQueue``: an append-only, segmented, crash-recoverable FIFO of byte strings.

The file layout is in ``format.py``, the checkpoint in ``checkpoint.py``, what happens on
open in ``recovery.py``.

Cursors. Three positions ``(segment, offset, seq)`` move through the segments:
``write`` (the end), ``read`` (the next record ``read_many`` hands out) and ``commit`` (the
ack floor: records before it are done). The checkpoint stores ``commit``; after a crash or
restart reading resumes there, so records handed out but not committed come back. With
``auto_commit=True`` (nsqd's behaviour) every read commits.

Which calls are async, and why:

* ``put``/``put_many``/``read_many``/``peek_many``/``commit``/``empty``/``delete``, the
  ``depth`` and ``uncommitted`` attributes and ``statistics()`` are plain methods. They do no fsync:
  writes are one ``pwrite`` per batch into the page cache, reads one ``pread`` per
  megabyte. That costs about as much as copying the bytes, so they run inline, and being
  synchronous keeps "put then enqueue" atomic for the owner. ``empty``/``delete`` unlink a
  handful of files inline.
* ``sync()`` is async: fsyncs and the checkpoint's rename and directory fsync take
  milliseconds, so they run in ``trio.to_thread.run_sync``. While it runs the owner may keep
  calling ``put_many``/``read_many``/``commit``: the sync captures the cursors and the
  descriptors to fsync at one instant, on the Trio thread, and the checkpoint it writes
  describes exactly that instant; data written later is covered by the next sync. Writes go
  straight to the file (no user-space buffer), so there is nothing to flush first.
  Descriptors are never closed while a worker thread may be fsyncing them: a finished
  segment's descriptor is closed by the sync that fsynced it, and ``empty()``/``delete()``
  during a sync defer their closes until the worker returns.
* ``run()`` is the sync policy loop, started by the owner in its nursery; ``close()`` is
  async because it waits for a running sync and does a final one.
* Construction is synchronous: recovery reads the checkpoint and verifies only what was
  written after it, so it is cheap; when the checkpoint cannot be trusted it counts every
  record, which blocks in proportion to the data. Writing then continues in a new segment
  when the last one already holds records: nothing is appended after bytes this process
  did not write, so damage found there later never hides newer records.

Sync policy (nsqd's): ``run()`` syncs once ``sync_every`` records have been written or
read since the last sync, within ``sync_timeout`` seconds of the first change not yet
synced, promptly after a segment roll and after a segment has been read to its end; and
``close()`` syncs. These syncs always write the checkpoint. While nothing needs a sync the
loop waits without a timeout (an idle queue costs no wake-ups), and with
``run_on_demand()`` it is not even started until the first change.

A segment roll happens inside ``put_many``, which cannot wait for an fsync: the finished
segment stays open, ``run()`` is woken, and the next sync fsyncs it (and the directory)
before writing a checkpoint that names anything after it. Consumed segments are removed
(or renamed ``.bad`` when corrupt) only by a sync, after a checkpoint whose committed
cursor is past them is durable: a crash never leaves the checkpoint pointing at a removed
file.

``sync()`` is the group commit: after many ``put_many`` calls one ``await sync()`` makes
all of them durable. When only records were added since the last checkpoint it is a
single data fsync: the checkpoint is a hint, and recovery keeps every complete,
checksum-valid record written after it. ``sync(commits=False)`` is always just that, and
leaves a moved committed cursor to the policy.

With ``inline_sync_below`` (seconds, 0 = never) such a sync of records only runs on the
calling thread, blocking it, while the previous one took less than that: on a disk whose
fdatasync takes a fraction of a millisecond, the hand-off to a worker thread and back costs
as much again. Once one takes longer, the next ones go to the worker thread until one of
those is quick again.
"""

from __future__ import annotations

import logging
import math
import os
import time
from bisect import bisect_right
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

import trio

from . import fileops
from .checkpoint import Checkpoint, Cursor, encode_checkpoint
from .checksum import warn_if_slow
from .errors import (
    DiskQueueClosed,
    DiskQueueError,
    DiskQueueIOError,
    MessageSizeError,
    describe_os_error,
    os_error_reason,
)
from .format import HEADER_SIZE, RECORD_HEADER_SIZE, frame_records, meta_filename, segment_filename
from .listing import DirectoryListing
from .pending import Uncommitted
from .reader import SegmentReader
from .recovery import recover
from .scan import list_segments, read_header, resync
from .statistics import DiskQueueStatistics
from .sync import Guard, SyncJob
from .writer import SegmentWriter

__all__ = ["DiskQueue"]

DEFAULT_MAX_BYTES_PER_FILE = 104857600
DEFAULT_MAX_MSG_SIZE = 1048576 + 26
DEFAULT_SYNC_EVERY = 2500
DEFAULT_SYNC_TIMEOUT = 2.0

class _Spawner(Protocol):
    """What :meth:`DiskQueue.run_on_demand` starts the policy loop in: a nursery, or a wrapper."""

    def start_soon(self, async_fn: Callable[[], Awaitable[Any]]) -> Any: ...


# What a sync writes besides the data fsync: always a checkpoint (the policy, close), one
# when the checkpoint's content changed (sync()), none (sync(commits=False)).
_FULL, _AUTO, _RECORDS = 0, 1, 2


class DiskQueue:
    """Append-only segment queue; one owner, used from one Trio thread.

    ``name`` names the files (``<name>.diskqueue.NNNNNN.dat`` and ``.meta.dat``) in the
    directory ``data_path``, which is created if missing. Opening recovers synchronously
    (see ``recovery.py``); it finds the queue's files in ``listing`` (a
    :class:`~diskqueue.listing.DirectoryListing` of ``data_path``, shared by many queues
    opened at once, and told by ``delete()`` that the queue's files are gone) when given,
    else by listing the directory. The queue owns its file descriptors; ``close()`` or ``delete()``
    releases them. Raises ``FormatVersionError`` for files of a newer format,
    ``OSError`` when the directory cannot be read and ``ValueError`` for invalid arguments
    (a listing of another directory among them).
    """

    __slots__ = (
        "name", "data_path", "_max_bytes", "_min", "_max", "_sync_every", "_sync_timeout",
        "_auto", "_log", "_writer", "_segments", "_reader", "_r_file", "_r_pos", "_r_seq",
        "_r_end", "_c_file", "_c_pos", "_c_seq", "_depth", "_pending", "_bad", "_accounted", "_ops", "_dirty", "_meta_dirty", "_records_lost", "_syncs",
        "_last_sync_error", "_sync_lock", "_wakeup", "_idle", "_changed_at", "_spawn", "_guard", "_sync_active", "_inline_below", "_records_sync_s",
        "_deferred_close", "_closed", "_deleted", "_listing", "_close_done", "_meta_path", "_note",
    )

    def __init__(
        self,
        name: str,
        data_path: str | os.PathLike[str],
        *,
        max_bytes_per_file: int = DEFAULT_MAX_BYTES_PER_FILE,
        min_msg_size: int = 0,
        max_msg_size: int = DEFAULT_MAX_MSG_SIZE,
        sync_every: int = DEFAULT_SYNC_EVERY,
        sync_timeout: float = DEFAULT_SYNC_TIMEOUT,
        auto_commit: bool = True,
        logger: logging.Logger | None = None,
        inline_sync_below: float = 0.0,
        listing: DirectoryListing | None = None,
    ) -> None:
        if not name or os.sep in name or name in (".", ".."):
            raise ValueError(f"invalid disk queue name {name!r}")
        if max_bytes_per_file <= HEADER_SIZE + RECORD_HEADER_SIZE:
            raise ValueError(f"max_bytes_per_file {max_bytes_per_file} is too small")
        if not 0 <= min_msg_size <= max_msg_size < 1 << 32:
            raise ValueError(f"message size bounds [{min_msg_size}, {max_msg_size}] are invalid")
        if sync_every < 1 or not sync_timeout > 0:
            raise ValueError("sync_every must be >= 1 and sync_timeout > 0")
        self.name = name
        self.data_path = os.fspath(data_path)
        self._max_bytes = max_bytes_per_file
        self._min = min_msg_size
        self._max = max_msg_size
        self._sync_every = sync_every
        self._sync_timeout = sync_timeout
        self._inline_below = inline_sync_below
        self._records_sync_s = 0.0  # how long the last sync of records only took
        self._auto = auto_commit
        self._log = logger if logger is not None else logging.getLogger("diskqueue")
        self._meta_path = os.path.join(self.data_path, meta_filename(name))
        entries = None
        self._listing = listing
        if listing is not None:
            if listing.data_path != self.data_path:
                raise ValueError(f"the listing is of {listing.data_path!r}, not of {self.data_path!r}")
            entries = listing.take(name)
        if entries is None:
            fileops.makedirs(self.data_path, exist_ok=True)  # a listing found it there already
        warn_if_slow(self._log)

        found = recover(self.data_path, name, min_msg_size, max_msg_size, entries=entries)
        for note in found.notes:
            self._log.info("DISKQUEUE(%s): %s", name, note)
        for problem in found.problems:
            self._log.warning("DISKQUEUE(%s): %s", name, problem)
        if found.lost:
            self._log.warning("DISKQUEUE(%s): %d record(s) lost to damaged or missing files", name, found.lost)

        w = found.write
        if found.write_exists and w.pos > HEADER_SIZE:
            # Never append after bytes this process did not write: a record there that rots
            # would make the reader skip the rest of the segment, new records included.
            self._writer = SegmentWriter(self.data_path, name, w.file + 1, HEADER_SIZE, w.seq, False)
        else:
            self._writer = SegmentWriter(self.data_path, name, w.file, w.pos, w.seq, found.write_exists)
        self._segments = found.segments
        c = found.commit
        self._r_file, self._r_pos, self._r_seq = c.file, c.pos, c.seq
        self._c_file, self._c_pos, self._c_seq = c.file, c.pos, c.seq
        self._reader: SegmentReader | None = None
        self._r_end: int | None = None
        self._depth = found.depth
        self._pending = Uncommitted()
        self._bad = found.bad
        self._accounted = found.accounted
        self._ops = 0
        self._dirty = bool(found.notes or found.problems)
        self._meta_dirty = self._dirty  # checkpoint content other than the write cursor changed
        self._records_lost = found.lost
        self._note = found.note
        self._syncs = 0
        self._last_sync_error: str | None = None
        self._sync_lock = trio.Lock()
        self._wakeup = trio.Event()
        self._idle = True  # no policy loop is timing a sync: the next change must wake one
        self._changed_at = math.inf  # when the change that ended the last idle spell was made
        self._spawn: _Spawner | None = None
        self._guard = Guard()
        self._sync_active = False
        self._deferred_close: list[int] = []
        self._closed = False
        self._deleted = False
        self._close_done: trio.Event | None = None

    # -- state ---------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Records written and not yet read."""
        return self._depth

    @property
    def read_seq(self) -> int:
        """The sequence number of the next record ``read_many`` hands out.

        Records are numbered in write order from 0 for the life of the queue's files
        (``empty()`` keeps counting), so a batch read in one call is numbered
        ``read_seq`` (before the call) onwards, unless the call read past damage
        (see ``damage_found``).
        """
        return self._r_seq

    @property
    def write_seq(self) -> int:
        """The sequence number the next record written gets: every ``put_many`` that
        wrote something moved it, so comparing it before and after a call tells whether
        the call wrote to the disk."""
        return self._writer.seq

    @property
    def note(self) -> bytes:
        """The owner's note: bytes kept in the checkpoint beside the cursors it describes.

        Setting it marks the checkpoint for rewriting: the next ``sync()`` (or the policy's)
        writes it together with the committed cursor as it is then, and after a restart
        the note is what the last checkpoint held (empty when there was none, it was
        unreadable, or ``empty()`` dropped it). An owner keeps there what it knows of the
        records past the committed cursor, such as which are done.
        """
        return self._note

    @note.setter
    def note(self, value: bytes) -> None:
        self._check_open()
        if value != self._note:
            self._note = bytes(value)
            self._dirty = self._meta_dirty = True
            if self._idle:
                self._wake()

    @property
    def damage_found(self) -> bool:
        """Whether damaged or missing data was found (on open or while reading).

        Records read after damage in the same segment are numbered as if none had been lost
        until the reader leaves the segment, so ``read_seq`` may then run behind.
        """
        return bool(self._bad or self._records_lost)

    @property
    def uncommitted(self) -> int:
        """Records read (handed out) and not yet committed; always 0 with ``auto_commit``."""
        return self._pending.count

    @property
    def sync_needed(self) -> bool:
        """Whether anything happened that the last sync does not cover."""
        w = self._writer
        return bool(self._dirty or w.dirty or w.rolled or w.created or self._removable())

    def statistics(self) -> DiskQueueStatistics:
        """A snapshot of the queue's counters and cursors."""
        w = self._writer
        return DiskQueueStatistics(
            name=self.name,
            depth=self._depth,
            uncommitted=self._pending.count,
            segments=len(self._segments),
            read_cursor=(self._r_file, self._r_pos),
            commit_cursor=(self._c_file, self._c_pos),
            write_cursor=(w.number, w.pos),
            records_written=w.seq,
            records_lost=self._records_lost,
            syncs=self._syncs,
            unsynced_operations=self._ops,
            sync_needed=self.sync_needed,
            last_sync_error=self._last_sync_error,
        )

    def _check_open(self) -> None:
        if self._closed:
            raise DiskQueueClosed(f"disk queue {self.name!r} is closed")

    def _removable(self) -> bool:
        return bool(self._segments) and self._segments[0] < self._c_file

    # -- writing -------------------------------------------------------------------------

    def put(self, payload: bytes) -> None:
        """Append one record. Raises like ``put_many``."""
        self.put_many((payload,))

    def put_many(self, payloads: Sequence[bytes] | Iterable[bytes]) -> None:
        """Append records, one ``pwrite`` per batch (per segment when the batch rolls over).

        Raises ``MessageSizeError`` (nothing written) when a payload is outside
        ``[min_msg_size, max_msg_size]``, ``DiskQueueIOError`` when the OS refuses the write
        (its ``accepted`` payloads were written; the rest were not), ``DiskQueueClosed``.
        """
        self._check_open()
        if not isinstance(payloads, list):
            payloads = list(payloads)
        count = len(payloads)
        if not count:
            return
        lengths = list(map(len, payloads))
        if min(lengths) < self._min or max(lengths) > self._max:
            index = next(i for i, n in enumerate(lengths) if not self._min <= n <= self._max)
            raise MessageSizeError(lengths[index], self._min, self._max, index)
        parts = frame_records(payloads, lengths)
        total = sum(lengths) + RECORD_HEADER_SIZE * count
        if self._writer.pos + total <= self._max_bytes:
            self._write(b"".join(parts), count, 0)
        else:
            self._write_rolling(parts, lengths)
        if self._idle or self._ops >= self._sync_every:
            self._wake()

    def _write_rolling(self, parts: list[bytes], lengths: list[int]) -> None:
        """Write a batch that does not fit the current segment, rolling as often as needed."""
        w = self._writer
        count = len(lengths)
        i = 0
        while i < count:
            room = self._max_bytes - w.pos
            j, size = i, 0
            while j < count and size + lengths[j] + RECORD_HEADER_SIZE <= room:
                size += lengths[j] + RECORD_HEADER_SIZE
                j += 1
            if j == i:
                if not w.is_empty_segment:
                    self._roll()
                    continue
                j = i + 1  # a record bigger than a whole segment goes alone into one
            self._write(b"".join(parts[2 * i : 2 * j]), j - i, i)
            i = j

    def _write(self, data: bytes, count: int, accepted: int) -> None:
        w = self._writer
        try:
            w.write(data, count)
        except OSError as exc:
            # creating the segment is the only call here that names a file
            what = describe_os_error("open", exc.filename, exc) if exc.filename else \
                describe_os_error("write", w.path(w.number), exc)
            if accepted:
                what += f" (the first {accepted} record(s) of the batch were written)"
            raise DiskQueueIOError(what, errno=exc.errno, accepted=accepted) from exc
        if not self._segments or self._segments[-1] != w.number:
            self._segments.append(w.number)
        self._depth += count
        self._ops += count
        self._dirty = True

    def _roll(self) -> None:
        w = self._writer
        finished, end = w.number, w.pos
        w.roll()
        if self._r_file == finished:
            self._r_end = min(end, self._bad.get(finished, end))
        self._wake()

    # -- reading -------------------------------------------------------------------------

    def read_many(self, max_records: int) -> list[bytes]:
        """Hand out up to ``max_records`` records, oldest first; ``[]`` when caught up.

        Advances the read cursor (and, with ``auto_commit``, the committed cursor). Invalid
        data is not returned: reading resumes at the next valid record after it (or, when
        none follows, at the next segment), and the records lost are counted and logged
        when the reader leaves the segment.
        Raises ``DiskQueueClosed``; read errors of the OS count as invalid data.
        """
        self._check_open()
        w = self._writer
        if max_records <= 0 or (self._r_file == w.number and self._r_pos >= w.pos):
            return []
        out: list[bytes] | None = None
        want = max_records
        while want:
            if self._r_file == w.number:
                limit = w.pos
                if self._r_pos >= limit:
                    break
                if self._reader is None and not self._open_reader():
                    continue
            else:
                if self._r_end is None and not self._open_reader():
                    continue
                end = self._r_end
                assert end is not None  # _open_reader sets it for a finished segment
                limit = end
                if self._r_pos >= limit:
                    self._cross()
                    continue
                if self._reader is None and not self._open_reader():
                    continue
            reader = self._reader
            assert reader is not None
            try:
                got, pos, problem = reader.read(self._r_pos, want, limit, self._min, self._max)
            except OSError as exc:
                got, pos, problem = [], self._r_pos, f"read failed: {exc}"
            if got:
                n = len(got)
                if not self._auto:
                    self._pending.hand_out(self._r_file, self._r_pos, self._r_seq, got)
                self._r_pos = pos
                self._r_seq += n
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
        if n > self._depth:
            self._log.error("DISKQUEUE(%s): depth %d below records read %d; correcting", self.name, self._depth, n)
            self._depth = n
        self._depth -= n
        self._ops += n
        self._dirty = True
        if self._auto:
            self._c_file, self._c_pos, self._c_seq = self._r_file, self._r_pos, self._r_seq
            self._meta_dirty = True
        if self._depth and self._r_file == w.number and self._r_pos >= w.pos:
            self._log.error("DISKQUEUE(%s): reader caught up with depth %d left; correcting to 0",
                            self.name, self._depth)
            self._depth = 0
        if self._idle or self._ops >= self._sync_every:
            self._wake()
        return out

    def peek_many(self, max_records: int) -> list[bytes]:
        """Up to ``max_records`` of the records ``read_many`` would hand out next, unchanged.

        Nothing moves: no cursor, no depth, no sync counter; damaged data is not marked
        (``read_many`` does that when it gets there): a peek reads past it as reading will. Opens the later segments it looks into
        and closes them before returning. Raises ``DiskQueueClosed``.
        """
        self._check_open()
        w = self._writer
        out: list[bytes] = []
        later = [n for n in self._segments if n > self._r_file]
        if w.number > self._r_file and w.number not in later:
            later.append(w.number)
        for number in [self._r_file, *later]:
            want = max_records - len(out)
            if want <= 0 or (number == w.number and w.fd is None):
                break  # enough, or the write segment is not created yet
            reading = number == self._r_file
            out.extend(self._segment_records(number, self._r_pos if reading else HEADER_SIZE, want))
        return out

    def newest_records(self, since_ns: int = 0) -> Iterator[list[bytes]]:
        """The records each segment file holds, newest segment first, oldest record first within one.

        Unlike ``peek_many`` this includes records already read and committed while their
        segment file is still on disk: for an owner that wants to know what it wrote last
        (say, after a crash). With ``since_ns`` (wall-clock nanoseconds) iteration stops at
        the first segment whose file was last modified before then: it holds nothing
        written since. Damaged data is read past as ``peek_many`` does; nothing moves.
        Stop iterating as soon as you know enough: each step reads one whole segment.
        Raises ``DiskQueueClosed``.
        """
        self._check_open()
        w = self._writer
        numbers = sorted(set(self._segments) | ({w.number} if w.fd is not None else set()), reverse=True)
        for number in numbers:
            if since_ns:
                try:
                    if fileops.stat(self._segment_path(number)).st_mtime_ns < since_ns:
                        return
                except OSError:
                    continue
            yield self._segment_records(number, HEADER_SIZE, 1 << 62)
            self._check_open()

    def _segment_records(self, number: int, start: int, want: int) -> list[bytes]:
        """Up to ``want`` valid records of segment ``number`` from offset ``start`` on, moving nothing."""
        w = self._writer
        if number == w.number:
            limit: int | None = w.pos
        elif number == self._r_file and self._r_end is not None:
            limit = self._r_end
        else:
            limit = self._bad.get(number)
        out: list[bytes] = []
        own = number == self._r_file and self._reader is not None
        try:
            reader = self._reader if own and self._reader is not None else SegmentReader(
                self._segment_path(number), number)
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
            if not own:
                reader.close()
        return out

    def _open_reader(self) -> bool:
        """Open the reader on the read segment; on failure mark it corrupt and return False."""
        number = self._r_file
        try:
            reader = SegmentReader(self._segment_path(number), number)
        except OSError as exc:
            self._corrupt(f"cannot open segment: {exc}")
            return False
        self._reader = reader
        if number != self._writer.number:
            self._r_end = min(reader.size, self._bad.get(number, reader.size))
        return True

    def _corrupt(self, problem: str) -> None:
        """Read past the invalid record at the read cursor, or stop reading its segment there.

        When a valid record follows (see ``resync``) reading resumes at it and the segment
        is set aside once consumed; the records skipped are counted when the reader leaves
        the segment (the next segment's first sequence number says how many it held).
        Otherwise reading stops at the damage and ``_cross`` skips to the next segment.
        """
        number, at = self._r_file, self._r_pos
        w = self._writer
        limit = w.pos if number == w.number else self._r_end
        reader = self._reader
        resume = None
        if reader is not None and limit is not None:
            resume = resync(reader.fd, at, limit, self._min, self._max)
        if resume is not None and limit is not None:
            self._log.warning("DISKQUEUE(%s): segment %06d offset %d: %s; skipped %d byte(s) "
                              "to the next valid record", self.name, number, at, problem, resume - at)
            self._bad[number] = max(limit, self._bad.get(number, 0))
            self._r_pos = resume
            self._meta_dirty = True
            if number == w.number:
                self._roll()  # nothing more may be appended after damage: write into a new segment
            return
        self._log.warning("DISKQUEUE(%s): segment %06d offset %d: %s; skipping to the next segment",
                          self.name, number, at, problem)
        self._bad[number] = at
        self._meta_dirty = True
        if number == self._writer.number:
            self._roll()  # nothing more may be appended after damage: write into a new segment
        self._r_end = at

    def _cross_finished(self) -> None:
        """Move the read cursor off segments that have been read to their end."""
        w = self._writer
        while self._r_file != w.number:
            if self._r_end is None and not self._open_reader():
                continue
            assert self._r_end is not None
            if self._r_pos < self._r_end:
                return
            self._cross()

    def _cross(self) -> None:
        """Move the read cursor from the end of the read segment to the start of the next."""
        left, end = self._r_file, self._r_pos
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        w = self._writer
        i = bisect_right(self._segments, left)
        nxt = self._segments[i] if i < len(self._segments) else w.number
        if nxt == w.number and w.fd is None:
            first: int | None = w.seq  # the write segment is not created yet
        else:
            header, _, problem = read_header(self._segment_path(nxt), nxt)
            first = header.first_seq if header is not None else None
            if header is None:
                self._log.warning("DISKQUEUE(%s): segment %06d: %s; skipping it", self.name, nxt, problem)
                self._bad[nxt] = HEADER_SIZE
                if nxt == w.number:
                    self._roll()
        if first is not None:
            lost = first - self._r_seq
            if lost > 0 and left not in self._accounted:
                self._accounted.add(left)
                self._records_lost += lost
                self._depth = max(0, self._depth - lost)
                if left in self._bad:
                    self._log.warning("DISKQUEUE(%s): %d record(s) lost to damage in segment %06d",
                                      self.name, lost, left)
                else:
                    self._log.warning("DISKQUEUE(%s): %d record(s) lost between segment %06d offset %d and "
                                      "segment %06d", self.name, lost, left, end, nxt)
            elif lost < 0:
                self._log.warning("DISKQUEUE(%s): segment %06d starts at record %d, behind %d",
                                  self.name, nxt, first, self._r_seq)
        else:
            first = self._r_seq
        self._r_file, self._r_pos, self._r_seq = nxt, HEADER_SIZE, first
        self._r_end = None
        if self._pending:
            self._pending.crossed(left, end, Cursor(nxt, HEADER_SIZE, first))
        else:
            self._c_file, self._c_pos, self._c_seq = nxt, HEADER_SIZE, first
        self._dirty = self._meta_dirty = True
        self._wake()

    # -- committing ----------------------------------------------------------------------

    def commit(self, n: int | None = None) -> None:
        """Mark the oldest ``n`` handed-out records done (all of them when ``n`` is None).

        The next checkpoint resumes reading after them. Raises ``ValueError`` when ``n`` is
        negative or more than ``uncommitted``, ``DiskQueueClosed``.
        """
        self._check_open()
        pending = self._pending
        if n is None:
            n = pending.count
        if n < 0 or n > pending.count:
            raise ValueError(f"cannot commit {n} record(s): {pending.count} uncommitted")
        if not n:
            return
        c = pending.commit(n)
        if not pending:
            c = Cursor(self._r_file, self._r_pos, self._r_seq)
        moved_file = c.file != self._c_file  # a segment may be removable now
        self._c_file, self._c_pos, self._c_seq = c.file, c.pos, c.seq
        self._dirty = self._meta_dirty = True
        if moved_file or self._idle:
            self._wake()

    # -- syncing -------------------------------------------------------------------------

    async def sync(self, *, commits: bool = True) -> None:
        """Make everything written (and committed) so far durable: the group commit.

        In a worker thread: fsync the data; then, when the committed cursor moved or a
        segment was started, finished or consumed since the last checkpoint, replace the
        checkpoint atomically (temp file, fsync, rename, fsync the directory) and remove
        consumed segments. Records written since the checkpoint need no new checkpoint to be
        durable: recovery keeps every complete, checksum-valid record after it.

        With ``commits=False`` only the written records are made durable (one data fsync,
        plus a directory fsync after a segment was created); the committed cursor is left
        to ``run()``'s policy and ``close()``. After a crash, records committed since then
        are delivered again, never lost. Raises ``DiskQueueIOError`` when the OS refuses
        (nothing is lost: the next sync retries), ``DiskQueueClosed``.
        """
        await self._sync(_AUTO if commits else _RECORDS)

    async def _sync(self, mode: int) -> None:
        self._check_open()
        async with self._sync_lock:
            if self._closed:
                return  # close() made the final sync (or raised its error) meanwhile
            await self._sync_locked(mode)

    async def _sync_locked(self, mode: int = _FULL) -> None:
        w = self._writer
        if not (w.dirty or w.rolled or w.created) if mode == _RECORDS else not self.sync_needed:
            await trio.lowlevel.checkpoint()
            return
        job = self._capture(mode)
        inline = mode == _RECORDS and self._records_sync_s < self._inline_below
        self._sync_active = True
        try:
            started = time.perf_counter()
            if inline:
                removed = job.run()
                await trio.lowlevel.cancel_shielded_checkpoint()
            else:
                removed = await trio.to_thread.run_sync(job.run)
            if mode == _RECORDS:
                self._records_sync_s = time.perf_counter() - started
        except BaseException as exc:
            self._sync_failed(job)
            if isinstance(exc, OSError):
                self._last_sync_error = str(exc)
                raise DiskQueueIOError(f"disk queue {self.name!r}: sync failed: {_sync_problem(exc)}",
                                       errno=exc.errno) from exc
            raise
        finally:
            self._sync_active = False
            deferred, self._deferred_close = self._deferred_close, []
            for fd in deferred:
                fileops.close(fd)
        for _, fd in job.rolled:
            fileops.close(fd)
        if job.current and removed:
            gone = set(removed)
            self._segments = [n for n in self._segments if n not in gone]
            for n in gone:
                self._bad.pop(n, None)
                self._accounted.discard(n)
        self._syncs += 1
        self._last_sync_error = None

    def _capture(self, mode: int) -> SyncJob:
        """Everything one sync needs, taken at one instant on the Trio thread."""
        w = self._writer
        rolled = w.take_rolled()
        fds = [fd for _, fd in rolled]
        if w.fd is not None and w.dirty:
            fds.append(w.fd)
            w.dirty = False
        floor = self._c_file
        removals = []
        if mode != _RECORDS:
            removals = [(n, self._segment_path(n), n in self._bad) for n in self._segments if n < floor]
        data = None
        if mode == _FULL or (mode == _AUTO and (self._meta_dirty or rolled or w.created or removals)):
            checkpoint = Checkpoint(
                commit=Cursor(self._c_file, self._c_pos, self._c_seq),
                write=Cursor(w.number, w.pos, w.seq),
                depth=self._depth + self._pending.count,
                bad=tuple(sorted((f, e) for f, e in self._bad.items() if f >= floor)),
                accounted=tuple(sorted(f for f in self._accounted if f >= floor)),
                note=self._note,
            )
            data = encode_checkpoint(checkpoint)
        job = SyncJob(fds=fds, rolled=rolled, created=w.created, data=data,
                      meta_path=self._meta_path, directory=self.data_path, removals=removals,
                      guard=self._guard, ops=0, meta_dirty=self._meta_dirty, log=self._log)
        w.created = False
        if data is not None:
            self._meta_dirty = False
        if not self._meta_dirty:  # otherwise the policy still owes a checkpoint of the commits
            job.ops, self._ops = self._ops, 0
            self._dirty = False
        return job

    def _sync_failed(self, job: SyncJob) -> None:
        job.abandon_temporary()
        if job.current and not self._closed:
            w = self._writer
            w.rolled[:0] = job.rolled
            w.created = w.created or job.created
            w.dirty = w.fd is not None
            self._ops += job.ops
            self._dirty = True
            self._meta_dirty = self._meta_dirty or job.meta_dirty
            if self._idle:
                self._wake()  # the policy loop retries what an owner's sync() could not do
        else:
            self._close_fds(fd for _, fd in job.rolled)
        job.rolled = []

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The sync policy loop (see the module docstring); returns once the queue is closed.

        Start it in the owner's nursery, or let :meth:`run_on_demand` start it. While
        everything is synced it waits without a timeout, so an idle queue costs no wake-ups;
        the first change after that starts the ``sync_timeout`` clock. A failed sync is
        logged and retried after ``sync_timeout``; the error is also in
        ``statistics().last_sync_error``.
        """
        task_status.started()
        deadline = math.inf  # when the oldest change not yet synced must be synced
        while not self._closed:
            if not self._sync_due():
                if not self.sync_needed:
                    deadline = self._changed_at = math.inf
                    self._idle = True
                    await self._wakeup.wait()
                    self._idle = False
                    self._wakeup = trio.Event()
                    continue
                if deadline == math.inf:
                    deadline = min(self._changed_at, trio.current_time()) + self._sync_timeout
                with trio.move_on_at(deadline):
                    await self._wakeup.wait()
                self._wakeup = trio.Event()
                if self._closed:
                    return
                if not self._sync_due() and trio.current_time() < deadline:
                    continue  # woken early: a change that is not due yet
            if self._closed:
                return
            if not self.sync_needed:
                continue
            deadline = self._changed_at = math.inf  # changes from here on start a new clock
            try:
                await self._sync(_FULL)
            except DiskQueueClosed:
                return
            except DiskQueueError as exc:
                self._log.error("DISKQUEUE(%s): %s", self.name, exc)
                await trio.sleep(self._sync_timeout)

    def run_on_demand(self, nursery: _Spawner) -> None:
        """Have :meth:`run` started in ``nursery`` by the first change that needs a sync
        (at once if one is needed now), instead of by the owner.

        For owners of many queues that mostly sit idle: a queue nobody writes to, reads
        from or commits on never costs a task. ``nursery`` is anything with trio's
        ``start_soon``; it must accept tasks until the queue is closed (an owner whose
        nursery closes earlier passes a wrapper that ignores late starts).
        """
        self._spawn = nursery
        if self.sync_needed or self._sync_due():
            self._wake()

    def _wake(self) -> None:
        """Something changed that a sync must cover: wake (or start) the policy loop."""
        if self._idle:
            self._idle = False
            try:
                self._changed_at = trio.current_time()
            except RuntimeError:  # used outside trio.run (no policy loop to tell)
                pass
        spawn = self._spawn
        if spawn is not None and not self._closed:
            self._spawn = None
            spawn.start_soon(self.run)
        self._wakeup.set()

    def _sync_due(self) -> bool:
        return bool(self._ops >= self._sync_every or self._writer.rolled or self._removable())

    # -- dropping and closing ------------------------------------------------------------

    def empty(self) -> None:
        """Drop every record: remove the segment files and the checkpoint, keep the sequence.

        Handed-out records are dropped too. ``.bad`` files are left for inspection.
        Raises ``DiskQueueClosed``.
        """
        self._check_open()
        self._forget_checkpoint()
        self._release()
        for number in set(self._segments) | {self._writer.number}:
            self._unlink(self._segment_path(number))
        w = self._writer
        number, seq = w.number + 1, w.seq
        self._writer = SegmentWriter(self.data_path, self.name, number, HEADER_SIZE, seq, False)
        self._segments = []
        self._r_file, self._r_pos, self._r_seq = number, HEADER_SIZE, seq
        self._c_file, self._c_pos, self._c_seq = number, HEADER_SIZE, seq
        self._r_end = None
        self._depth = 0
        self._pending.clear()
        self._bad.clear()
        self._accounted.clear()
        self._note = b""
        self._dirty = self._meta_dirty = True
        self._wake()

    def delete(self) -> None:
        """Close the queue and remove its segment files and checkpoint (not ``.bad`` files).

        Idempotent; also removes the files of a queue that was already closed.
        """
        self._closed = True
        self._deleted = True
        self._wakeup.set()
        self._forget_checkpoint()
        self._release()
        for number in list_segments(self.data_path, self.name):
            self._unlink(self._segment_path(number))
        if self._listing is not None:
            self._listing.released(self.name)  # a queue of this name opened later starts empty

    async def close(self) -> None:
        """Sync, then release every file descriptor. Idempotent; later calls return at once
        (or wait for the first to finish). Raises ``DiskQueueIOError`` when the final sync
        fails; the descriptors are released all the same."""
        if self._close_done is not None:
            await self._close_done.wait()
            return
        self._close_done = trio.Event()
        already_closed = self._closed
        self._closed = True
        self._wakeup.set()
        try:
            async with self._sync_lock:
                if not already_closed:
                    await self._sync_locked()
        finally:
            self._release()
            self._close_done.set()

    def _forget_checkpoint(self) -> None:
        with self._guard.lock:
            self._guard.advance()
            self._unlink(self._meta_path)

    def _release(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self._close_fds(self._writer.descriptors())

    def _close_fds(self, fds: Iterable[int]) -> None:
        for fd in fds:
            if self._sync_active:
                self._deferred_close.append(fd)  # a worker thread may be fsyncing it
            else:
                fileops.close(fd)

    def _unlink(self, path: str) -> None:
        try:
            fileops.unlink(path)
        except FileNotFoundError:
            pass

    def _segment_path(self, number: int) -> str:
        return os.path.join(self.data_path, segment_filename(self.name, number))

    def __repr__(self) -> str:
        return f"<DiskQueue {self.name!r} depth={self._depth} uncommitted={self._pending.count}>"


def _sync_problem(exc: OSError) -> str:
    """What failed in a sync, in Go's words: the checkpoint's file when the call names one
    (creating the temporary file, renaming it), else the reason (a write or an fsync)."""
    if exc.filename2 is not None:
        return describe_os_error("rename", exc.filename, exc, exc.filename2)
    if exc.filename is not None:
        return describe_os_error("open", exc.filename, exc)
    return os_error_reason(exc)
