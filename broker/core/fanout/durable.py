"""The durable fan-out (``--durable``, non-ephemeral topics): records move, and are committed late.

Every published message is written to the topic's disk queue (its memory
deque stays empty) and the publisher's ``OK`` waits for the topic's group
commit (:mod:`broker.core.durability.groupcommit`): ``wait_stored``. The queue
is read without auto-commit: the pump hands the records to each channel's
queue as they are, and a commit task moves the topic's committed cursor over
them only after every channel's copy is on stable storage (and the metadata
naming those channels is written). A crash in between fans the same records
out again: duplicates, never a loss. A batch a channel's disk refuses is
copied to it again, every second, before the pump reads on.
"""

from __future__ import annotations

import logging

import trio

from broker.core.channel import Channel
from broker.core.durability.ackfloor import COMMIT_INTERVAL
from broker.core.durability.groupcommit import GroupCommit
from broker.core.fanout.plain import Fanout
from broker.core.host import CoreHost
from broker.core.message import is_deferred_record
from broker.core.spill import REFILL_BATCH, SpillQueue
from diskqueue import DiskQueue, DiskQueueClosed, DiskQueueError

__all__ = ["DurableFanout"]

log = logging.getLogger("pynsqd.topic")


class DurableFanout(Fanout):
    """The durable fan-out of a topic whose queue ``ready`` writes through to ``backend``."""

    may_hold = False  # a durable topic's records go to every channel, committed once all have them

    def __init__(self, name: str, ready: SpillQueue, backend: DiskQueue, channels: dict[str, Channel],
                 host: CoreHost):
        super().__init__(name, ready, channels, host)
        self.backend = backend
        self.group = GroupCommit(backend)
        self.wait_stored = self.group.wait
        # records fanned out and not yet committed
        self._uncommitted = 0
        self._epoch = 0
        # batches a channel's disk refused, copied again before anything else
        self._refused: dict[str, tuple[Channel, list[bytes], int]] = {}
        self._fanned_out = trio.Event()
        # after a restart: the records below this number were read before it
        # and may have been copied already (see _not_copied); channel name -> its marks
        self._resume_end = backend.statistics().records_written
        self._copied: dict[str, tuple[int, int]] = {}

    def start(self, nursery: trio.Nursery) -> None:
        nursery.start_soon(self._commit_loop)

    def blocked(self) -> bool:
        return (bool(self._refused) and not self._copy_refused()) or super().blocked()

    def move(self, paused: bool = False) -> bool:
        """Hand a batch of records to every channel; True if there was one (``paused``: never
        the case here, as a durable topic holds nothing for its channels)."""
        backend = self.backend
        if not backend.depth:
            return False
        first = backend.read_seq
        records = backend.read_many(REFILL_BATCH)
        if not records:
            return False
        self._uncommitted += len(records)
        last = first + len(records) - 1
        resuming = first < self._resume_end
        if resuming and backend.damage_found:
            self._stop_resuming("damage was found in its queue")
            resuming = False
        for channel in list(self.channels.values()):
            batch = self._not_copied(channel, records, first) if resuming else records
            try:
                channel.put_records(batch, last)
            except DiskQueueError as exc:
                # The pump copies this batch to the channel again before it reads on, and
                # nothing is committed meanwhile (commits cover the oldest records first).
                self.host.disk_failed(exc)
                self._refused[channel.name] = (channel, batch, last)
        if resuming and last + 1 >= self._resume_end:
            self._stop_resuming(None)
        self._fanned_out.set()
        return True

    def _copy_refused(self) -> bool:
        """Copy again the batches channels refused; False if a disk still refuses.

        A batch the disk took in part is copied whole: duplicates, never a loss.
        """
        for name, (channel, batch, last) in list(self._refused.items()):
            if self.channels.get(name) is channel:
                try:
                    channel.put_records(batch, last)
                except DiskQueueError as exc:
                    self.host.disk_failed(exc)
                    return False
            del self._refused[name]
        self._fanned_out.set()
        return True

    def _not_copied(self, channel: Channel, records: list[bytes], first: int) -> list[bytes]:
        """The records of a batch numbered from ``first`` that ``channel`` did not get before a crash.

        After a restart the topic reads again every record it had not
        committed, and some were copied already: the channel's newest copies
        carry the topic's number of the last record copied (per kind, see
        ``DurableRetention.copied_through``), so the records up to it are left out.
        """
        marks = self._copied.get(channel.name)
        if marks is None:
            marks = self._copied[channel.name] = channel.copied_through()
        plain, deferred = marks
        if max(plain, deferred) < first:
            return records
        return [r for n, r in enumerate(records, first) if n > (deferred if is_deferred_record(r) else plain)]

    def _stop_resuming(self, why: str | None) -> None:
        skipped = self._resume_end
        self._resume_end = 0
        self._copied.clear()
        if why is not None:
            log.warning("topic %s: %s; records it had not committed before the restart are copied to its "
                        "channels again, so some may be delivered twice (records up to %d)", self.name, why, skipped)

    async def _commit_loop(self) -> None:
        """Commit fanned-out records once every channel's copy is durable."""
        backend = self.backend
        while True:
            await self._fanned_out.wait()
            self._fanned_out = trio.Event()
            n, epoch = self._uncommitted, self._epoch
            if not n or self._refused:
                continue
            channels = list(self.channels.values())
            try:
                await self.host.wait_metadata_persisted()
                for channel in channels:
                    try:
                        await channel.wait_durable()
                    except DiskQueueClosed:
                        pass  # deleted meanwhile: its copies are gone anyway
            except DiskQueueError as exc:
                self.host.disk_failed(exc)
                self._fanned_out.set()
            else:
                if epoch == self._epoch and not self._refused:
                    self._uncommitted -= n
                    backend.commit(n)
                    await self._checkpoint()
            await trio.sleep(COMMIT_INTERVAL)

    async def _checkpoint(self) -> None:
        """Write the moved committed cursor now rather than at the queue's next policy sync:
        after a crash the topic then reads again only what it fanned out since its last commit step."""
        try:
            await self.backend.sync()
        except DiskQueueError as exc:
            self.host.disk_failed(exc)

    def settle(self) -> int:
        """Shutdown, once the channels' copies are synced: commit what was fanned out (unless a
        channel refused a copy: then the records are read again at the next start)."""
        if self._uncommitted and not self._refused:
            self.backend.commit(self._uncommitted)
            self._uncommitted = 0
        return 0

    def empty(self) -> None:
        self.ready.empty()
        self._uncommitted = 0
        self._epoch += 1
        self._refused.clear()
        self._stop_resuming(None)
