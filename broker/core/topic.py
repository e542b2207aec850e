"""A topic: the publish side of the broker, handing every message to its channels.

Published messages enter a :class:`~broker.core.spill.SpillQueue` whose
failed spill raises, so a publish fails with nothing of it kept (an
ephemeral topic drops what does not fit in memory). One pump task per topic
moves every ready message to each channel and then waits once; it runs only
while the topic has a channel and is not paused, so a topic with no channels
keeps its messages for the first one.

How the messages reach the channels is the topic's *fan-out*, chosen once
here: :class:`~broker.core.fanout.plain.Fanout` hands the same messages to every
channel (and, while none of several channels has a subscriber, *holds* them
in the topic's queue for all of them: see that module); with ``--durable``
(non-ephemeral topics)
:class:`~broker.core.fanout.durable.DurableFanout` writes every message
to the topic's disk queue first, copies the records to the channels and
commits them once every copy is on stable storage. The topic itself never
asks which one it has.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from broker.core.channel import Channel
from broker.core.durability.groupcommit import GroupCommit
from broker.core.fanout import DurableFanout, Fanout
from broker.core.host import CoreHost, RegistryChange
from broker.core.keys import KEY_RECORD_MIN, TopicKeys, journal_name
from broker.core.message import Message
from broker.core.retention import RETRY_DELAY
from broker.core.spill import SpillQueue
from broker.core.tasks import TaskSet
from broker.protocol import is_ephemeral
from diskqueue import DiskQueue, DiskQueueError

__all__ = ["Topic"]

log = logging.getLogger("pynsqd.topic")


class Topic:
    """A named topic; owned by the :class:`~broker.core.broker.Broker`.

    Owns its channels, its queue of published messages, its fan-out and a
    nursery in which its pump, the fan-out's tasks and its channels' tasks run.
    ``on_empty`` is called when an ephemeral topic loses its last channel.
    """

    def __init__(self, name: str, host: CoreHost, on_empty: Callable[[], None]):
        self.name = name
        self._host = host
        self._on_empty = on_empty
        options = host.options
        self.ephemeral = is_ephemeral(name)
        durable = options.durable and not self.ephemeral
        backend = None if self.ephemeral else host.queues.open(name, auto_commit=not durable)
        self.ready = SpillQueue(backend, options.mem_queue_size, where=f"topic {name}", log=log,
                                write_through=durable)
        self.channels: dict[str, Channel] = {}
        self.fanout: Fanout
        if durable and backend is not None:
            self.fanout = DurableFanout(name, self.ready, backend, self.channels, host)
        else:
            self.fanout = Fanout(name, self.ready, self.channels, host)
        #: what a publisher awaits before its answer (durable mode: the group commit), or None
        self.wait_stored: Callable[[], Awaitable[None]] | None = self.fanout.wait_stored
        self.paused = False
        self.exiting = False
        self.message_count = 0
        self.message_bytes = 0
        self.e2e = host.latency_stream()
        self._wakeup = trio.Event()
        self._pump_started = False  # the pump starts with the first work it is woken for
        self._nursery: trio.Nursery | None = None
        self._cancel_scope = trio.CancelScope()
        self._tasks = TaskSet()  # the disk queue's sync loop, started once it has work
        self._pending_channels: list[Channel] = []
        #: a message with a priority of its own was published: every channel ranks (see
        #: :mod:`broker.core.ranking`); kept in the metadata file
        self.ranked = False
        #: the topic's own number of replicas (None: the node's ``--replicas``); kept in the
        #: metadata file, applied by the broker to its copies
        self.replicas: int | None = None
        #: ids of messages another node took over (--replicas), shared with every channel
        self.taken: set[bytes] | None = None
        self._pump_waiting = False  # the pump waits for a disk that refused a write
        #: the keys of keyed publishes (see :mod:`broker.core.keys`), made by the first
        self.keys: TopicKeys | None = None

    @property
    def backend(self) -> DiskQueue | None:
        """The topic's disk queue (None when ephemeral)."""
        return self.ready.backend

    @property
    def depth(self) -> int:
        """Messages queued at the topic of its own (what it holds for its channels is theirs)."""
        return self.ready.depth - self.fanout.held

    @property
    def backend_depth(self) -> int:
        """The topic's own messages in its disk queue."""
        held_on_disk = max(0, self.fanout.held - len(self.ready.memory))
        return self.ready.backend_depth - held_on_disk

    # ---------------------------------------------------------------- lifecycle

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run the pump, the fan-out's tasks and the sync loops of this topic's queues until closed."""
        with self._cancel_scope:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._tasks.attach(nursery)
                if self.backend is not None:
                    self.backend.run_on_demand(self._tasks)
                for channel in self._pending_channels:
                    channel.start(nursery)
                self._pending_channels.clear()
                self.fanout.start(nursery)
                task_status.started()
                await trio.sleep_forever()  # the nursery stays open for tasks started later

    def close(self) -> None:
        """Stop the pump and every channel's task; the broker closes the files."""
        self.exiting = True
        for channel in self.channels.values():
            channel.close()
        self._tasks.close()
        self._cancel_scope.cancel()

    def key_store(self, *, restored: bool = False) -> TopicKeys:
        """The topic's keys, and its journal of them (none for an ephemeral topic), made on first use.

        ``restored``: only when the journal has files (start-up: a topic that never had a
        keyed publish gets none); raises KeyError otherwise.
        """
        keys = self.keys
        if keys is None:
            if self.ephemeral:
                keys = TopicKeys(None)
            else:
                name = journal_name(self.name)
                if restored and not self._host.queues.exists(name):
                    raise KeyError(name)
                journal = self._host.queues.open(name, auto_commit=False, min_record=KEY_RECORD_MIN)
                journal.run_on_demand(self._tasks)
                keys = TopicKeys(journal, GroupCommit(journal) if self._host.options.durable else None)
            self.keys = keys
        return keys

    async def close_queues(self) -> int:
        """Shutdown: close every channel's queues, then the topic's own; returns how many
        messages could not be written to disk (each failure is logged, and everything
        else is still written and closed).

        Channels first: in durable mode the records the pump fanned out are
        committed only once the channels' copies are synced.
        """
        lost = 0
        self.fanout.settle_skips(self.paused)
        for channel in self.channels.values():
            lost += await channel.close_queues()
        keys = self.keys
        if keys is not None and keys.journal is not None:
            try:
                await keys.journal.close()
            except DiskQueueError as exc:
                log.error("topic %s: closing its journal of publish keys failed: %s", self.name, exc)
        backend = self.backend
        if backend is None:
            return lost
        try:
            lost += self.fanout.settle()
            await backend.close()
        except DiskQueueError as exc:
            log.error("topic %s: closing its disk queue failed: %s", self.name, exc)
        return lost

    def delete_queues(self) -> None:
        """Remove the topic's files (it was deleted)."""
        if self.backend is not None:
            self.backend.delete()
        keys = self.keys
        if keys is not None:
            keys.held.clear()
            if keys.journal is not None:
                keys.journal.delete()

    def skip_taken(self, ids: list[bytes]) -> None:
        """Never deliver the messages ``ids`` from here: another node took them over (``--replicas``)."""
        if self.taken is None:
            self.taken = set()
            for channel in self.channels.values():
                channel.taken = self.taken
        self.taken.update(ids)

    def rank(self) -> bool:
        """Have every channel deliver in (priority, arrival) order from now on; True if the topic
        did not before (the metadata file must then say so)."""
        if self.ranked:
            return False
        self.ranked = True
        default = self._host.options.default_priority
        for channel in self.channels.values():
            channel.rank(default)
        self._host.metadata_changed()
        return True

    # ---------------------------------------------------------------- channels

    def get_channel(self, name: str, *, restored: bool = False) -> Channel:
        """The channel called ``name``, created (and recorded in metadata) if new.

        A new channel gets the messages published from now on (and, if it is the
        first, those the topic kept for one); ``restored``: it is one of the
        channels of the metadata file, which get everything the topic kept.
        """
        channel = self.channels.get(name)
        if channel is None:
            channel = Channel(self.name, name, self._host, topic_e2e=self.e2e,
                              on_empty=lambda: self.delete_channel(name), upstream=self)
            self.channels[name] = channel
            channel.taken = self.taken
            if self.ranked:
                channel.rank(self._host.options.default_priority)
            if not restored or len(self.channels) == 1:
                self.fanout.channel_added(name, self.paused)
            if self._nursery is not None:
                channel.start(self._nursery)
            else:
                self._pending_channels.append(channel)
            if not channel.ephemeral:
                self._host.metadata_changed()
            self._host.registry_changed(RegistryChange(self.name, name, created=True))
            if self.ready.depth:
                self._wake()
        return channel

    def delete_channel(self, name: str) -> None:
        """Remove a channel: its clients are disconnected and its files deleted.

        An ephemeral topic goes away with its last channel. Raises KeyError if absent.
        """
        channel = self.channels.pop(name)
        self.fanout.channel_removed(name)
        self._wake()  # the others may not hold any longer
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

    def put_many(self, msgs: list[Message]) -> None:
        """Accept published messages (all or nothing: the caller validated them).

        Raises the disk queue's error if a spill to disk fails; nothing of the
        batch is then kept in memory either. In durable mode every message is
        written to disk; the caller then awaits ``wait_stored()`` before ``OK``.
        """
        if msgs[0].due_ns and not self.paused and self.fanout.holding():
            # deferred (a publish's messages share their deferral): they wait in each channel,
            # counted there, as they would once moved
            self.fanout.deliver(msgs)
        else:
            self.ready.put(msgs)
            self.fanout.published(len(msgs), self.paused)
        self.message_count += len(msgs)
        self.message_bytes += sum(len(m.body) for m in msgs)
        if self.channels and not self.paused:  # else a new channel or unpause wakes the pump
            self._wake()

    # ---------------------------------------------------------------- the pump

    def _can_pump(self) -> bool:
        """Whether the pump may move messages (paused: only those the channels own)."""
        return (bool(self.channels) and not self.exiting and (not self.paused or self.fanout.held > 0)
                and not self.fanout.holding())

    def _wake(self) -> None:
        """Have the pump look at the queue: started now if it never ran (an idle topic
        costs no task, which a start with thousands of topics notices)."""
        self._wakeup.set()
        if not self._pump_started:
            self._pump_started = True
            self._tasks.start_soon(self._pump)

    async def _pump(self) -> None:
        fanout = self.fanout
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            while self._can_pump():
                if fanout.blocked():
                    self._pump_waiting = True
                    try:
                        await trio.sleep(RETRY_DELAY)  # a disk refused again: wait for it
                    finally:
                        self._pump_waiting = False
                    continue
                if not fanout.move(self.paused):
                    break
                await trio.lowlevel.checkpoint()

    # ---------------------------------------------------------------- what channels ask (Upstream)

    def held_for(self, channel: str) -> tuple[int, int]:
        return self.fanout.held_for(channel)

    def peek_held(self, channel: str, n: int) -> list[Message]:
        return self.fanout.peek_held(channel, n)

    def demand_changed(self) -> None:
        self._wake()

    def channel_emptied(self, channel: str) -> None:
        self.fanout.channel_emptied(channel)

    def moving(self) -> bool:
        return bool(self.ready.depth) and not self._pump_waiting and self._can_pump()

    # ---------------------------------------------------------------- admin

    def pause(self) -> None:
        self.paused = True

    def unpause(self) -> None:
        self.paused = False
        self.fanout.unpaused()
        self._wake()

    def empty(self) -> None:
        """Drop every message queued at the topic (``/topic/empty``); what it holds for its
        channels is theirs and stays."""
        self.fanout.empty()
