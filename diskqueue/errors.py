"""Exceptions raised by the disk queue."""

from __future__ import annotations

__all__ = [
    "DiskQueueClosed",
    "DiskQueueError",
    "DiskQueueIOError",
    "FormatVersionError",
    "MessageSizeError",
]


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
