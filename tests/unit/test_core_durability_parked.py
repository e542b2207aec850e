"""Parked stores (``broker/core/durability/parked.py``): deferred and buried messages on real files, across reopens and crashes."""

from __future__ import annotations

from broker.core.durability.parked import ParkedStore
from broker.core.message import Message
from diskqueue import DiskQueue


def _msg(i: int, due: int = 0) -> Message:
    return Message(b"%016x" % i, b"body-%d" % i, 1_700_000_000_000_000_000 + i, i % 5, due)


def _queue(path, name="t:c#store") -> DiskQueue:
    return DiskQueue(name, path, auto_commit=False, min_msg_size=26, max_bytes_per_file=64 * 1024)


async def test_parked_store_keeps_exactly_the_live_messages_across_reopen(tmp_path):
    store = ParkedStore(_queue(tmp_path))
    msgs = [_msg(i, due=5_000_000_000_000_000_000 + i) for i in range(100)]
    store.add(msgs[:60])
    store.add(msgs[60:])
    store.remove_many(msgs[10:90])
    store.settle(msgs[:10] + msgs[90:])
    store.commit()
    await store.close()
    store = ParkedStore(_queue(tmp_path))
    back = store.load()
    assert [(m.id, m.body, m.timestamp, m.attempts, m.due_ns) for m in back] == [
        (m.id, m.body, m.timestamp, m.attempts, m.due_ns) for m in msgs[:10] + msgs[90:]]
    await store.close()


async def test_parked_store_without_settle_brings_back_removals_past_the_floor(tmp_path):
    store = ParkedStore(_queue(tmp_path))
    msgs = [_msg(i) for i in range(10)]
    store.add(msgs)
    store.remove_many(msgs[:3] + msgs[5:])
    store.commit()
    await store.close()
    store = ParkedStore(_queue(tmp_path))
    # 0-2 were a prefix and are gone; 5-9 lie behind the live 3 and 4
    assert [m.body for m in store.load()] == [b"body-%d" % i for i in range(3, 10)]
    await store.close()


async def test_parked_store_uncommitted_removals_come_back_after_a_crash(tmp_path):
    store = ParkedStore(_queue(tmp_path))
    msgs = [_msg(i) for i in range(10)]
    store.add(msgs)
    await store.queue.sync()
    store.remove_many(msgs[:5])  # never committed: as if the process died here
    reopened = ParkedStore(_queue(tmp_path))
    assert len(reopened.load()) == 10
    await reopened.close()
    await store.queue.close()


async def test_parked_store_compacts_when_one_old_message_pins_the_floor(tmp_path):
    store = ParkedStore(_queue(tmp_path))
    pinned = _msg(0)
    store.add([pinned])
    live = [pinned]
    for round_number in range(1, 4):
        batch = [_msg(round_number * 10000 + i) for i in range(5000)]
        store.add(batch)
        store.remove_many(batch)
        if store.wants_compaction():
            store.compact(live)
        store.commit()
        await store.queue.sync()
    # the pinned message was rewritten past the dead records, which are gone from disk
    assert len(store.acks) == 1
    assert len(list(tmp_path.glob("t:c#store.diskqueue.0*.dat"))) <= 2
    await store.close()
    store = ParkedStore(_queue(tmp_path))
    assert [m.id for m in store.load()] == [pinned.id]
    await store.close()
