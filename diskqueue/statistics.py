"""A point-in-time snapshot of a disk queue's counters and cursors."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["DiskQueueStatistics"]


class DiskQueueStatistics(NamedTuple):
    """What ``DiskQueue.statistics()`` reports.

    Cursors are ``(segment number, byte offset)``. ``records_written`` counts every record
    ever written to the queue (it survives restarts); ``records_lost`` counts records found
    lost to corruption or missing files since this queue object was opened (recovery's
    findings included).
    """

    name: str
    depth: int
    uncommitted: int
    segments: int
    read_cursor: tuple[int, int]
    commit_cursor: tuple[int, int]
    write_cursor: tuple[int, int]
    records_written: int
    records_lost: int
    syncs: int
    unsynced_operations: int
    sync_needed: bool
    last_sync_error: str | None
