"""Many consumers of one channel with RDY 1 share its messages in turn."""

from __future__ import annotations

import trio

from broker.protocol import encode_fin
from tests.support.v2client import publish_batch, subscriber
from tests.support.waiting import wait_for

CONSUMERS = 20
BATCH = 10
BATCHES = 10


async def test_batches_smaller_than_the_consumers_go_to_each_in_turn(daemon):
    consumers = [await subscriber(daemon, rdy=1) for _ in range(CONSUMERS)]
    channel = daemon.broker.topics["t"].channels["c"]
    await wait_for(lambda: len(channel.clients) == CONSUMERS and all(c.rdy == 1 for c in channel.clients))
    counts = [0] * CONSUMERS
    with trio.fail_after(30):
        for _ in range(BATCHES):
            await publish_batch(daemon, "t", *[b"m"] * BATCH)
            await wait_for(lambda: len(channel.in_flight) == BATCH)
            for i, consumer in enumerate(consumers):
                for msg in await consumer.sync():
                    counts[i] += 1
                    await consumer.send(encode_fin(msg.id))
            await wait_for(lambda: not channel.in_flight)
    assert counts == [BATCH * BATCHES // CONSUMERS] * CONSUMERS
