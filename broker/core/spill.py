"""A queue of ready messages: a bounded memory deque in front of a disk queue.

Messages go to memory while it has room and the disk queue holds nothing
unread; past that they *spill* to disk, and spilling is sticky: once the disk
queue holds unread records every new message goes behind them, so the queue
gives messages back in the order they arrived (memory first, then disk).
A write-through queue (durable mode) writes everything to disk.

A channel whose topic has priorities *ranks* its queue (:meth:`SpillQueue.rank`):
memory then keeps the most urgent messages in (priority, arrival) order, and the
disk queue the rest in no order, below a known *floor* (see :mod:`broker.core.ranking`).
The queue keeps the state of a sweep in progress (:meth:`SpillQueue.start_sweep`); its
owner runs the sweep a step at a time (:mod:`broker.core.sweeper`).

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
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence

from broker.core.message import Message, decode_all, encode
from broker.core.ranking import HIGHEST_KEY, LOWEST_KEY, Key, RankedMemory, rank_key
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

    __slots__ = ("memory", "backend", "limit", "write_through", "where", "_on_error", "_log",
                 "ranked", "floor", "disk_levels", "default_priority", "sweep_left", "unswept")

    def __init__(self, backend: DiskQueue | None, limit: int, *, where: str, log: logging.Logger,
                 write_through: bool = False, on_error: Callable[[DiskQueueError], None] | None = None):
        self.memory: deque[Message] = deque()
        self.backend = backend
        self.limit = limit
        self.write_through = write_through
        self.where = where
        self._on_error = on_error
        self._log = log
        self.ranked = False
        #: ranked: no unread disk record ranks before this key
        self.floor: Key = HIGHEST_KEY
        #: ranked: unread disk records per priority (exact after a sweep, kept up by writes); during
        #: a sweep, those written since it began
        self.disk_levels: Counter[int] = Counter()
        self.default_priority = 0
        #: ranked: records the sweep in progress has still to read (0: no sweep runs)
        self.sweep_left = 0
        #: ranked: during a sweep, the records it has still to read per priority (as far as known)
        self.unswept: Counter[int] = Counter()

    def rank(self, default: int) -> None:
        """Keep the ready messages in (priority, arrival) order from now on, ``default`` being the
        priority of a message without one. What is on disk is unknown until the next sweep."""
        if self.ranked:
            return
        self.ranked = True
        self.default_priority = default
        self.memory = RankedMemory(self.memory, rank_key(default))
        self.floor = LOWEST_KEY
        self.disk_levels.clear()

    def available(self) -> int:
        """Ranked: how many messages at the front of memory may go out before a sweep (those
        ranking at or before the floor; none while a sweep runs)."""
        memory = self.memory
        backend = self.backend
        if backend is None or not backend.depth:
            return len(memory)
        if self.sweep_left:
            return 0
        return memory.below(self.floor) if memory else 0  # type: ignore[attr-defined]

    def wrote(self, msgs: Sequence[Message]) -> None:
        """Ranked: ``msgs`` were appended to the disk queue (the floor and the levels follow)."""
        if msgs:
            self.wrote_keys(list(map(self.memory.key, msgs)))  # type: ignore[attr-defined]

    def wrote_keys(self, keys: Sequence[Key]) -> None:
        """Ranked: records of these keys were appended to the disk queue."""
        if not keys:
            return
        low = min(keys)
        if low < self.floor:
            self.floor = low
        self.disk_levels.update([k[0] for k in keys])

    def start_sweep(self) -> bool:
        """Ranked: a sweep starts, unless one runs already; False when the disk holds nothing.

        Every record unread now is to be read once (:meth:`sweep_read`, a step at a time)
        and what is written behind it counted again; until the last is read, nothing may go out.
        """
        backend = self.backend
        if self.sweep_left:
            return True
        if backend is None or not backend.depth:
            return False
        self.sweep_left = backend.depth
        self.unswept, self.disk_levels = self.disk_levels, Counter()
        self.floor = HIGHEST_KEY
        return True

    def sweep_read(self, count: int, msgs: Iterable[Message | None] = (), keys: Iterable[Key] = ()) -> bool:
        """Ranked: the sweep read ``count`` more records, those of ``msgs`` (None: unreadable) and
        of ``keys`` among them; True while it has more to read."""
        left = self.sweep_left = max(0, self.sweep_left - count)
        unswept = self.unswept
        if not left:
            unswept.clear()
        elif unswept:
            default = self.default_priority
            read = Counter(default if m.priority is None else m.priority for m in msgs if m is not None)
            read.update(k[0] for k in keys)
            unswept.subtract(read)
        return bool(left)

    def swept(self) -> None:
        """Ranked: no sweep runs, and no unread record is known to rank before memory (the disk was
        emptied, or refused a sweep's writes: see the channel's retention)."""
        self.sweep_left = 0
        self.unswept.clear()
        self.floor = HIGHEST_KEY
        self.disk_levels.clear()

    def levels(self) -> Counter[int]:
        """Ranked: ready messages per priority, in memory and on disk."""
        default = self.default_priority
        counts = Counter(default if m.priority is None else m.priority for m in self.memory)
        counts.update(self.disk_levels)
        if self.unswept:
            counts.update(+self.unswept)
        return counts

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
        if self.ranked:
            self._put_ranked(msgs, shared)
            return
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

    def _put_ranked(self, msgs: Sequence[Message], shared: SharedBatch | None) -> None:
        """:meth:`put` of a ranked queue: into memory in order, the least urgent past the limit
        to disk (dropped without a disk queue); write-through queues write everything."""
        backend = self.backend
        if backend is not None and self.write_through:
            backend.put_many(shared.records() if shared is not None else [encode(m) for m in msgs])
            self.wrote(msgs)
            return
        memory = self.memory
        batch = msgs
        tail: list[Message] = []
        if backend is not None and memory and len(memory) >= self.limit:
            # memory is full: what ranks after all of it goes straight to disk
            key = memory.key  # type: ignore[attr-defined]
            last = key(memory[-1])
            after = [key(m) > last for m in msgs]
            if any(after):
                tail = [m for m, a in zip(msgs, after) if a]
                msgs = [m for m, a in zip(msgs, after) if not a]
        memory.extend(msgs)
        excess = len(memory) - self.limit
        if excess > 0:
            tail.extend(memory.pop() for _ in range(excess))
        if not tail:
            return
        if backend is None:
            return  # as nsqd drops what is past the memory queue: here the least urgent
        try:
            backend.put_many([encode(m) for m in tail])
        except DiskQueueError as exc:
            if self._on_error is None:  # nothing of the batch is kept: memory as it was
                new = {id(m) for m in batch}
                memory.extend([m for m in tail if id(m) not in new])
                for msg in batch:
                    memory.discard(msg)  # type: ignore[attr-defined]
                raise
            memory.extend(tail)
            self._on_error(exc)
            return
        self.wrote(tail)

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
        if self.ranked:
            self.wrote(tail)
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
        """The next ``n`` messages in order (memory, then disk), unchanged.

        Ranked: what ranks at or before the floor is next; past it, every unread record is
        read (without taking it) to find the next ``n``."""
        memory = self.memory
        backend = self.backend
        if self.ranked and backend is not None and backend.depth and n > self.available():
            ahead = [memory[i] for i in range(min(n, len(memory)))]
            ahead.extend(decode_all(backend.peek_many(backend.depth), self._log, self.where))
            ahead.sort(key=memory.key)  # type: ignore[attr-defined]
            return ahead[:n]
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
        if self.ranked:
            self.swept()

