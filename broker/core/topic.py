"""A topic: the publish side of the broker, fanning every message out to its channels.

Published messages enter a :class:`~broker.core.spill.SpillQueue` whose
failed spill raises, so a publish fails with nothing of it kept (an
ephemeral topic drops what does not fit in memory). One pump
task per topic moves every ready message to each channel (a copy per channel)
and then waits once; it runs only while the topic has a channel and is not
paused, so a topic with no channels keeps its messages for the first one.

Durable mode (``--durable``, non-ephemeral topics): every published message is
written to the disk queue (the memory deque stays empty) and the publisher's
``OK`` waits for the topic's group commit (:mod:`broker.core.durability.groupcommit`). The
queue is read without auto-commit: the pump hands the records to each
channel's queue as they are, and a commit task moves the topic's committed
cursor over them only after every channel's copy is on stable storage (and
the metadata naming those channels is written). A crash in between fans the
same records out again: duplicates, never a loss. A batch a channel's disk
refuses is copied to it again, every second, before the pump reads on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from broker.core.channel import Channel
from broker.core.durability.ackfloor import COMMIT_INTERVAL
from broker.core.durability.groupcommit import GroupCommit
from broker.core.host import CoreHost, RegistryChange
from broker.core.message import Message, is_deferred_record
from broker.core.retention import RETRY_DELAY
from broker.core.spill import REFILL_BATCH, SpillQueue
from broker.core.tasks import TaskSet
from broker.protocol import is_ephemeral
from diskqueue import DiskQueue, DiskQueueClosed, DiskQueueError

__all__ = ["Topic"]

log = logging.getLogger("pynsqd.topic")

#: Messages the pump moves before it lets other tasks run.
PUMP_BATCH = 4096


class Topic:
    """A named topic; owned by the :class:`~broker.core.broker.Broker`.

    Owns its channels, its queue of published messages and a nursery in which
    its pump, its commit task (durable mode) and its channels' tasks run.
    ``on_empty`` is called when an ephemeral topic loses its last channel.
    """

    def __init__(self, name: str, host: CoreHost, on_empty: Callable[[], None]):
        self.name = name
        self._host = host
        self._on_empty = on_empty
        options = host.options
        self.ephemeral = is_ephemeral(name)
        self.durable = options.durable and not self.ephemeral
        backend = None if self.ephemeral else host.queues.open(name, auto_commit=not self.durable)
        self.ready = SpillQueue(backend, options.mem_queue_size, where=f"topic {name}", log=log,
                                write_through=self.durable)
        self.group = GroupCommit(backend) if self.durable and backend is not None else None
        self.channels: dict[str, Channel] = {}
        self.paused = False
        self.exiting = False
        self.message_count = 0
        self.message_bytes = 0
        self.e2e = host.latency_stream()
        self._wakeup = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._cancel_scope = trio.CancelScope()
        self._tasks = TaskSet()  # the disk queue's sync loop, started once it has work
        self._pending_channels: list[Channel] = []
        # durable mode: records fanned out and not yet committed
        self._uncommitted = 0
        self._epoch = 0
        # durable mode: batches a channel's disk refused, copied again before anything else
        self._refused: dict[str, tuple[Channel, list[bytes], int]] = {}
        self._fanned_out = trio.Event()
        # durable mode, after a restart: the records below this number were read before it
        # and may have been copied already (see _not_copied); channel name -> its marks
        self._resume_end = backend.statistics().records_written if self.durable and backend is not None else 0
        self._copied: dict[str, tuple[int, int]] = {}

    @property
    def backend(self) -> DiskQueue | None:
        """The topic's disk queue (None when ephemeral)."""
        return self.ready.backend

    # ---------------------------------------------------------------- lifecycle

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run the pump, the commit task and the sync loops of this topic's queues until closed."""
        with self._cancel_scope:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._tasks.attach(nursery)
                if self.backend is not None:
                    self.backend.run_on_demand(self._tasks)
                for channel in self._pending_channels:
                    channel.start(nursery)
                self._pending_channels.clear()
                nursery.start_soon(self._pump)
                if self.durable:
                    nursery.start_soon(self._commit_loop)
                task_status.started()

    def close(self) -> None:
        """Stop the pump and every channel's task; the broker closes the files."""
        self.exiting = True
        for channel in self.channels.values():
            channel.close()
        self._tasks.close()
        self._cancel_scope.cancel()

    async def close_queues(self) -> int:
        """Shutdown: close every channel's queues, then the topic's own; returns how many
        messages could not be written to disk (each failure is logged, and everything
        else is still written and closed).

        Channels first: in durable mode the records the pump fanned out are
        committed only once the channels' copies are synced.
        """
        lost = 0
        for channel in self.channels.values():
            lost += await channel.close_queues()
        backend = self.backend
        if backend is None:
            return lost
        try:
            if self.durable and self._uncommitted and not self._refused:
                backend.commit(self._uncommitted)
                self._uncommitted = 0
            elif not self.durable:
                records = self.ready.records()
                if records:
                    try:
                        backend.put_many(records)
                    except DiskQueueError as exc:
                        lost += len(records)
                        log.error("topic %s: %d messages could not be written to disk: %s", self.name,
                                  len(records), exc)
            await backend.close()
        except DiskQueueError as exc:
            log.error("topic %s: closing its disk queue failed: %s", self.name, exc)
        return lost

    def delete_queues(self) -> None:
        """Remove the topic's files (it was deleted)."""
        if self.backend is not None:
            self.backend.delete()

    # ---------------------------------------------------------------- channels

    def get_channel(self, name: str) -> Channel:
        """The channel called ``name``, created (and recorded in metadata) if new."""
        channel = self.channels.get(name)
        if channel is None:
            channel = Channel(self.name, name, self._host, topic_e2e=self.e2e,
                              on_empty=lambda: self.delete_channel(name))
            self.channels[name] = channel
            if self._nursery is not None:
                channel.start(self._nursery)
            else:
                self._pending_channels.append(channel)
            if not channel.ephemeral:
                self._host.metadata_changed()
            self._host.registry_changed(RegistryChange(self.name, name, created=True))
            self._wakeup.set()
        return channel

    def delete_channel(self, name: str) -> None:
        """Remove a channel: its clients are disconnected and its files deleted.

        An ephemeral topic goes away with its last channel. Raises KeyError if absent.
        """
        channel = self.channels.pop(name)
        channel.close()
        for client in list(channel.clients):
            client.close_soon()
        channel.delete_queues()
        if not channel.ephemeral:
            self._host.metadata_changed()
        self._host.registry_changed(RegistryChange(self.name, name, created=False))
        if self.ephemeral and not self.channels and not self.exiting:
            self._on_empty()

    # ---------------------------------------------------------------- publishing

    @property
    def depth(self) -> int:
        return self.ready.depth

    @property
    def backend_depth(self) -> int:
        return self.ready.backend_depth

    def put_many(self, msgs: list[Message]) -> None:
        """Accept published messages (all or nothing: the caller validated them).

        Raises the disk queue's error if a spill to disk fails; nothing of the
        batch is then kept in memory either. In durable mode every message is
        written to disk; the caller then awaits ``group.wait()`` before ``OK``.
        """
        self.ready.put(msgs)
        self.message_count += len(msgs)
        self.message_bytes += sum(len(m.body) for m in msgs)
        if self.channels and not self.paused:  # else a new channel or unpause wakes the pump
            self._wakeup.set()

    # ---------------------------------------------------------------- the pump

    def _can_pump(self) -> bool:
        return bool(self.channels) and not self.paused and not self.exiting

    async def _pump(self) -> None:
        move = self._move_records if self.durable else self._move_messages
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            while self._can_pump():
                if (self._refused and not self._copy_refused()) or self._held_back():
                    await trio.sleep(RETRY_DELAY)  # the disk refused again: wait for it
                    continue
                if not move():
                    break
                await trio.lowlevel.checkpoint()

    def _move_messages(self) -> bool:
        batch = self.ready.take(PUMP_BATCH, REFILL_BATCH)
        if batch:
            self.fan_out(batch)
        return bool(batch)

    def fan_out(self, batch: list[Message]) -> None:
        """Give every channel its copy of ``batch``; deferred messages wait in each channel."""
        channels = list(self.channels.values())
        ready = [m for m in batch if not m.due_ns]
        deferred = [m for m in batch if m.due_ns] if len(ready) != len(batch) else []
        for i, channel in enumerate(channels):
            last = i == len(channels) - 1
            if ready:
                channel.put_many(ready if last else [m.copy() for m in ready])
            for msg in deferred:
                channel.put_deferred(msg if last else msg.copy())

    def _move_records(self) -> bool:
        """Durable mode: hand a batch of records to every channel; True if there was one."""
        backend = self.backend
        assert backend is not None
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
                self._host.disk_failed(exc)
                self._refused[channel.name] = (channel, batch, last)
        if resuming and last + 1 >= self._resume_end:
            self._stop_resuming(None)
        self._fanned_out.set()
        return True

    def _held_back(self) -> bool:
        """Whether a channel holds more in memory than it may because its disk refused a spill.

        Each such channel tries its spill again; while one still cannot, the topic
        keeps its messages (a topic that must spill and cannot refuses publishes),
        so memory stays bounded whatever the disk does.
        """
        full = [c.ready for c in self.channels.values() if c.ready.over_limit]
        return bool(full) and not all([ready.spill_excess() for ready in full])

    def _copy_refused(self) -> bool:
        """Durable mode: copy again the batches channels refused; False if a disk still refuses.

        A batch the disk took in part is copied whole: duplicates, never a loss.
        """
        for name, (channel, batch, last) in list(self._refused.items()):
            if self.channels.get(name) is channel:
                try:
                    channel.put_records(batch, last)
                except DiskQueueError as exc:
                    self._host.disk_failed(exc)
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
        """Durable mode: commit fanned-out records once every channel's copy is durable."""
        backend = self.backend
        assert backend is not None
        while True:
            await self._fanned_out.wait()
            self._fanned_out = trio.Event()
            n, epoch = self._uncommitted, self._epoch
            if not n or self._refused:
                continue
            channels = list(self.channels.values())
            try:
                await self._host.wait_metadata_persisted()
                for channel in channels:
                    try:
                        await channel.wait_durable()
                    except DiskQueueClosed:
                        pass  # deleted meanwhile: its copies are gone anyway
            except DiskQueueError as exc:
                self._host.disk_failed(exc)
                self._fanned_out.set()
            else:
                if epoch == self._epoch and not self._refused:
                    self._uncommitted -= n
                    backend.commit(n)
                    await self._checkpoint(backend)
            await trio.sleep(COMMIT_INTERVAL)

    async def _checkpoint(self, backend: DiskQueue) -> None:
        """Write the moved committed cursor now rather than at the queue's next policy sync:
        after a crash the topic then reads again only what it fanned out since its last commit step."""
        try:
            await backend.sync()
        except DiskQueueError as exc:
            self._host.disk_failed(exc)

    # ---------------------------------------------------------------- admin

    def pause(self) -> None:
        self.paused = True

    def unpause(self) -> None:
        self.paused = False
        self._wakeup.set()

    def empty(self) -> None:
        """Drop every message queued at the topic (``/topic/empty``)."""
        self.ready.empty()
        if self.backend is not None:
            self._uncommitted = 0
            self._epoch += 1
            self._refused.clear()
            self._stop_resuming(None)
