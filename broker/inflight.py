"""Min-heaps of messages keyed by a time: in-flight deadlines and deferred due times.

Deletion is lazy: an entry is live only while the message is still in the
owner's index and still carries the key the entry was pushed with, so FIN,
REQ and TOUCH never search the heap. A heap is rebuilt when dead entries
outnumber live ones, which keeps its size proportional to the live messages.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Callable

from .message import Message

__all__ = ["TimerHeap"]

_counter = itertools.count()


class TimerHeap:
    """Messages ordered by a key (a Trio time or a wall-clock ns value).

    ``key_of(msg)`` returns the message's current key and ``is_live(msg)`` says
    whether the owner still holds it in this heap's state.
    """

    __slots__ = ("_heap", "_key_of", "_is_live")

    def __init__(self, key_of: Callable[[Message], float], is_live: Callable[[Message], bool]):
        self._heap: list[tuple[float, int, Message]] = []
        self._key_of = key_of
        self._is_live = is_live

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, key: float, msg: Message) -> None:
        """Add ``msg`` under ``key`` (the caller has already stored ``key`` on it)."""
        heapq.heappush(self._heap, (key, next(_counter), msg))

    def pop_due(self, now: float) -> list[Message]:
        """Remove and return every live message whose key is <= ``now``, earliest first."""
        heap = self._heap
        due = []
        while heap and heap[0][0] <= now:
            key, _seq, msg = heapq.heappop(heap)
            if self._is_live(msg) and self._key_of(msg) == key:
                due.append(msg)
        return due

    def next_key(self) -> float | None:
        """The smallest key in the heap (possibly of a dead entry), or None."""
        return self._heap[0][0] if self._heap else None

    def compact(self, live_count: int) -> None:
        """Drop dead entries when they are the majority."""
        if len(self._heap) > 64 and len(self._heap) > 2 * live_count:
            self._heap = [e for e in self._heap if self._is_live(e[2]) and self._key_of(e[2]) == e[0]]
            heapq.heapify(self._heap)

    def clear(self) -> None:
        """Forget every entry."""
        self._heap.clear()

    def live(self) -> list[Message]:
        """The live messages in key order (for persistence and inspection)."""
        seen = set()
        out = []
        for key, _seq, msg in sorted(self._heap, key=lambda e: (e[0], e[1])):
            if id(msg) not in seen and self._is_live(msg) and self._key_of(msg) == key:
                seen.add(id(msg))
                out.append(msg)
        return out
