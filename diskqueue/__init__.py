"""A standalone, crash-recoverable on-disk FIFO queue of byte strings, used from Trio.

Segment files of length-prefixed, checksummed records plus an atomically replaced msgpack
checkpoint; two read cursors (handed out, committed); nsqd's sync policy; corruption
recovery that counts what it loses. The modules:

* ``queue.py`` — ``DiskQueue``, the API, which calls are async and why; the one owner of
  a queue's file state, which it hands to the three below; ``inspection.py`` — what it
  shows without moving anything (peeks, scans, the newest records, its statistics);
* ``writer.py`` — the append end (``SegmentWriter``); ``batch.py`` — records framed once
  for many queues (``RecordBatch``);
* ``reader.py`` — the read end (``QueueReader``: read and committed cursors, handed-out
  records, reading past damage; ``SegmentReader``: read-ahead I/O);
* ``sync.py`` — when to sync (``SyncPolicy``, nsqd's policy and its loop) and what one
  sync does in a worker thread (``SyncJob``);
* ``checkpoint.py`` — the checkpoint's format; ``format.py`` — the segment and record
  layout; ``pending.py`` — records handed out and not committed;
* ``recovery.py`` — what happens on open; ``scan.py`` — verifying and resynchronising on
  records; ``check.py`` — verifying a data directory (``python -m diskqueue DATA_PATH [NAME ...]``;
  import it from ``diskqueue.check``: a broker's start does not load it);
* ``listing.py`` — opening many queues from one listing of their directory;
* ``fileops.py`` — through which every call to the file system goes (the fault seam).
"""

from .batch import RecordBatch
from .errors import (
    DiskQueueClosed,
    DiskQueueError,
    DiskQueueIOError,
    FormatVersionError,
    MessageSizeError,
    describe_os_error,
    os_error_reason,
)
from .listing import DirectoryListing
from .queue import DiskQueue
from .statistics import DiskQueueStatistics

__all__ = [
    "DirectoryListing",
    "DiskQueue",
    "DiskQueueClosed",
    "DiskQueueError",
    "DiskQueueIOError",
    "DiskQueueStatistics",
    "FormatVersionError",
    "MessageSizeError",
    "RecordBatch",
    "describe_os_error",
    "os_error_reason",
]
