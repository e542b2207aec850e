"""TimerHeap: the in-flight and deferred timers of a channel, driven directly."""

from __future__ import annotations

import random

from broker.core.message import Message
from broker.core.timers import TimerHeap


class Owner:
    """What a channel is to its heap: an index of live messages, each with its current key."""

    def __init__(self):
        self.index: dict[bytes, Message] = {}
        self.heap = TimerHeap(self.index)

    def add(self, n: int, key: float) -> Message:
        msg = Message(b"%016d" % n, b"body", 0)
        msg.deadline = key
        self.index[msg.id] = msg
        self.heap.push(key, msg)
        return msg

    def move(self, msg: Message, key: float) -> None:  # TOUCH: a new key for the same message
        msg.deadline = key
        self.heap.push(key, msg)

    def pop(self, now: float) -> list[int]:
        due = self.heap.pop_due(now)
        for msg in due:
            del self.index[msg.id]
        return [int(m.id) for m in due]


def test_in_order_and_out_of_order_keys_come_out_earliest_first():
    owner = Owner()
    for n, key in enumerate([1.0, 2.0, 3.0, 0.5, 2.5, 4.0, 1.5]):
        owner.add(n, key)
    assert owner.heap.next_key() == 0.5
    assert owner.pop(2.5) == [3, 0, 6, 1, 4]
    assert owner.heap.next_key() == 3.0
    assert owner.pop(10.0) == [2, 5]
    assert owner.heap.next_key() is None


def test_finished_and_touched_messages_are_skipped():
    owner = Owner()
    msgs = [owner.add(n, float(n)) for n in range(6)]
    del owner.index[msgs[1].id]          # FIN'd
    owner.move(msgs[2], 10.0)            # TOUCH'd past now
    owner.move(msgs[4], 0.5)             # an earlier key, pushed out of order
    assert owner.pop(5.0) == [0, 4, 3, 5]
    assert owner.heap.live() == [msgs[2]]
    assert owner.pop(10.0) == [2]


def test_compaction_keeps_only_live_entries_in_order():
    owner = Owner()
    msgs = [owner.add(n, float(n % 50) if n % 3 else float(n)) for n in range(300)]
    for msg in msgs[:250]:
        del owner.index[msg.id]
    owner.heap.compact(len(owner.index))
    assert len(owner.heap) == 50
    assert owner.heap.live() == sorted(msgs[250:], key=lambda m: m.deadline)


def test_random_keys_match_sorting():
    rng = random.Random(7)
    owner = Owner()
    keys = {}
    now = 0.0
    for n in range(2000):
        now += rng.random()
        key = now + rng.choice([30.0, 30.0, 30.0, 5.0, 60.0])
        owner.add(n, key)
        keys[n] = key
    got = []
    for t in range(0, 2200, 50):
        got += owner.pop(float(t))
    assert got == sorted(keys, key=lambda n: (keys[n], n))


def test_push_many_in_and_out_of_order():
    owner = Owner()
    first = [owner.add(n, 5.0) for n in range(3)]
    batch = []
    for n in range(3, 6):
        msg = Message(b"%016d" % n, b"body", 0)
        msg.deadline = 2.0  # earlier than what is queued: goes to the heap
        owner.index[msg.id] = msg
        batch.append(msg)
    owner.heap.push_many(2.0, batch)
    later = []
    for n in range(6, 8):
        msg = Message(b"%016d" % n, b"body", 0)
        msg.deadline = 7.0
        owner.index[msg.id] = msg
        later.append(msg)
    owner.heap.push_many(7.0, later)
    assert owner.heap.next_key() == 2.0
    assert owner.pop(5.0) == [3, 4, 5, 0, 1, 2]
    assert owner.pop(7.0) == [6, 7]
    assert first[0].id not in owner.index
