"""The ack floor (``broker/core/durability/ackfloor.py``): tickets, the done prefix, the runs past it, against reference models."""

from __future__ import annotations

import random

from broker.core.durability.ackfloor import AckFloor


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
