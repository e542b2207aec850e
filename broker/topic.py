"""A topic: the publish side of the broker, fanning every message out to its channels.

Published messages enter a bounded memory deque that spills into the topic's
disk queue (sticky, as in :mod:`broker.channel`, so order is kept). One pump
task per topic moves every ready message to each channel (a copy per channel)
and then waits once; it runs only while the topic has a channel and is not
paused, so a topic with no channels keeps its messages for the first one.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING

import trio

from .channel import REFILL_BATCH, Channel
from .message import Message, decode, encode
from .protocol import is_ephemeral

if TYPE_CHECKING:
    from .broker import Broker

__all__ = ["Topic"]

log = logging.getLogger("pynsqd.topic")

#: Messages the pump moves before it lets other tasks run.
PUMP_BATCH = 4096


class Topic:
    """A named topic; owned by the :class:`~broker.broker.Broker`.

    Owns its channels, its disk queue (None when ephemeral) and a nursery in
    which its pump and its queues' sync loops run.
    """

    def __init__(self, broker: "Broker", name: str):
        self.broker = broker
        self.name = name
        self.ephemeral = is_ephemeral(name)
        self.mem_limit = broker.options.mem_queue_size
        self.memory: deque[Message] = deque()
        self.backend = None if self.ephemeral else broker.open_backend(name)
        self.channels: dict[str, Channel] = {}
        self.paused = False
        self.exiting = False
        self.message_count = 0
        self.message_bytes = 0
        self.dropped_count = 0
        self.e2e = broker.new_latency_stream()
        self._wakeup = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._cancel_scope = trio.CancelScope()
        self._pending_channels: list[Channel] = []

    # ---------------------------------------------------------------- lifecycle

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run the pump and the sync loops of this topic's queues until closed."""
        with self._cancel_scope:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if self.backend is not None:
                    nursery.start_soon(self.backend.run)
                for channel in self._pending_channels:
                    nursery.start_soon(channel.run)
                self._pending_channels.clear()
                nursery.start_soon(self._pump)
                task_status.started()

    def close(self) -> None:
        """Stop the pump and every channel's task; the broker closes the files."""
        self.exiting = True
        for channel in self.channels.values():
            channel.close()
        self._cancel_scope.cancel()

    # ---------------------------------------------------------------- channels

    def get_channel(self, name: str) -> Channel:
        """The channel called ``name``, created (and recorded in metadata) if new."""
        channel = self.channels.get(name)
        if channel is None:
            channel = Channel(self, name)
            self.channels[name] = channel
            if self._nursery is not None:
                self._nursery.start_soon(channel.run)
            else:
                self._pending_channels.append(channel)
            if not channel.ephemeral:
                self.broker.metadata_changed()
            self._wake()
        return channel

    def delete_channel(self, name: str) -> None:
        """Remove a channel: its clients are disconnected and its files deleted.

        An ephemeral topic goes away with its last channel. Raises KeyError if absent.
        """
        channel = self.channels.pop(name)
        channel.close()
        for client in list(channel.clients):
            client.close_soon()
        if channel.backend is not None:
            channel.backend.delete()
        self.broker.delete_deferred_store(channel)
        if not channel.ephemeral:
            self.broker.metadata_changed()
        if self.ephemeral and not self.channels and not self.exiting:
            self.broker.delete_topic(self.name)

    # ---------------------------------------------------------------- publishing

    @property
    def depth(self) -> int:
        return len(self.memory) + (self.backend.depth if self.backend is not None else 0)

    @property
    def backend_depth(self) -> int:
        return self.backend.depth if self.backend is not None else 0

    def put_many(self, msgs: list[Message]) -> None:
        """Accept published messages (all or nothing: the caller validated them).

        Raises the disk queue's error if a spill to disk fails; nothing of the
        batch is then kept in memory either.
        """
        backend = self.backend
        memory = self.memory
        if backend is not None and backend.depth:
            backend.put_many([encode(m) for m in msgs])
        else:
            room = self.mem_limit - len(memory)
            if room >= len(msgs):
                memory.extend(msgs)
            elif backend is None:
                if room > 0:
                    memory.extend(msgs[:room])
                self.dropped_count += len(msgs) - max(room, 0)
            else:
                spill = msgs[max(room, 0):]
                backend.put_many([encode(m) for m in spill])
                if room > 0:
                    memory.extend(msgs[:room])
        self.message_count += len(msgs)
        self.message_bytes += sum(len(m.body) for m in msgs)
        self._wake()

    def _wake(self) -> None:
        self._wakeup.set()

    # ---------------------------------------------------------------- the pump

    def _take(self, limit: int) -> list[Message]:
        """Up to ``limit`` messages in order: memory first, then disk."""
        memory = self.memory
        if memory:
            if len(memory) <= limit:
                batch = list(memory)
                memory.clear()
            else:
                batch = [memory.popleft() for _ in range(limit)]
            return batch
        backend = self.backend
        if backend is None or not backend.depth:
            return []
        batch = []
        for record in backend.read_many(min(limit, REFILL_BATCH)):
            try:
                batch.append(decode(record))
            except ValueError as exc:
                log.error("topic %s: skipping unreadable record: %s", self.name, exc)
        return batch

    def _can_pump(self) -> bool:
        return bool(self.channels) and not self.paused and not self.exiting

    async def _pump(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            while self._can_pump():
                batch = self._take(PUMP_BATCH)
                if not batch:
                    break
                self.fan_out(batch)
                await trio.lowlevel.checkpoint()

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

    # ---------------------------------------------------------------- admin

    def pause(self) -> None:
        self.paused = True

    def unpause(self) -> None:
        self.paused = False
        self._wake()

    def empty(self) -> None:
        """Drop every message queued at the topic (``/topic/empty``)."""
        self.memory.clear()
        if self.backend is not None:
            self.backend.empty()

    def flush_records(self) -> list[bytes]:
        """The topic's memory queue as disk records, for shutdown."""
        return [encode(m) for m in self.memory]
