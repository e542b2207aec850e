"""A standalone, crash-recoverable on-disk FIFO queue of byte strings, used from Trio.

Segment files of length-prefixed, checksummed records plus an atomically replaced msgpack
checkpoint; two read cursors (handed out, committed); nsqd's sync policy; corruption
recovery that counts what it loses. See ``queue.py`` for the API and which calls are
async, ``format.py`` for the file layout, ``recovery.py`` for what happens on open,
``check.py`` for verifying a data directory (``python -m diskqueue DATA_PATH [NAME ...]``),
``listing.py`` for opening many queues from one listing of their directory, and
``fileops.py``, through which every call to the file system goes.
"""

from .check import CheckReport, check
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
    "CheckReport",
    "DirectoryListing",
    "DiskQueue",
    "DiskQueueClosed",
    "DiskQueueError",
    "DiskQueueIOError",
    "DiskQueueStatistics",
    "FormatVersionError",
    "MessageSizeError",
    "check",
    "describe_os_error",
    "os_error_reason",
]
