"""A queue of ready messages: a bounded memory deque in front of a disk queue.

Messages go to memory while it has room and the disk queue holds nothing
unread; past that they *spill* to disk, and spilling is sticky: once the disk
queue holds unread records every new message goes behind them, so the queue
gives messages back in the order they arrived (memory first, then disk).
A write-through queue (durable mode) writes everything to disk.

One disk-error policy per queue, chosen by its owner:

* no disk queue (ephemeral): messages past the memory limit are dropped, as nsqd does;
* ``on_error`` given: a failed spill is reported to it and the messages stay
  in memory past the limit (``over_limit``), so a full disk loses nothing until
  the process ends; the owner stops adding to such a queue and calls
  ``spill_excess`` until the disk takes the write;
* otherwise the disk queue's ``DiskQueueError`` is raised and nothing of the
  batch is kept (a publish then fails).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence

from broker.core.message import Message, decode_all, encode
from diskqueue import DiskQueue, DiskQueueError, RecordBatch

__all__ = ["REFILL_BATCH", "SharedBatch", "SpillQueue"]

#: Records read from disk into memory per refill at most.
REFILL_BATCH = 1024


class SharedBatch:
    """Messages a topic hands to several channels at once: the same objects, encoded for disk once.

    Every channel that spills the batch appends the same framed records
    (:class:`~diskqueue.RecordBatch`) to its queue, so a spill costs a channel one
    write, not an encoding per message.
    """

    __slots__ = ("messages", "_records")

    def __init__(self, messages: list[Message]):
        self.messages = messages
        self._records: RecordBatch | None = None

    def records(self, start: int = 0) -> RecordBatch:
        """The disk records of ``messages[start:]``."""
        if self._records is None:
            self._records = RecordBatch([encode(m) for m in self.messages])
        return self._records if not start else RecordBatch(self._records.payloads[start:])


class SpillQueue:
    """Ready messages of one topic or channel; owned by it. ``where`` names it in logs."""

    __slots__ = ("memory", "backend", "limit", "write_through", "where", "_on_error", "_log")

    def __init__(self, backend: DiskQueue | None, limit: int, *, where: str, log: logging.Logger,
                 write_through: bool = False, on_error: Callable[[DiskQueueError], None] | None = None):
        self.memory: deque[Message] = deque()
        self.backend = backend
        self.limit = limit
        self.write_through = write_through
        self.where = where
        self._on_error = on_error
        self._log = log

    @property
    def depth(self) -> int:
        """Messages held: memory plus unread disk records."""
        return len(self.memory) + (self.backend.depth if self.backend is not None else 0)

    @property
    def backend_depth(self) -> int:
        return self.backend.depth if self.backend is not None else 0

    def put(self, msgs: Sequence[Message], shared: SharedBatch | None = None) -> None:
        """Append ``msgs`` behind everything held, applying the disk-error policy (see the module docstring).

        ``shared``: ``msgs`` are that batch's messages, whose records it encodes once
        for every queue they spill to.
        """
        backend = self.backend
        memory = self.memory
        head: Sequence[Message] = ()
        if backend is None or not (self.write_through or backend.depth):
            room = self.limit - len(memory)
            if room >= len(msgs):
                memory.extend(msgs)
                return
            if room > 0:
                head, msgs = msgs[:room], msgs[room:]
            if backend is None:
                memory.extend(head)
                return
        try:
            backend.put_many(shared.records(len(head)) if shared is not None else [encode(m) for m in msgs])
        except DiskQueueError as exc:
            if self._on_error is None:
                raise
            self._on_error(exc)
            memory.extend(head)
            memory.extend(msgs)
            return
        memory.extend(head)

    @property
    def over_limit(self) -> bool:
        """Whether memory holds more than the limit because a spill was refused."""
        return self.backend is not None and len(self.memory) > self.limit

    def spill_excess(self) -> bool:
        """Write what memory holds past the limit to disk; True once memory is within it.

        A refusal is reported to ``on_error`` (the messages stay in memory).
        """
        memory = self.memory
        backend = self.backend
        excess = len(memory) - self.limit
        if backend is None or excess <= 0:
            return True
        tail = [memory[i] for i in range(len(memory) - excess, len(memory))]
        try:
            backend.put_many([encode(m) for m in tail])
        except DiskQueueError as exc:
            if self._on_error is None:
                raise
            self._on_error(exc)
            return False
        for _ in range(excess):
            memory.pop()
        return True

    def read(self, limit: int) -> list[Message]:
        """Up to ``limit`` messages from disk (none from memory), unreadable records skipped."""
        backend = self.backend
        if backend is None or not backend.depth:
            return []
        return decode_all(backend.read_many(limit), self._log, self.where)

    def take(self, limit: int, disk_limit: int) -> list[Message]:
        """Up to ``limit`` messages in order: from memory if it holds any, else up to ``disk_limit`` from disk."""
        memory = self.memory
        if not memory:
            return self.read(min(limit, disk_limit))
        if len(memory) <= limit:
            batch = list(memory)
            memory.clear()
            return batch
        return [memory.popleft() for _ in range(limit)]

    def peek(self, n: int) -> list[Message]:
        """The next ``n`` messages in order (memory, then disk), unchanged."""
        memory = self.memory
        out = list(memory) if len(memory) <= n else [memory[i] for i in range(n)]
        backend = self.backend
        if len(out) < n and backend is not None and backend.depth:
            out.extend(decode_all(backend.peek_many(n - len(out)), self._log, self.where))
        return out

    def records(self) -> list[bytes]:
        """The memory part as disk records (for a shutdown)."""
        return [encode(m) for m in self.memory]

    def empty(self) -> None:
        """Drop every message, in memory and on disk."""
        self.memory.clear()
        if self.backend is not None:
            self.backend.empty()

