"""Min-heaps of messages keyed by a time: in-flight deadlines and deferred due times.

Deletion is lazy: an entry is live only while the message is still in the
owner's index and still carries the key the entry was pushed with (its ``deadline``), so FIN,
REQ and TOUCH never search the heap. A heap is rebuilt when dead entries
outnumber live ones, which keeps its size proportional to the live messages.
Keys pushed in order skip the heap's sift (see :class:`TimerHeap`).
"""

from __future__ import annotations

import heapq
import itertools
import operator
from collections import deque
from collections.abc import Callable, Mapping

from broker.core.message import Message

__all__ = ["TimerHeap"]

_counter = itertools.count()
_DEADLINE = operator.attrgetter("deadline")


class TimerHeap:
    """Messages ordered by their ``deadline`` (a Trio time or a wall-clock ns value).

    ``index`` is the owner's map of the messages it holds in this heap's state, by id:
    an entry is live while ``index`` maps its message's id to that very message and
    the message's ``deadline`` is still the key the entry was pushed with. (Checked
    inline, not through callbacks: a compaction checks every entry.)

    Keys mostly arrive in order (every delivery to clients with the same
    ``msg_timeout`` has a later deadline than the one before), so messages whose
    key is not below the last one pushed go to a sorted run, a deque of
    ``(key, [messages])`` groups (a sorted sequence is already a min-heap): a
    delivery of many messages adds one group, or extends the last one when the
    key is the same. Only the others go to the binary heap. The smallest key is
    the smaller of the two heads.
    """

    __slots__ = ("_run", "_run_count", "_heap", "_index", "_on_armed")

    def __init__(self, index: Mapping[bytes, Message], on_armed: Callable[[], None] | None = None):
        self._run: deque[tuple[float, list[Message]]] = deque()
        self._run_count = 0  # messages in the run's groups
        self._heap: list[tuple[float, int, Message]] = []
        self._index = index
        self._on_armed = on_armed  # called when a push finds the heap empty

    def __len__(self) -> int:
        return self._run_count + len(self._heap)

    def push(self, key: float, msg: Message) -> None:
        """Add ``msg`` under ``key`` (the caller has already stored ``key`` on it)."""
        self.push_many(key, [msg])

    def push_many(self, key: float, msgs: list[Message]) -> None:
        """Add ``msgs`` under one ``key`` (a delivery's batch; the list is kept)."""
        if not msgs:
            return
        if self._on_armed is not None and not (self._run_count or self._heap):
            self._on_armed()
        run = self._run
        if not run or key > run[-1][0]:
            run.append((key, msgs))
            self._run_count += len(msgs)
        elif key == run[-1][0]:
            run[-1][1].extend(msgs)
            self._run_count += len(msgs)
        else:
            heap = self._heap
            for msg in msgs:
                heapq.heappush(heap, (key, next(_counter), msg))

    def pop_due(self, now: float) -> list[Message]:
        """Remove and return every live message whose key is <= ``now``, earliest first."""
        held = self._index.get
        due = []
        run = self._run
        while run and run[0][0] <= now:
            key, group = run.popleft()
            self._run_count -= len(group)
            due.extend([msg for msg in group if msg.deadline == key and held(msg.id) is msg])
        heap = self._heap
        if heap and heap[0][0] <= now:
            from_run = len(due)
            while heap and heap[0][0] <= now:
                key, _seq, msg = heapq.heappop(heap)
                if msg.deadline == key and held(msg.id) is msg:
                    due.append(msg)
            if from_run and len(due) > from_run:
                due.sort(key=_DEADLINE)
        return due

    def next_key(self) -> float | None:
        """The smallest key held (possibly of a dead entry), or None."""
        run, heap = self._run, self._heap
        if run and heap:
            return min(run[0][0], heap[0][0])
        if run:
            return run[0][0]
        return heap[0][0] if heap else None

    def compact(self, live_count: int) -> None:
        """Drop dead entries when they are the majority."""
        total = self._run_count + len(self._heap)
        if total > 64 and total > 2 * live_count:
            held = self._index.get
            run: deque[tuple[float, list[Message]]] = deque()
            count = 0
            for key, group in self._run:
                group = [msg for msg in group if msg.deadline == key and held(msg.id) is msg]
                if group:
                    run.append((key, group))
                    count += len(group)
            self._run, self._run_count = run, count
            self._heap = [e for e in self._heap if e[2].deadline == e[0] and held(e[2].id) is e[2]]
            heapq.heapify(self._heap)

    def clear(self) -> None:
        """Forget every entry."""
        self._run.clear()
        self._run_count = 0
        self._heap.clear()

    def live(self) -> list[Message]:
        """The live messages in key order (for persistence and inspection)."""
        entries = [(key, msg) for key, group in self._run for msg in group]
        entries.extend((key, msg) for key, _seq, msg in self._heap)
        entries.sort(key=lambda e: e[0])
        held = self._index.get
        seen = set()
        out = []
        for key, msg in entries:
            if id(msg) not in seen and msg.deadline == key and held(msg.id) is msg:
                seen.add(id(msg))
                out.append(msg)
        return out
