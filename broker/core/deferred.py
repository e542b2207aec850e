"""A channel's deferred messages: by id, and in the order they fall due.

A channel and its retention both put messages here: the channel for a ``REQ``
with a delay, the retention for what it finds deferred in its files (a
restart, a refill from disk, a store that refused a write). Keeping the index
apart from the channel is what lets a retention hold a message back without
calling its channel: the retention is given this index, never the channel.

Due times are wall-clock nanoseconds (they survive a restart); the heap is
keyed by the Trio-clock deadline computed from them, so tests run on a mock
clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import trio

from broker.core.message import Message, now_ns
from broker.core.timers import TimerHeap

__all__ = ["Deferred"]



class Deferred:
    """Deferred messages by id (``get``, ``values``, ``len``) and their timers (``timers``).

    ``on_armed`` is called when the first timer is pushed into an empty heap
    (the broker's scanner then starts visiting the channel).
    """

    __slots__ = ("_messages", "timers")

    def __init__(self, on_armed: Callable[[], None] | None = None):
        self._messages: dict[bytes, Message] = {}
        self.timers = TimerHeap(self._messages, on_armed)

    def __len__(self) -> int:
        return len(self._messages)

    def __bool__(self) -> bool:
        return bool(self._messages)

    def __contains__(self, msg_id: object) -> bool:
        return msg_id in self._messages

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._messages)

    def get(self, msg_id: bytes) -> Message | None:
        return self._messages.get(msg_id)

    def values(self) -> list[Message]:
        return list(self._messages.values())

    def hold(self, msg: Message, due_ns: int) -> None:
        """Hold ``msg`` until the wall-clock time ``due_ns``; it is nobody's in flight meanwhile."""
        msg.due_ns = due_ns
        msg.deadline = trio.current_time() + max(0, due_ns - now_ns()) / 1e9
        msg.client = None
        self._messages[msg.id] = msg
        self.timers.push(msg.deadline, msg)

    def pop_due(self, now: float) -> list[Message]:
        """Take out the messages due by the Trio time ``now``, their due times cleared."""
        due = self.timers.pop_due(now)
        messages = self._messages
        for msg in due:
            del messages[msg.id]
            msg.due_ns = 0
        return due

    def compact(self) -> None:
        self.timers.compact(len(self._messages))

    def clear(self) -> None:
        self._messages.clear()
        self.timers.clear()
