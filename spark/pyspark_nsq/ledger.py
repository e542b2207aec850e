"""The streaming source's offsets: which held message belongs to which batch.

nsq has no offsets, so the source makes its own: every message the driver
receives gets the next integer when it is first planned into a batch, and a
batch is the offset range ``[start, end)``. The ledger is the bookkeeping only, no
I/O, so the rules below are tested on their own:

- ``plan(start, limit)`` gives pending messages offsets from ``start`` on and
  returns the end of the next batch.
- ``batch(start, end)`` returns the messages of a planned range. A range this
  process never planned (a batch replayed from the checkpoint after a restart)
  comes back empty: its messages were in flight to the previous process and nsqd
  delivers them again, into a later batch.
- ``acknowledge(end)`` releases every message below ``end`` for FIN. The source
  calls it only for offsets Spark has committed.

Offsets only grow. Whenever Spark names an offset beyond the ledger's own (the
first call after a restart), numbering continues from there.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

__all__ = ["Ledger"]

T = TypeVar("T")


class Ledger(Generic[T]):
    """Offsets for held messages of one streaming query; owned by one thread."""

    __slots__ = ("_next", "_planned", "_pending")

    def __init__(self):
        self._next: int | None = None
        self._planned: collections.deque[tuple[int, T]] = collections.deque()
        self._pending: collections.deque[T] = collections.deque()

    @property
    def next_offset(self) -> int | None:
        """The offset the next planned message gets; None before the first call."""
        return self._next

    @property
    def pending(self) -> int:
        """Messages received and not yet planned into a batch."""
        return len(self._pending)

    @property
    def planned(self) -> int:
        """Messages planned into a batch and not yet acknowledged."""
        return len(self._planned)

    def _advance_to(self, offset: int) -> int:
        if self._next is None or self._next < offset:
            self._next = offset
        return self._next

    def receive(self, items: Iterable[T]) -> None:
        """Queue newly arrived messages for the next batch."""
        self._pending.extend(items)

    def plan(self, start: int, limit: int | None = None,
             eligible: Callable[[T], bool] | None = None) -> int:
        """The end offset of the batch that starts at ``start``.

        At most ``limit`` messages (None: all pending) are in ``[start, end)``;
        ``eligible`` skips pending messages that must wait (they stay pending, in
        order). Returns ``start`` when there is nothing to read.
        """
        end = self._advance_to(start)
        if limit is not None and start + limit <= end:
            return start + limit
        room = None if limit is None else start + limit - end
        if eligible is None:
            count = len(self._pending) if room is None else min(room, len(self._pending))
            for _ in range(count):
                self._planned.append((end, self._pending.popleft()))
                end += 1
        else:
            waiting: collections.deque[Any] = collections.deque()
            while self._pending and (room is None or room > 0):
                item = self._pending.popleft()
                if eligible(item):
                    self._planned.append((end, item))
                    end += 1
                    if room is not None:
                        room -= 1
                else:
                    waiting.append(item)
            waiting.extend(self._pending)
            self._pending = waiting
        self._next = end
        return end

    def batch(self, start: int, end: int) -> list[T]:
        """The messages planned in ``[start, end)``; empty for ranges never planned here."""
        self._advance_to(end)
        return [item for offset, item in self._planned if start <= offset < end]

    def acknowledge(self, end: int) -> list[T]:
        """Remove and return every planned message below ``end``."""
        self._advance_to(end)
        done = []
        while self._planned and self._planned[0][0] < end:
            done.append(self._planned.popleft()[1])
        return done

    def discard(self, predicate: Callable[[T], bool]) -> list[T]:
        """Remove and return the pending messages ``predicate`` selects.

        For messages of a connection that died: nsqd delivers them again, so
        planning them too would only duplicate them.
        """
        kept: collections.deque[Any] = collections.deque()
        dropped: list[Any] = []
        for item in self._pending:
            (dropped if predicate(item) else kept).append(item)
        self._pending = kept
        return dropped

    def release(self) -> list[T]:
        """Remove and return every message still held, planned or pending."""
        held = [item for _, item in self._planned]
        held.extend(self._pending)
        self._planned.clear()
        self._pending.clear()
        return held
