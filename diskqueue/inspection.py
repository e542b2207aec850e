"""Looking into a queue without moving anything: peeks, scans, the newest records, whether
damage was found, and a snapshot of its counters and cursors.

A base class of :class:`~diskqueue.queue.DiskQueue` (what it uses of the queue is declared
here). Every call is a plain method: reads are ``pread`` calls into the page cache, as the
queue's own reads are (see :mod:`diskqueue.queue`, "Which calls are async, and why").
"""

from __future__ import annotations

from collections.abc import Iterator

from .reader import QueueReader
from .statistics import DiskQueueStatistics
from .sync import SyncPolicy
from .writer import SegmentWriter

__all__ = ["QueueInspection"]


class QueueInspection:
    """What a :class:`~diskqueue.queue.DiskQueue` shows of itself without changing."""

    name: str
    _reader: QueueReader
    _writer: SegmentWriter
    _policy: SyncPolicy
    _segments: list[int]

    def _check_open(self) -> None:
        raise NotImplementedError

    @property
    def sync_needed(self) -> bool:
        raise NotImplementedError

    @property
    def damage_found(self) -> bool:
        """Whether damaged or missing data was found (on open or while reading).

        Records read after damage in the same segment are numbered as if none had been lost
        until the reader leaves the segment, so ``read_seq`` may then run behind.
        """
        return bool(self._reader.bad or self._reader.lost)

    def peek_many(self, max_records: int) -> list[bytes]:
        """Up to ``max_records`` of the records ``read_many`` would hand out next, unchanged.

        Nothing moves: no cursor, no depth, no sync counter; damaged data is not marked
        (``read_many`` does that when it gets there): a peek reads past it as reading will. Opens the later segments it looks into
        and closes them before returning. Raises ``DiskQueueClosed``.
        """
        self._check_open()
        return self._reader.peek(max_records)

    def scan(self, batch: int = 1024) -> Iterator[list[bytes]]:
        """The records ``peek_many(depth)`` would return, in lists of at most ``batch``: however
        long the queue, only a batch and one segment's read-ahead are held at a time.

        Nothing moves; damaged data is read past as ``peek_many`` does (comparing the count
        read with ``depth`` tells how many records it cost). Records written while the scan
        is under way may or may not be seen. Raises ``DiskQueueClosed`` at the first step
        after the queue was closed.
        """
        self._check_open()
        for records in self._reader.scan(batch):
            yield records
            self._check_open()

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
        for records in self._reader.newest(since_ns):
            yield records
            self._check_open()

    def statistics(self) -> DiskQueueStatistics:
        """A snapshot of the queue's counters and cursors."""
        w = self._writer
        r = self._reader
        return DiskQueueStatistics(
            name=self.name,
            depth=r.depth,
            uncommitted=r.pending.count,
            segments=len(self._segments),
            read_cursor=(r.file, r.pos),
            commit_cursor=(r.committed.file, r.committed.pos),
            write_cursor=(w.number, w.pos),
            records_written=w.seq,
            records_lost=r.lost,
            syncs=self._policy.syncs,
            unsynced_operations=self._policy.ops,
            sync_needed=self.sync_needed,
            last_sync_error=self._policy.last_error,
        )

