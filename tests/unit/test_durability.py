"""Unit tests of durable mode's parts: the ack floor, group commit and parked stores, on real files."""

from __future__ import annotations

import random

import trio

from broker.core.durability.ackfloor import AckFloor
from broker.core.durability.groupcommit import GroupCommit
from broker.core.durability.ledger import CommitLedger
from broker.core.durability.parked import ParkedStore
from broker.core.message import Message
from diskqueue import DiskQueue


def test_ack_floor_advances_over_the_done_prefix_only():
    acks = AckFloor()
    first = acks.issue(5)
    assert first == 0
    acks.done(1)
    acks.done(3)
    assert acks.take() == 0 and acks.floor == 0
    acks.done(0)
    assert acks.take() == 2 and acks.floor == 2
    acks.done(2)
    acks.done(4)
    assert acks.take() == 3 and acks.floor == 5 and len(acks) == 0
    acks.done(4)  # stale: ignored
    acks.done(99)  # never issued: ignored
    assert acks.take() == 0


def test_ack_floor_matches_a_reference_model():
    rng = random.Random(7)
    acks = AckFloor()
    issued, done, committed = 0, set(), 0
    for _ in range(20000):
        if rng.random() < 0.3:
            n = rng.randrange(1, 50)
            acks.issue(n)
            issued += n
        elif issued:
            ticket = rng.randrange(max(0, issued - 300), issued)
            acks.done(ticket)
            done.add(ticket)
        committed += acks.take()
        floor = committed
        while floor in done:
            floor += 1
        assert floor == committed, "the floor stops at the first ticket not done"


def test_ack_floor_reset_drops_old_tickets_and_changes_the_epoch():
    acks = AckFloor()
    acks.issue(3)
    acks.done(0)
    epoch = acks.epoch
    acks.reset()
    assert acks.take() == 0 and acks.epoch != epoch
    acks.done(1)
    assert acks.take() == 0
    t = acks.issue(1)
    acks.done(t)
    assert acks.take() == 1


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


async def test_group_commit_shares_one_sync_among_concurrent_writers(tmp_path):
    queue = DiskQueue("t", tmp_path, min_msg_size=1)
    group = GroupCommit(queue)

    async def writer(i: int) -> None:
        queue.put(b"record-%d" % i)
        await group.wait()

    async with trio.open_nursery() as nursery:
        for i in range(50):
            nursery.start_soon(writer, i)
    assert 1 <= group.syncs <= 3
    await queue.close()


class _GatedSync:
    """Stands in for a group commit whose sync has not finished until ``open`` is set."""

    def __init__(self) -> None:
        self.open = trio.Event()
        self.waiting = trio.Event()

    async def wait(self) -> None:
        self.waiting.set()
        await self.open.wait()


async def test_ledger_commits_only_after_the_replacements_are_durable(tmp_path):
    queue = _queue(tmp_path, "t:c")
    queue.put_many([b"x" * 30] * 4)
    acks = AckFloor()
    first = acks.issue(len(queue.read_many(4)))
    ledger = CommitLedger([(acks, queue)], on_error=lambda exc: None)
    gate = _GatedSync()
    acks.done(first)
    acks.done(first + 1)
    ledger.replaced(gate)  # their replacements were written elsewhere, not yet synced
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ledger.commit)
        await gate.waiting.wait()
        acks.done(first + 2)  # retired meanwhile: belongs to the next step
        assert queue.uncommitted == 4
        gate.open.set()
    assert queue.uncommitted == 2
    await ledger.commit()
    assert queue.uncommitted == 1
    await queue.close()


def test_ack_floor_done_ranges_are_the_runs_past_the_floor_matching_a_reference_model():
    rng = random.Random(7)
    acks = AckFloor()
    done: set[int] = set()
    issued = 0
    for _ in range(2000):
        if rng.random() < 0.3:
            acks.issue(rng.randrange(1, 20))
            issued = acks.floor + len(acks)
        elif issued:
            ticket = rng.randrange(max(0, issued - 60), issued)
            acks.done(ticket)
            done.add(ticket)
        expected = []
        for ticket in sorted(t for t in done if t >= acks.floor):
            if expected and expected[-1][1] == ticket:
                expected[-1] = (expected[-1][0], ticket + 1)
            else:
                expected.append((ticket, ticket + 1))
        assert acks.done_ranges(1 << 20) == expected
        assert acks.done_ranges(2) == expected[:2]
