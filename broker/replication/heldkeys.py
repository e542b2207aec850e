"""The publish keys of the copies a node holds for other nodes (see :mod:`.held`).

A key is remembered with the copy it came with until its dedup window ends, after the copy is
finished or taken over too, so that this node can say a retry of the publish on any node is a
duplicate (a KEYS request). At most ``max_keys`` are kept: the oldest go first, counted in
:attr:`HeldKeys.evicted`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

__all__ = ["HeldKeys"]


class HeldKeys:
    """topic -> publish key -> (expires_ns, origin, id) of the copy it came with."""

    __slots__ = ("index", "max_keys", "evicted", "_order", "_groups")

    def __init__(self, max_keys: int):
        self.index: dict[str, dict[bytes, tuple[int, str, bytes]]] = {}
        self.max_keys = max_keys
        #: keys forgotten before their window ended, to stay within max_keys, since start
        self.evicted = 0
        self._order: deque[tuple[int, str, bytes]] = deque()  # (expires_ns, topic, key) as they came
        self._groups: dict[tuple[str, str], int] = {}  # (origin, topic) -> keys remembered

    @property
    def held(self) -> int:
        return sum(self._groups.values())

    def known(self, topic: str, keys: list[bytes], now_ns: int) -> list[bytes]:
        """Which of ``keys`` of ``topic`` are remembered, within their window."""
        index = self.index.get(topic)
        if not index:
            return []
        found = []
        for key in keys:
            entry = index.get(key)
            if entry is not None and entry[0] > now_ns:
                found.append(key)
        return found

    def expiry(self, topic: str, key: bytes) -> int | None:
        """When the window of ``key`` ends (None: not remembered)."""
        entry = self.index.get(topic, {}).get(key)
        return None if entry is None else entry[0]

    def remember(self, origin: str, topic: str, key: bytes, expires: int, msg_id: bytes) -> None:
        """Remember ``key`` of ``origin``'s copy ``msg_id``. A key remembered already stays the
        first copy's (a retry's copies, dropped as duplicates, do not take it away), until the
        later of the two windows ends."""
        index = self.index.setdefault(topic, {})
        old = index.get(key)
        if old is None:
            index[key] = (expires, origin, msg_id)
            self._count(origin, topic, 1)
        elif expires > old[0]:
            index[key] = (expires, old[1], old[2])
        else:
            return
        self._order.append((expires, topic, key))

    def forget(self, topic: str, key: bytes, origin: str, msg_id: bytes) -> None:
        """Forget ``key`` if it is the one of ``origin``'s copy ``msg_id``."""
        index = self.index.get(topic)
        entry = index.get(key) if index is not None else None
        if entry is not None and entry[1] == origin and entry[2] == msg_id:
            self._drop(topic, key, entry)

    def expire(self, now_ns: int) -> None:
        """Forget the keys whose window ended, and the oldest past ``max_keys``."""
        order = self._order
        while order and (order[0][0] <= now_ns or len(order) > self.max_keys):
            expires, topic, key = order.popleft()
            entry = self.index.get(topic, {}).get(key)
            if entry is not None and entry[0] == expires:
                if expires > now_ns:
                    self.evicted += 1
                self._drop(topic, key, entry)

    def live(self, now_ns: int) -> Iterator[tuple[str, str, bytes, bytes, int]]:
        """(origin, topic, id, key, expires) of every key still within its window."""
        for topic, index in self.index.items():
            for key, (expires, origin, msg_id) in index.items():
                if expires > now_ns:
                    yield origin, topic, msg_id, key, expires

    def records(self, piece: int) -> int:
        """How many records the keys take in a compacted log, at most ``piece`` keys each."""
        return sum(count // piece + 1 for count in self._groups.values())

    def _drop(self, topic: str, key: bytes, entry: tuple[int, str, bytes]) -> None:
        index = self.index[topic]
        del index[key]
        if not index:
            del self.index[topic]
        self._count(entry[1], topic, -1)

    def _count(self, origin: str, topic: str, change: int) -> None:
        group = (origin, topic)
        count = self._groups.get(group, 0) + change
        if count:
            self._groups[group] = count
        else:
            self._groups.pop(group, None)
