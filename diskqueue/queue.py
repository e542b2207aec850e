"""``DiskQueue``: an append-only, segmented, crash-recoverable FIFO of byte strings.

One object owns all of a queue's file state and delegates each side of it to a module:

* ``writer.py`` — ``SegmentWriter``, the append end: the write cursor, the segment being
  written and the finished ones awaiting their fsync;
* ``reader.py`` — ``QueueReader``, the read end: the read and committed cursors, the
  records handed out in between, the segment being read and reading past damage;
* ``sync.py`` — ``SyncPolicy``, when to sync (nsqd's policy and its loop), and ``SyncJob``,
  what one sync does in a worker thread;
* ``checkpoint.py`` — the checkpoint's format; ``recovery.py`` — what happens on open;
  ``format.py`` — the segment and record layout; ``listing.py`` — many queues opened from
  one listing of their directory; ``fileops.py`` — every call to the file system.

Cursors. Three positions (``checkpoint.Cursor``: segment, offset, seq) move through the
segments: ``write`` (the end), ``read`` (the next record ``read_many`` hands out) and
``commit`` (the ack floor: records before it are done). The checkpoint stores ``commit``;
after a crash or restart reading resumes there, so records handed out but not committed
come back. With ``auto_commit=True`` (nsqd's behaviour) every read commits.

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
* ``run()`` is the sync policy loop (see ``sync.py``), started by the owner in its nursery
  or, with ``run_on_demand()``, by the first change; ``close()`` is async because it waits
  for a running sync and does a final one.
* Construction is synchronous: recovery reads the checkpoint and verifies only what was
  written after it, so it is cheap; when the checkpoint cannot be trusted it counts every
  record, which blocks in proportion to the data. Writing then continues in a new segment
  when the last one already holds records: nothing is appended after bytes this process
  did not write, so damage found there later never hides newer records.

A segment roll happens inside ``put_many``, which cannot wait for an fsync: the finished
segment stays open, ``run()`` is woken, and the next sync fsyncs it (and the directory)
before writing a checkpoint that names anything after it. Consumed segments are removed
(or renamed ``.bad`` when corrupt) only by a sync, after a checkpoint whose committed
cursor is past them is durable: a crash never leaves the checkpoint pointing at a removed
file.

``sync()`` is the group commit: after many ``put_many`` calls one ``await sync()`` makes
all of them durable. When only records were added since the last checkpoint it is a
single data fsync (inline while such syncs are quick, see ``inline_sync_below`` in
``sync.py``): the checkpoint is a hint, and recovery keeps every complete, checksum-valid
record written after it. ``sync(commits=False)`` is always just that, and leaves a moved
committed cursor to the policy.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Sequence

import trio

from . import fileops
from .checkpoint import Checkpoint, Cursor, encode_checkpoint
from .checksum import warn_if_slow
from .errors import DiskQueueClosed, DiskQueueIOError, MessageSizeError, describe_os_error
from .format import HEADER_SIZE, RECORD_HEADER_SIZE, frame_records, meta_filename, segment_filename
from .listing import DirectoryListing
from .reader import QueueReader
from .recovery import Recovered, recover
from .scan import list_segments
from .statistics import DiskQueueStatistics
from .sync import Guard, Spawner, SyncJob, SyncPolicy, sync_problem
from .writer import SegmentWriter

__all__ = ["DiskQueue"]

DEFAULT_MAX_BYTES_PER_FILE = 104857600
DEFAULT_MAX_MSG_SIZE = 1048576 + 26
DEFAULT_SYNC_EVERY = 2500
DEFAULT_SYNC_TIMEOUT = 2.0

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
        "name", "data_path", "_max_bytes", "_min", "_max", "_auto", "_log", "_writer", "_segments",
        "_reader", "_depth", "_dirty", "_meta_dirty", "_records_lost", "_syncs", "_last_sync_error",
        "_policy", "_sync_lock", "_guard", "_sync_active", "_deferred_close", "_closed", "_listing",
        "_close_done", "_meta_path", "_note",
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
        self.name = name
        self.data_path = os.fspath(data_path)
        self._max_bytes = max_bytes_per_file
        self._min = min_msg_size
        self._max = max_msg_size
        self._auto = auto_commit
        self._log = logger if logger is not None else logging.getLogger("diskqueue")
        self._policy = SyncPolicy(sync_every, sync_timeout, inline_sync_below, name, self._log)
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
        self._report(found)
        w = found.write
        if found.write_exists and w.pos > HEADER_SIZE:
            # Never append after bytes this process did not write: a record there that rots
            # would make the reader skip the rest of the segment, new records included.
            self._writer = SegmentWriter(self.data_path, name, w.file + 1, HEADER_SIZE, w.seq, False)
        else:
            self._writer = SegmentWriter(self.data_path, name, w.file, w.pos, w.seq, found.write_exists)
        self._segments = found.segments
        self._reader = self._new_reader(found.commit, found.bad, found.accounted)
        self._depth = found.depth
        self._dirty = bool(found.notes or found.problems)
        self._meta_dirty = self._dirty  # checkpoint content other than the write cursor changed
        self._records_lost = found.lost
        self._note = found.note
        self._syncs = 0
        self._last_sync_error: str | None = None
        self._sync_lock = trio.Lock()
        self._guard = Guard()
        self._sync_active = False
        self._deferred_close: list[int] = []
        self._closed = False
        self._close_done: trio.Event | None = None

    def _report(self, found: Recovered) -> None:
        for note in found.notes:
            self._log.info("DISKQUEUE(%s): %s", self.name, note)
        for problem in found.problems:
            self._log.warning("DISKQUEUE(%s): %s", self.name, problem)
        if found.lost:
            self._log.warning("DISKQUEUE(%s): %d record(s) lost to damaged or missing files", self.name, found.lost)

    def _new_reader(self, start: Cursor, bad: dict[int, int], accounted: set[int]) -> QueueReader:
        return QueueReader(self._writer, self._segments, start, bad, accounted, self._min, self._max,
                           self._auto, self.name, self._log)

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
        return self._reader.at.seq

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
            if self._policy.idle:
                self._wake()

    @property
    def damage_found(self) -> bool:
        """Whether damaged or missing data was found (on open or while reading).

        Records read after damage in the same segment are numbered as if none had been lost
        until the reader leaves the segment, so ``read_seq`` may then run behind.
        """
        return bool(self._reader.bad or self._records_lost)

    @property
    def uncommitted(self) -> int:
        """Records read (handed out) and not yet committed; always 0 with ``auto_commit``."""
        return self._reader.pending.count

    @property
    def sync_needed(self) -> bool:
        """Whether anything happened that the last sync does not cover."""
        w = self._writer
        return bool(self._dirty or w.dirty or w.rolled or w.created or self._removable())

    def statistics(self) -> DiskQueueStatistics:
        """A snapshot of the queue's counters and cursors."""
        w = self._writer
        r = self._reader
        return DiskQueueStatistics(
            name=self.name,
            depth=self._depth,
            uncommitted=r.pending.count,
            segments=len(self._segments),
            read_cursor=(r.at.file, r.at.pos),
            commit_cursor=(r.committed.file, r.committed.pos),
            write_cursor=(w.number, w.pos),
            records_written=w.seq,
            records_lost=self._records_lost,
            syncs=self._syncs,
            unsynced_operations=self._policy.ops,
            sync_needed=self.sync_needed,
            last_sync_error=self._last_sync_error,
        )

    def _check_open(self) -> None:
        if self._closed:
            raise DiskQueueClosed(f"disk queue {self.name!r} is closed")

    def _removable(self) -> bool:
        return bool(self._segments) and self._segments[0] < self._reader.committed.file

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
        if self._policy.nudge():
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
                    self._reader.roll_writer()
                    self._wake()
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
        self._policy.ops += count
        self._dirty = True

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
        reader = self._reader
        if max_records <= 0 or reader.caught_up:
            return []
        out = reader.read(max_records)
        changed = reader.changed  # crossed into another segment or found damage: wake the policy
        if changed:
            reader.changed = False
            lost, reader.lost = reader.lost, 0
            self._records_lost += lost
            self._depth = max(0, self._depth - lost)
            self._dirty = self._meta_dirty = True
        if out:
            n = len(out)
            if n > self._depth:
                self._log.error("DISKQUEUE(%s): depth %d below records read %d; correcting", self.name, self._depth, n)
                self._depth = n
            self._depth -= n
            self._policy.ops += n
            self._dirty = True
            if self._auto:
                self._meta_dirty = True
            if self._depth and reader.caught_up:
                self._log.error("DISKQUEUE(%s): reader caught up with depth %d left; correcting to 0",
                                self.name, self._depth)
                self._depth = 0
        elif not changed:
            return out
        if changed or self._policy.nudge():
            self._wake()
        return out

    def peek_many(self, max_records: int) -> list[bytes]:
        """Up to ``max_records`` of the records ``read_many`` would hand out next, unchanged.

        Nothing moves: no cursor, no depth, no sync counter; damaged data is not marked
        (``read_many`` does that when it gets there): a peek reads past it as reading will. Opens the later segments it looks into
        and closes them before returning. Raises ``DiskQueueClosed``.
        """
        self._check_open()
        return self._reader.peek(max_records)

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
            yield self._reader.records(number, HEADER_SIZE, 1 << 62)
            self._check_open()

    # -- committing ----------------------------------------------------------------------

    def commit(self, n: int | None = None) -> None:
        """Mark the oldest ``n`` handed-out records done (all of them when ``n`` is None).

        The next checkpoint resumes reading after them. Raises ``ValueError`` when ``n`` is
        negative or more than ``uncommitted``, ``DiskQueueClosed``.
        """
        self._check_open()
        count = self._reader.pending.count
        if n is None:
            n = count
        if n < 0 or n > count:
            raise ValueError(f"cannot commit {n} record(s): {count} uncommitted")
        if not n:
            return
        moved_file = self._reader.commit(n)  # a segment may be removable now
        self._dirty = self._meta_dirty = True
        if moved_file or self._policy.idle:
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

    async def _sync_full(self) -> None:
        """The policy's sync: always writes the checkpoint."""
        await self._sync(_FULL)

    def _sync_urgent(self) -> bool:
        """A finished segment awaits its fsync, or a consumed one its removal."""
        return bool(self._writer.rolled) or self._removable()

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
        self._sync_active = True
        try:
            removed = await self._policy.execute(job, mode == _RECORDS)
        except BaseException as exc:
            self._sync_failed(job)
            if isinstance(exc, OSError):
                self._last_sync_error = str(exc)
                raise DiskQueueIOError(f"disk queue {self.name!r}: sync failed: {sync_problem(exc)}",
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
            self._segments[:] = [n for n in self._segments if n not in gone]  # the reader shares the list
            self._reader.forget(gone)
        self._syncs += 1
        self._last_sync_error = None

    def _capture(self, mode: int) -> SyncJob:
        """Everything one sync needs, taken at one instant on the Trio thread."""
        w = self._writer
        r = self._reader
        rolled = w.take_rolled()
        fds = [fd for _, fd in rolled]
        if w.fd is not None and w.dirty:
            fds.append(w.fd)
            w.dirty = False
        floor = r.committed.file
        removals = []
        if mode != _RECORDS:
            removals = [(n, self._segment_path(n), n in r.bad) for n in self._segments if n < floor]
        data = None
        if mode == _FULL or (mode == _AUTO and (self._meta_dirty or rolled or w.created or removals)):
            checkpoint = Checkpoint(
                commit=r.committed,
                write=Cursor(w.number, w.pos, w.seq),
                depth=self._depth + r.pending.count,
                bad=tuple(sorted((f, e) for f, e in r.bad.items() if f >= floor)),
                accounted=tuple(sorted(f for f in r.accounted if f >= floor)),
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
            job.ops, self._policy.ops = self._policy.ops, 0
            self._dirty = False
        return job

    def _sync_failed(self, job: SyncJob) -> None:
        job.abandon_temporary()
        if job.current and not self._closed:
            w = self._writer
            w.rolled[:0] = job.rolled
            w.created = w.created or job.created
            w.dirty = w.fd is not None
            self._policy.ops += job.ops
            self._dirty = True
            self._meta_dirty = self._meta_dirty or job.meta_dirty
            if self._policy.idle:
                self._wake()  # the policy loop retries what an owner's sync() could not do
        else:
            self._close_fds(fd for _, fd in job.rolled)
        job.rolled = []

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The sync policy loop (see ``sync.py``); returns once the queue is closed.

        Start it in the owner's nursery, or let :meth:`run_on_demand` start it. While
        everything is synced it waits without a timeout, so an idle queue costs no wake-ups;
        the first change after that starts the ``sync_timeout`` clock. A failed sync is
        logged and retried after ``sync_timeout``; the error is also in
        ``statistics().last_sync_error``.
        """
        await self._policy.run(self, task_status)

    def run_on_demand(self, nursery: Spawner) -> None:
        """Have :meth:`run` started in ``nursery`` by the first change that needs a sync
        (at once if one is needed now), instead of by the owner.

        For owners of many queues that mostly sit idle: a queue nobody writes to, reads
        from or commits on never costs a task. ``nursery`` is anything with trio's
        ``start_soon``; it must accept tasks until the queue is closed (an owner whose
        nursery closes earlier passes a wrapper that ignores late starts).
        """
        self._policy.on_demand(nursery)
        if self.sync_needed or self._policy.due(self._sync_urgent()):
            self._wake()

    def _wake(self) -> None:
        """Something changed that a sync must cover: wake (or start) the policy loop."""
        spawn = self._policy.wake()
        if spawn is not None:
            spawn.start_soon(self.run)

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
        self._reader = self._new_reader(Cursor(number, HEADER_SIZE, seq), {}, set())
        self._depth = 0
        self._note = b""
        self._dirty = self._meta_dirty = True
        self._wake()

    def delete(self) -> None:
        """Close the queue and remove its segment files and checkpoint (not ``.bad`` files).

        Idempotent; also removes the files of a queue that was already closed.
        """
        self._closed = True
        self._policy.stop()
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
        self._policy.stop()
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
        self._reader.close()
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
        return f"<DiskQueue {self.name!r} depth={self._depth} uncommitted={self._reader.pending.count}>"
