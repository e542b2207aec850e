"""The disk queues of a data directory: opened by name for topics, channels and their stores.

Also the *stash*: a shutdown without ``--durable`` writes a channel's deferred
messages to a queue of their own (``<topic>:<channel>#deferred``), which the
next start reads back and removes.
"""

from __future__ import annotations

import logging
from pathlib import Path

from broker.config.options import Options
from broker.core.message import MAX_PREFIXES, RECORD_OVERHEAD
from diskqueue import DirectoryListing, DiskQueue

__all__ = ["QueueStore"]

log = logging.getLogger("pynsqd.broker")
#: One logger for every disk queue: its messages name the queue (``DISKQUEUE(<name>): ...``),
#: and a logger per queue would be created for each one and never freed.
queue_log = logging.getLogger("pynsqd.diskqueue")

#: A group commit's fdatasync runs on the event loop while the last one took less than this
#: (seconds): a worker thread's round trip costs about as much on such a disk, and the loop
#: is held no longer than by one batch of other work. Slower disks keep the worker thread.
INLINE_SYNC_BELOW = 0.001
#: Under ``--durable``, every publish waits for a sync: a segment is extended this far ahead
#: of its data (blocks reserved, cut off when it is finished), so that most syncs write
#: data only, with no size or block allocation to journal. Each durable queue being written
#: holds up to this much more disk than its data.
DURABLE_PREALLOCATE = 256 * 1024
#: Records read per call when reading a stash back.
_READ_BATCH = 4096


class QueueStore:
    """Disk queues under ``data_path``, sized by the options; implements :class:`broker.core.host.QueueStore`."""

    def __init__(self, data_path: Path, options: Options):
        self.data_path = data_path
        self.options = options
        self._listing: DirectoryListing | None = None

    def list_directory(self) -> None:
        """List the data directory once; every queue opened from now on finds its files there.

        Opening a queue finds its files; without a listing, by listing the whole directory,
        so a start-up with thousands of topics would take time quadratic in their number,
        and each topic or channel created later time linear in it. The store keeps the
        listing for its life: the broker holds the directory's lock, and only the queues
        (and stashes) opened through this store change it; a deleted queue tells the
        listing so. Raises ``OSError`` when the directory cannot be listed.
        """
        self._listing = DirectoryListing(self.data_path)

    def open(self, name: str, *, auto_commit: bool = True, min_record: int = RECORD_OVERHEAD) -> DiskQueue:
        """A disk queue for a topic, a channel or a channel's store, recovered from any existing
        files; ``min_record``: the shortest record (a message's by default)."""
        opts = self.options
        return DiskQueue(
            name,
            self.data_path,
            max_bytes_per_file=opts.max_bytes_per_file,
            min_msg_size=min_record,
            max_msg_size=opts.max_msg_size + RECORD_OVERHEAD + MAX_PREFIXES,  # room for a due time, an origin and a priority
            sync_every=opts.sync_every,
            sync_timeout=opts.sync_timeout,
            auto_commit=auto_commit,
            logger=queue_log,
            inline_sync_below=INLINE_SYNC_BELOW,
            listing=self._listing,
            preallocate=DURABLE_PREALLOCATE if opts.durable else 0,
        )

    def _files(self, name: str) -> list[Path]:
        listed = self._listing.peek(name) if self._listing is not None else None
        if listed is None:  # opened in this process: its files may have changed since
            return list(self.data_path.glob(f"{name}.diskqueue.*"))
        return [self.data_path / entry for entry in listed]

    def exists(self, name: str) -> bool:
        """Whether the disk queue ``name`` has files."""
        return bool(self._files(name))

    async def stash(self, name: str, records: list[bytes]) -> None:
        """Write ``records`` to the queue ``name`` for :meth:`take_stash` at the next start."""
        store = self.open(name)
        store.put_many(records)
        await store.close()

    def take_stash(self, name: str) -> list[bytes]:
        """The records stashed under ``name`` (none if there is no such queue); the queue is then removed."""
        if not self._files(name):
            return []
        store = self.open(name)
        records: list[bytes] = []
        while store.depth:
            batch = store.read_many(_READ_BATCH)
            if not batch:
                break
            records.extend(batch)
        store.delete()
        return records

    def drop_stash(self, name: str) -> None:
        """Remove the files of the queue ``name``, if any."""
        for path in self._files(name):
            path.unlink(missing_ok=True)
        if self._listing is not None:
            self._listing.released(name)
