"""Exceptions raised by the disk queue."""

from __future__ import annotations

import os

__all__ = [
    "DiskQueueClosed",
    "DiskQueueError",
    "DiskQueueIOError",
    "FormatVersionError",
    "MessageSizeError",
    "describe_os_error",
    "os_error_reason",
]


def describe_os_error(operation: str, path: str, exc: OSError, target: str | None = None) -> str:
    """``<operation> <path>: <reason>``, e.g. ``write /data/t.diskqueue.000000.dat: no space left on device``
    (``rename <path> <target>: <reason>`` when given a ``target``).

    The form Go's ``os`` package gives its errors (nsqd's disk queue reports a failed write
    so), the reason being the C library's message with its first letter in lower case, as
    Go's table of errno messages has them.
    """
    paths = path if target is None else f"{path} {target}"
    return f"{operation} {paths}: {os_error_reason(exc)}"


def os_error_reason(exc: OSError) -> str:
    """The reason of an OS error as Go words it: ``no space left on device``, ``read-only file system``."""
    reason = os.strerror(exc.errno) if exc.errno is not None else str(exc)
    return reason[:1].lower() + reason[1:]


class DiskQueueError(Exception):
    """Base class of every error the disk queue raises."""


class MessageSizeError(DiskQueueError, ValueError):
    """A payload is outside ``[min_msg_size, max_msg_size]``; nothing of its batch was written."""

    def __init__(self, size: int, min_size: int, max_size: int, index: int = 0) -> None:
        self.size = size
        self.min_size = min_size
        self.max_size = max_size
        self.index = index
        super().__init__(
            f"message size {size} (payload #{index} of the batch) is outside the allowed "
            f"range [{min_size}, {max_size}]"
        )


class DiskQueueClosed(DiskQueueError):
    """The queue was closed or deleted; it accepts no further calls."""


class DiskQueueIOError(DiskQueueError):
    """The operating system refused a write, fsync or file operation.

    ``accepted`` is how many payloads of the failed ``put_many`` batch were written before the
    failure and will be read back (0 for failures outside ``put_many``); ``errno`` is copied
    from the underlying ``OSError``, which is also the ``__cause__``. The queue stays usable:
    everything accepted before is still readable and a later call may succeed.
    """

    def __init__(self, message: str, *, errno: int | None = None, accepted: int = 0) -> None:
        self.errno = errno
        self.accepted = accepted
        super().__init__(message)


class FormatVersionError(DiskQueueError):
    """A segment or checkpoint was written by a newer format version than this code reads.

    The file's own checksum is valid, so it is not corruption: the queue refuses to open
    rather than mark data it cannot read as bad.
    """
