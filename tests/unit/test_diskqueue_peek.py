"""``DiskQueue.peek_many``: the records ``read_many`` would return next, with nothing moved."""

from __future__ import annotations

import os
import random

import pytest

from diskqueue import DiskQueue, DiskQueueClosed
from diskqueue.format import segment_filename
from tests.support.diskqueues import records

NAME = "topic:channel"


def state(q: DiskQueue) -> tuple:
    stats = q.statistics()
    return q.depth, q.uncommitted, stats.read_cursor, stats.commit_cursor, stats.unsynced_operations


def test_peek_of_an_empty_queue_is_empty(tmp_path):
    q = DiskQueue(NAME, tmp_path)
    assert q.peek_many(10) == []
    q.put_many(records(3))
    assert q.read_many(3) == records(3)
    assert q.peek_many(10) == []
    q.delete()


def test_peek_returns_what_read_returns_next_and_moves_nothing(tmp_path):
    q = DiskQueue(NAME, tmp_path, auto_commit=False)
    q.put_many(records(10))
    assert q.read_many(3) == records(3)
    before = state(q)
    assert q.peek_many(4) == records(4, start=3)
    assert q.peek_many(100) == records(7, start=3)
    assert q.peek_many(0) == []
    assert state(q) == before
    assert q.read_many(100) == records(7, start=3)
    q.delete()


def test_peek_crosses_segments_including_the_one_being_written(tmp_path):
    q = DiskQueue(NAME, tmp_path, max_bytes_per_file=200)
    q.put_many(records(30))
    assert len([p for p in os.listdir(tmp_path) if p.endswith(".dat") and ".meta." not in p]) > 3
    assert q.read_many(5) == records(5)
    assert q.peek_many(30) == records(25, start=5)
    q.put_many(records(2, start=30))
    assert q.peek_many(100) == records(27, start=5)
    assert q.read_many(100) == records(27, start=5)
    q.delete()


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_peek_agrees_with_read_through_random_operations(tmp_path, seed):
    rng = random.Random(seed)
    q = DiskQueue(NAME, tmp_path, max_bytes_per_file=300, auto_commit=False)
    written = 0
    for _ in range(300):
        if rng.random() < 0.5:
            n = rng.randrange(1, 8)
            q.put_many(records(n, start=written, size=rng.randrange(10, 40)))
            written += n
        n = rng.randrange(0, 12)
        peeked = q.peek_many(n)
        assert q.read_many(n) == peeked
        if q.uncommitted and rng.random() < 0.3:
            q.commit()
    q.delete()


async def test_peek_after_reopen_sees_the_uncommitted_records_again(tmp_path):
    q = DiskQueue(NAME, tmp_path, auto_commit=False, max_bytes_per_file=200)
    q.put_many(records(12))
    q.read_many(8)
    q.commit(4)
    await q.close()
    q = DiskQueue(NAME, tmp_path, auto_commit=False, max_bytes_per_file=200)
    assert q.peek_many(100) == records(8, start=4)
    await q.close()


def test_peek_stops_at_damage_in_a_segment_and_goes_on_with_the_next(tmp_path):
    q = DiskQueue(NAME, tmp_path, max_bytes_per_file=200)
    q.put_many(records(20))
    first = tmp_path / segment_filename(NAME, 0)
    data = bytearray(first.read_bytes())
    data[-5] ^= 0xFF  # garble the payload of the last record of segment 0
    first.write_bytes(bytes(data))
    peeked = q.peek_many(100)
    got = q.read_many(100)
    assert peeked == got
    assert len(got) == 19
    q.delete()


async def test_peek_on_a_closed_queue_raises(tmp_path):
    q = DiskQueue(NAME, tmp_path)
    await q.close()
    with pytest.raises(DiskQueueClosed):
        q.peek_many(1)


@pytest.mark.parametrize("batch", [1, 7, 1000])
def test_scan_yields_what_peek_returns_in_batches_and_moves_nothing(tmp_path, batch):
    q = DiskQueue(NAME, tmp_path, auto_commit=False, max_bytes_per_file=300)
    q.put_many(records(50))
    q.read_many(5)
    before = state(q)
    batches = list(q.scan(batch))
    assert [r for b in batches for r in b] == q.peek_many(1000) == records(45, start=5)
    assert all(0 < len(b) <= batch for b in batches)
    assert state(q) == before
    q.delete()


def test_scan_reads_past_damage_as_peek_does(tmp_path):
    q = DiskQueue(NAME, tmp_path, max_bytes_per_file=300)
    q.put_many(records(30))
    path = tmp_path / segment_filename(NAME, 0)
    data = bytearray(path.read_bytes())
    data[100:103] = b"\xff\xff\xff"
    path.write_bytes(bytes(data))
    scanned = [r for b in q.scan(4) for r in b]
    assert scanned == q.peek_many(1000) and len(scanned) < 30
    q.delete()


async def test_scan_of_a_queue_closed_meanwhile_raises(tmp_path):
    q = DiskQueue(NAME, tmp_path, max_bytes_per_file=300)
    q.put_many(records(30))
    steps = q.scan(2)
    next(steps)
    await q.close()
    with pytest.raises(DiskQueueClosed):
        next(steps)
