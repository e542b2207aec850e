"""``DiskQueue``: an append-only, segmented, crash-recoverable FIFO of byte strings.

One object owns all of a queue's file state; ``writer.py`` holds its append end,
``reader.py`` its read end and ``sync.py`` when and how it syncs (the other modules are
listed in ``__init__.py``).

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
* ``run()`` is the sync policy loop (see ``sync.py``, which also says when a sync is a
  single data fsync and when it writes the checkpoint), started by the owner in its
  nursery or, with ``run_on_demand()``, by the first change; ``close()`` is async because
  it waits for a running sync and does a final one.
* Construction is synchronous: recovery reads the checkpoint and verifies only what was
  written after it, so it is cheap; when the checkpoint cannot be trusted it counts every
  record, which blocks in proportion to the data. Writing then continues in a new segment
  when the last one already holds records: nothing is appended after bytes this process
  did not write, so damage found there later never hides newer records.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import trio

from . import fileops
from .batch import RecordBatch
from .checkpoint import Cursor, encode_checkpoint
from .checksum import warn_if_slow
from .errors import DiskQueueClosed, DiskQueueIOError, describe_os_error
from .format import HEADER_SIZE, RECORD_HEADER_SIZE, meta_filename, segment_filename
from .inspection import QueueInspection
from .listing import DirectoryListing
from .reader import QueueReader
from .recovery import recover
from .scan import list_segments
from .sync import AUTO, FULL, RECORDS, Guard, Spawner, SyncJob, SyncPolicy
from .writer import SegmentWriter

__all__ = ["DiskQueue"]

DEFAULT_MAX_BYTES_PER_FILE = 104857600
DEFAULT_MAX_MSG_SIZE = 1048576 + 26
DEFAULT_SYNC_EVERY = 2500
DEFAULT_SYNC_TIMEOUT = 2.0


class DiskQueue(QueueInspection):
    """Append-only segment queue; one owner, used from one Trio thread.

    ``name`` names the files (``<name>.diskqueue.NNNNNN.dat`` and ``.meta.dat``) in the
    directory ``data_path``, which is created if missing. Opening recovers synchronously
    (see ``recovery.py``); it finds the queue's files in ``listing`` (a
    :class:`~diskqueue.listing.DirectoryListing` of ``data_path``, shared by many queues
    opened at once, and told by ``delete()`` that the queue's files are gone) when given,
    else by listing the directory. ``preallocate`` > 0 extends the segment being written
    that many bytes ahead of its data, so that syncs rarely change its size (see
    ``writer.py``). The queue owns its file descriptors; ``close()`` or ``delete()``
    releases them. Raises ``FormatVersionError`` for files of a newer format,
    ``OSError`` when the directory cannot be read and ``ValueError`` for invalid arguments
    (a listing of another directory among them).
    """

    __slots__ = ("name", "data_path", "_max_bytes", "_min", "_max", "_auto", "_log", "_writer", "_segments",
                 "_reader", "_policy", "_sync_lock", "_guard", "_closed", "_listing", "_close_done", "_meta_path", "_note")

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
        preallocate: int = 0,
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
        self._listing = listing
        entries = None if listing is None else listing.take(name, self.data_path)
        if entries is None:
            fileops.makedirs(self.data_path, exist_ok=True)  # a listing found it there already
        warn_if_slow(self._log)

        try:
            found = recover(self.data_path, name, min_msg_size, max_msg_size, entries=entries)
            found.report(self._log, name)
            self._writer = SegmentWriter.resume(self.data_path, name, found.write, found.write_exists, preallocate)
        except OSError as exc:  # the disk refused to open, repair or set aside a file
            what = describe_os_error("open", exc.filename or self._meta_path, exc)
            raise DiskQueueIOError(what, errno=exc.errno) from exc
        self._segments = found.segments
        self._reader = self._new_reader(found.commit, found.depth, found.lost, found.bad, found.accounted)
        self._policy.dirty = self._policy.meta_dirty = bool(found.notes or found.problems)
        self._note = found.note
        self._sync_lock = trio.Lock()
        self._guard = Guard()
        self._closed = False
        self._close_done: trio.Event | None = None

    def _new_reader(self, start: Cursor, depth: int, lost: int, bad: dict[int, int], accounted: set[int]) -> QueueReader:
        return QueueReader(self._writer, self._segments, start, depth, lost, bad, accounted, self._min, self._max,
                           self._auto, self.name, self._log)

    # -- state ---------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Records written and not yet read."""
        return self._reader.depth

    @property
    def read_seq(self) -> int:
        """The sequence number of the next record ``read_many`` hands out.

        Records are numbered in write order from 0 for the life of the queue's files
        (``empty()`` keeps counting), so a batch read in one call is numbered
        ``read_seq`` (before the call) onwards, unless the call read past damage
        (see ``damage_found``).
        """
        return self._reader.seq

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
            self._policy.dirty = self._policy.meta_dirty = True
            if self._policy.idle:
                self._wake()

    @property
    def commit_seq(self) -> int:
        """The number of the first record not committed: every record before it was read and
        marked done (see ``commit``)."""
        return self._reader.committed.seq

    @property
    def uncommitted(self) -> int:
        """Records read (handed out) and not yet committed; always 0 with ``auto_commit``."""
        return self._reader.pending.count

    @property
    def sync_needed(self) -> bool:
        """Whether anything happened that the last sync does not cover."""
        w = self._writer
        return bool(self._policy.dirty or w.dirty or w.rolled or w.created or self._removable())

    def _check_open(self) -> None:
        if self._closed:
            raise DiskQueueClosed(f"disk queue {self.name!r} is closed")

    def _removable(self) -> bool:
        return bool(self._segments) and self._segments[0] < self._reader.committed.file

    # -- writing -------------------------------------------------------------------------

    def put(self, payload: bytes) -> None:
        """Append one record. Raises like ``put_many``."""
        self.put_many((payload,))

    def put_many(self, payloads: Sequence[bytes] | Iterable[bytes] | RecordBatch) -> None:
        """Append records, one ``pwrite`` per batch (per segment when the batch rolls over).

        A :class:`~diskqueue.batch.RecordBatch` is framed once for every queue it is
        appended to. Raises ``MessageSizeError`` (nothing written) when a payload is outside
        ``[min_msg_size, max_msg_size]``, ``DiskQueueIOError`` when the OS refuses the write
        (its ``accepted`` payloads were written; the rest were not), ``DiskQueueClosed``.
        """
        self._check_open()
        batch = payloads if isinstance(payloads, RecordBatch) else RecordBatch(list(payloads))
        if not batch:
            return
        w = self._writer
        seq = w.seq
        try:
            w.append(batch, (self._min, self._max), self._max_bytes, self._segments, self._roll)
        finally:
            written = w.seq - seq  # all of them, or those accepted before an error
            self._reader.depth += written
            wake = bool(written) and self._policy.changed(written, False)
        if wake:
            self._wake()

    def _roll(self) -> None:
        self._reader.roll_writer()
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
        reader = self._reader
        if max_records <= 0:
            return []
        out = reader.read(max_records)
        changed, reader.changed = reader.changed, False  # moved to another segment or found damage
        if (out or changed) and (self._policy.changed(len(out), changed or self._auto) or changed):
            self._wake()
        return out

    @contextmanager
    def moving(self) -> Iterator[None]:
        """A block of plain calls that *move* records: read them and append them (or some of
        them, in another order) again. What it reads and writes does not count towards
        ``sync_every``; ``sync_timeout`` still bounds when it is synced.

        A move needs no prompt sync: a sync writes the data before the checkpoint, so until
        one covers the new copies, the checkpoint on disk still has the originals unread (a
        crash reads them again: duplicates, never a loss). Without this, moving a million
        records a batch at a time, with other tasks running between batches, would sync
        every ``sync_every / 2`` of them.
        """
        policy = self._policy
        policy.counting = False
        try:
            yield
        finally:
            policy.counting = True

    # -- committing ----------------------------------------------------------------------

    def commit(self, n: int | None = None) -> None:
        """Mark the oldest ``n`` handed-out records done (all of them when ``n`` is None).

        The next checkpoint resumes reading after them. Raises ``ValueError`` when ``n`` is
        negative or more than ``uncommitted``, ``DiskQueueClosed``.
        """
        self._check_open()
        moved_file = self._reader.commit(n)  # a segment may be removable now
        if moved_file is None:
            return
        self._policy.dirty = self._policy.meta_dirty = True
        if moved_file or self._policy.idle:
            self._wake()

    # -- syncing -------------------------------------------------------------------------

    async def sync(self, *, commits: bool = True) -> None:
        """Make everything written (and committed) so far durable: the group commit.

        In a worker thread: fsync the data; then, when the committed cursor moved or a
        segment was started, finished or consumed since the last checkpoint, replace the
        checkpoint atomically and remove consumed segments (see ``sync.py``). With
        ``commits=False`` only the written records are made durable; the committed cursor is
        left to ``run()``'s policy and ``close()`` (after a crash, records committed since
        then are delivered again, never lost). Raises ``DiskQueueIOError`` when the OS
        refuses (nothing is lost: the next sync retries), ``DiskQueueClosed``.
        """
        await self._sync(AUTO if commits else RECORDS)

    async def _sync_full(self) -> None:
        """The policy's sync: always writes the checkpoint."""
        await self._sync(FULL)

    def _sync_urgent(self) -> bool:
        """A finished segment awaits its fsync, or a consumed one its removal."""
        return bool(self._writer.rolled) or self._removable()

    async def _sync(self, mode: int) -> None:
        self._check_open()
        async with self._sync_lock:
            if self._closed:
                return  # close() made the final sync (or raised its error) meanwhile
            await self._sync_locked(mode)

    async def _sync_locked(self, mode: int = FULL) -> None:
        w = self._writer
        if not (w.dirty or w.rolled or w.created) if mode == RECORDS else not self.sync_needed:
            await trio.lowlevel.checkpoint()
            return
        job = self._capture(mode)
        removed = await self._policy.execute(job, mode == RECORDS, self._sync_failed)
        if job.current and removed:
            gone = set(removed)
            self._segments[:] = [n for n in self._segments if n not in gone]  # the reader shares the list
            self._reader.forget(gone)

    def _capture(self, mode: int) -> SyncJob:
        """Everything one sync needs, taken at one instant on the Trio thread."""
        w, r = self._writer, self._reader
        removals = []
        if mode != RECORDS:
            floor = r.committed.file
            removals = [(n, self._segment_path(n), n in r.bad) for n in self._segments if n < floor]
        job = SyncJob(w, removals, self._guard, self._meta_path, self.data_path, self._log)
        if mode == FULL or (mode == AUTO and (self._policy.meta_dirty or job.rolled or job.created or removals)):
            job.data = encode_checkpoint(r.checkpoint(Cursor(w.number, w.pos, w.seq), self._note))
        self._policy.captured(job)
        return job

    def _sync_failed(self, job: SyncJob) -> None:
        job.abandon_temporary()
        if job.current and not self._closed:
            job.give_back(self._writer)
            self._policy.owed(job)
            if self._policy.idle:
                self._wake()  # the policy loop retries what an owner's sync() could not do
        else:
            self._policy.close(fd for _, fd in job.rolled)
            job.rolled = []

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The sync policy loop (see ``sync.py``); returns once the queue is closed.

        Start it in the owner's nursery, or let :meth:`run_on_demand` start it. While
        everything is synced it waits without a timeout. A failed sync is logged and
        retried after ``sync_timeout``; the error is also in ``statistics().last_sync_error``.
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
        start = Cursor(self._writer.number + 1, HEADER_SIZE, self._writer.seq)
        self._writer = SegmentWriter.resume(self.data_path, self.name, start, False, self._writer.preallocate)
        self._segments = []
        self._reader = self._new_reader(start, 0, self._reader.lost, {}, set())
        self._note = b""
        self._policy.dirty = self._policy.meta_dirty = True
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
                    self._trim()
                    await self._sync_locked()
        finally:
            self._release()
            self._close_done.set()

    def _trim(self) -> None:
        """Cut the current segment's preallocated rest off before the final sync; where that
        fails, the next open cuts it off (as the end of an interrupted write)."""
        try:
            self._writer.trim()
        except OSError as exc:
            self._log.warning("diskqueue(%s): could not cut off the preallocated end of %s - %s",
                              self.name, self._segment_path(self._writer.number), exc)

    def _forget_checkpoint(self) -> None:
        with self._guard.lock:  # no sync running now installs a checkpoint after this
            self._guard.advance()
            self._unlink(self._meta_path)

    def _release(self) -> None:
        self._reader.close()
        self._policy.close(self._writer.descriptors())

    def _unlink(self, path: str) -> None:
        try:
            fileops.unlink(path)
        except FileNotFoundError:
            pass

    def _segment_path(self, number: int) -> str:
        return os.path.join(self.data_path, segment_filename(self.name, number))

    def __repr__(self) -> str:
        return f"<DiskQueue {self.name!r} depth={self._reader.depth} uncommitted={self._reader.pending.count}>"
