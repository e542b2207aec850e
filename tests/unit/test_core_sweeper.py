"""A ranked channel's sweeps run a step per turn: messages put, requeued and finished between
the turns keep the (priority, arrival) order and the counts per priority, checked against a
sorted reference."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import trio
import trio.testing
from sortedcontainers import SortedList

from broker.core.message import Message, now_ns
from broker.core.retention.memory import SWEEP_STEP
from tests.support.fakes import FakeSubscriber

DEFAULT = 1 << 31
#: More records than a sweep reads in one turn, so every sweep takes several.
BACKLOG = 3000
#: Turns during which messages are published too (fewer than are finished meanwhile).
PUBLISHING = 2000


class CheckedConsumer(FakeSubscriber):
    """A consumer that checks each delivery is the most urgent ready message of ``ready``."""

    def __init__(self, ready: SortedList):
        super().__init__(rdy=1)
        self.ready = ready

    def send_messages(self, msgs):
        for msg in msgs:
            assert key(msg) == self.ready[0], (key(msg), self.ready[0])
            self.ready.remove(key(msg))
        super().send_messages(msgs)


def key(msg: Message) -> tuple[int, bytes]:
    return (DEFAULT if msg.priority is None else msg.priority, msg.id)


@pytest.mark.parametrize("flags", [(), ("--durable",)], ids=["spilling", "durable"])
async def test_puts_requeues_and_fins_between_the_turns_of_sweeps_keep_the_order(make_host, flags):
    rng = random.Random(7)
    ids = iter(range(1 << 30))

    def new(count: int) -> list[Message]:
        return [Message(b"%016x" % next(ids), b"x", now_ns(), 0, 0,
                        rng.choice([None, 0, 5, 9, rng.getrandbits(32)])) for _ in range(count)]

    channel = make_host("--mem-queue-size=100", *flags).channel()
    channel.rank(DEFAULT)
    ready = SortedList()
    consumer = CheckedConsumer(ready)
    backlog = new(BACKLOG)
    ready.update(map(key, backlog))
    channel.put_many(backlog)
    assert channel.backend_depth > 10 * SWEEP_STEP
    async with trio.open_nursery() as nursery:
        channel.start(nursery)
        channel.add_client(consumer)
        channel.dispatch()
        turns = 0
        while ready or channel.in_flight:
            action = rng.random()
            held = list(channel.in_flight.values())
            if action < 0.05 and turns < PUBLISHING:  # a publish, more or less urgent than what waits
                msgs = new(rng.randrange(1, 10))
                ready.update(map(key, msgs))
                channel.put_many(msgs)
            elif held and action < 0.08:  # REQ: back in its place by arrival
                ready.add(key(held[0]))
                channel.requeue(consumer, held[0].id, 0)
                channel.dispatch(consumer)
            elif held:
                assert channel.finish_many(consumer, [held[0].id]) == []
                channel.dispatch(consumer)
            await trio.lowlevel.checkpoint()  # a sweep in progress takes a turn
            turns += 1
            if turns % 50 == 0:  # /stats counts every ready message once, mid-sweep too
                assert channel.priority_levels() == sorted(Counter(k[0] for k in ready).items())
            if not channel.in_flight and ready and not channel.sweeper.running:
                await trio.testing.wait_all_tasks_blocked()
                assert channel.in_flight, "a message is ready, no sweep runs, and none was delivered"
        nursery.cancel_scope.cancel()
    assert channel.depth == 0 and consumer.finish_count + consumer.requeue_count == len(consumer.received)
