"""Every topic's publish keys in publish order, within ``--dedup-window`` and ``--dedup-max-keys``.

:class:`KeyStore` holds every key once more, oldest first (two deques: the key, and the
:class:`~broker.core.keys.journal.TopicKeys` that holds it) with the expiries as runs
``[expires_ns, count]`` (keys of one millisecond share a run). A usual batch (every key
new) costs two C loops over its keys: ``isdisjoint`` and ``update`` on the topic's set, then
two deque extends. Expiring and evicting pop from the oldest end; forgetting the keys of a
publish that failed removes their entries too, so a key stored again later is never
deleted early. The window is a duration from the publish, to the millisecond: a key is
remembered from its publish until ``window`` later, never longer, so a publish after the
window is stored. ``--dedup-max-keys`` bounds the keys of every topic together: past it the
oldest are forgotten before their window ends, and counted (:attr:`KeyStore.evicted`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from itertools import repeat
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.core.keys.journal import TopicKeys

__all__ = ["KeyStore", "RUN_NS"]

#: Keys published within one millisecond share an expiry.
RUN_NS = 1_000_000


class KeyStore:
    """Every topic's keys in publish order, within ``window_ns`` and ``max_keys``."""

    __slots__ = ("window_ns", "max_keys", "_keys", "_owners", "_runs", "evicted")

    def __init__(self, window_ns: int, max_keys: int):
        self.window_ns = window_ns
        self.max_keys = max_keys
        self._keys: deque[bytes] = deque()
        self._owners: deque[TopicKeys] = deque()  # the topic each key is held by
        self._runs: deque[list[int]] = deque()  # [expires_ns, keys in the run], oldest first
        #: keys forgotten before their window ended, to stay within max_keys
        self.evicted = 0

    @property
    def held(self) -> int:
        """Keys remembered, over all topics."""
        return len(self._keys)

    def admit(self, topic: TopicKeys, keys: list[bytes], now_ns: int) -> tuple[list[bool] | None, int]:
        """For each key, whether its message is to be stored (None: every one is), and when the
        new keys, now remembered, expire.

        An empty key (an unkeyed message) is always stored and not remembered; a key
        seen earlier in ``keys`` is a duplicate of that message.
        """
        self.expire(now_ns)
        held = topic.held
        window = self.window_ns
        if not window:
            topic.received += len(keys) - keys.count(b"")
            return None, 0
        expires = now_ns + window
        runs = self._runs
        if runs and runs[-1][0] > expires - RUN_NS:
            run = runs[-1]
            expires = run[0]
        else:
            run = [expires, 0]
            runs.append(run)
        count = len(keys)
        stored = None
        if held.isdisjoint(keys) and b"" not in keys:
            # the usual batch: every key new and none empty: two C loops, no Python per key
            before = len(held)
            held.update(keys)
            if len(held) - before == count:
                self._keys.extend(keys)
                self._owners.extend(repeat(topic, count))
                run[1] += count
                topic.received += count
            else:  # a key twice in the batch: the second is a duplicate of the first
                held.difference_update(keys)
                stored = self._admit_each(keys, run, topic)
        else:
            stored = self._admit_each(keys, run, topic)
        if not run[1]:
            runs.pop()
        excess = len(self._keys) - self.max_keys
        if excess > 0:
            self.evicted += self._pop(excess)
        return stored, expires

    def _admit_each(self, keys: list[bytes], run: list[int], topic: TopicKeys) -> list[bool]:
        held = topic.held
        stored = []
        added = received = 0
        append_key, append_owner = self._keys.append, self._owners.append
        for key in keys:
            if not key:
                stored.append(True)
                continue
            received += 1
            if key in held:
                stored.append(False)
                continue
            held.add(key)
            append_key(key)
            append_owner(topic)
            added += 1
            stored.append(True)
        run[1] += added
        topic.received += received
        topic.duplicates += received - added
        return stored

    def remember(self, entries: Iterable[tuple[int, TopicKeys, bytes]], now_ns: int) -> int:
        """Remember ``(expires_ns, topic, key)`` read back from the journals, in expiry order
        (over all topics, for the order to hold); returns how many were still live."""
        runs = self._runs
        count = 0
        for expires, topic, key in entries:
            if expires <= now_ns or key in topic.held:
                continue
            if not runs or runs[-1][0] <= expires - RUN_NS:
                runs.append([expires, 0])  # sorted: a run's keys expire within a millisecond after it
            runs[-1][1] += 1
            topic.held.add(key)
            self._keys.append(key)
            self._owners.append(topic)
            count += 1
        excess = len(self._keys) - self.max_keys
        if excess > 0:
            self.evicted += self._pop(excess)
        return count

    def forget(self, topic: TopicKeys, keys: list[bytes], stored: list[bool] | None) -> None:
        """Forget the keys :meth:`admit` remembered for a publish that then failed, so that
        the publisher's retry is stored. Looks for each from the newest end: rare (a failed
        disk write), so it is not worth an index."""
        held = topic.held
        for key, new in zip(keys, repeat(True) if stored is None else stored):
            if key and new and key in held:
                held.discard(key)
                self._remove_entry(topic, key)

    def _remove_entry(self, owner: TopicKeys, key: bytes) -> None:
        keys, owners, runs = self._keys, self._owners, self._runs
        index = len(keys) - 1
        while index >= 0 and not (owners[index] is owner and keys[index] == key):
            index -= 1
        if index < 0:
            return
        del keys[index]
        del owners[index]
        after = len(keys) + 1 - index  # entries from this one to the newest, before the removal
        for run in reversed(runs):
            if after <= run[1]:
                run[1] -= 1
                if not run[1]:
                    runs.remove(run)
                return
            after -= run[1]

    def expiries(self) -> dict[TopicKeys, list[tuple[int, bytes]]]:
        """Every remembered key with its expiry, oldest first, by topic."""
        found: dict[TopicKeys, list[tuple[int, bytes]]] = {}
        keys, owners = iter(self._keys), iter(self._owners)
        for expires, count in self._runs:
            for _ in range(count):
                key, owner = next(keys), next(owners)
                if key in owner.held:
                    found.setdefault(owner, []).append((expires, key))
        return found

    def expire(self, now_ns: int) -> None:
        """Forget every key whose window has ended."""
        runs = self._runs
        while runs and runs[0][0] <= now_ns:
            self._pop(runs[0][1])

    def _pop(self, count: int) -> int:
        """Forget the ``count`` oldest keys; returns ``count``."""
        keys, owners, runs = self._keys, self._owners, self._runs
        left = count
        while left:
            run = runs[0]
            take = min(left, run[1])
            for _ in range(take):
                owners.popleft().held.discard(keys.popleft())
            run[1] -= take
            left -= take
            if not run[1]:
                runs.popleft()
        return count
