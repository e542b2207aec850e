"""The streaming source's offset bookkeeping, without Spark or a broker."""

import random

import pytest

from pyspark_nsq.ledger import Ledger


def test_plan_numbers_messages_in_arrival_order():
    ledger = Ledger()
    ledger.receive(["a", "b", "c"])
    assert ledger.plan(0) == 3
    assert ledger.batch(0, 3) == ["a", "b", "c"]
    assert ledger.pending == 0 and ledger.planned == 3


def test_plan_without_messages_returns_start():
    ledger = Ledger()
    assert ledger.plan(7) == 7
    assert ledger.batch(7, 7) == []


@pytest.mark.parametrize(
    ("limit", "ends"),
    [(1, [1, 2, 3, 4, 5]), (2, [2, 4, 5, 5]), (5, [5, 5]), (None, [5, 5])],
)
def test_limit_bounds_each_batch(limit, ends):
    ledger = Ledger()
    ledger.receive("abcde")
    start, seen = 0, []
    for expected in ends:
        end = ledger.plan(start, limit)
        assert end == expected
        seen += ledger.batch(start, end)
        ledger.acknowledge(start)
        start = end
    assert seen == list("abcde")


def test_plan_again_from_same_start_keeps_the_planned_messages():
    # Spark may ask twice for the same start; the answer must cover what was planned.
    ledger = Ledger()
    ledger.receive("abc")
    assert ledger.plan(0) == 3
    ledger.receive("d")
    assert ledger.plan(0, 2) == 2
    assert ledger.plan(0) == 4
    assert ledger.batch(0, 4) == list("abcd")


def test_acknowledge_releases_only_offsets_below_end():
    ledger = Ledger()
    ledger.receive("abcd")
    ledger.plan(0, 2)
    ledger.plan(2, 2)
    assert ledger.acknowledge(2) == ["a", "b"]
    assert ledger.acknowledge(2) == []
    assert ledger.batch(2, 4) == ["c", "d"]
    assert ledger.acknowledge(4) == ["c", "d"]
    assert ledger.planned == 0


def test_replayed_range_unknown_here_is_empty_and_numbering_continues_after_it():
    # After a restart Spark replays the uncommitted batch [100, 150) first; its
    # messages were in flight to the dead process and come back from nsqd later.
    ledger = Ledger()
    ledger.receive(["late"])
    assert ledger.batch(100, 150) == []
    assert ledger.next_offset == 150
    assert ledger.plan(150) == 151
    assert ledger.batch(150, 151) == ["late"]


def test_commit_beyond_known_offsets_moves_numbering_forward():
    ledger = Ledger()
    assert ledger.acknowledge(40) == []
    ledger.receive("x")
    assert ledger.plan(40) == 41


def test_start_beyond_planned_range_acknowledges_nothing_it_never_planned():
    ledger = Ledger()
    ledger.receive("ab")
    assert ledger.plan(0) == 2
    # A start past our own numbering (a restart with a longer history) restarts the count.
    assert ledger.plan(10) == 10
    assert ledger.acknowledge(10) == ["a", "b"]


def test_eligible_skips_messages_but_keeps_their_order():
    ledger = Ledger()
    ledger.receive([1, 20, 2, 30, 3])
    end = ledger.plan(0, None, lambda item: item < 10)
    assert end == 3
    assert ledger.batch(0, 3) == [1, 2, 3]
    assert ledger.pending == 2
    assert ledger.plan(3) == 5
    assert ledger.batch(3, 5) == [20, 30]


def test_eligible_with_limit():
    ledger = Ledger()
    ledger.receive([1, 20, 2, 3])
    assert ledger.plan(0, 2, lambda item: item < 10) == 2
    assert ledger.batch(0, 2) == [1, 2]
    assert ledger.plan(2, 2, lambda item: item < 10) == 3
    assert ledger.batch(2, 3) == [3]


def test_discard_drops_only_pending_messages():
    ledger = Ledger()
    ledger.receive([("a", 1), ("b", 1)])
    ledger.plan(0)
    ledger.receive([("a", 2), ("b", 2)])
    assert ledger.discard(lambda item: item[0] == "a") == [("a", 2)]
    assert ledger.batch(0, 2) == [("a", 1), ("b", 1)]
    assert ledger.plan(2) == 3
    assert ledger.batch(2, 3) == [("b", 2)]


def test_release_returns_everything_held():
    ledger = Ledger()
    ledger.receive("abc")
    ledger.plan(0, 2)
    assert sorted(ledger.release()) == ["a", "b", "c"]
    assert ledger.pending == ledger.planned == 0


@pytest.mark.parametrize("seed", range(20))
def test_random_runs_deliver_every_message_in_exactly_one_batch(seed):
    """Drive the ledger as Spark drives the source, against a plain reference model."""
    rng = random.Random(seed)
    ledger = Ledger()
    received, batched, acknowledged = [], [], []
    start, counter = 0, 0
    uncommitted: list[tuple[int, int]] = []
    for _ in range(200):
        arrivals = list(range(counter, counter + rng.randrange(0, 6)))
        counter += len(arrivals)
        received += arrivals
        ledger.receive(arrivals)
        acknowledged += ledger.acknowledge(start)  # latestOffset(start)
        limit = rng.choice([None, 1, 3])
        end = ledger.plan(start, limit)
        assert end >= start
        if end > start:
            batch = ledger.batch(start, end)  # partitions(start, end)
            assert limit is None or len(batch) <= limit
            batched += batch
            uncommitted.append((start, end))
            start = end
        if uncommitted and rng.random() < 0.5:
            acknowledged += ledger.acknowledge(uncommitted.pop(0)[1])  # commit(end)
    acknowledged += ledger.acknowledge(start)
    assert batched == received[: len(batched)]
    assert acknowledged == batched
    assert ledger.release() == received[len(batched):]
