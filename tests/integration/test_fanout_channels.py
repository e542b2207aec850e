"""Many channels of one topic on an in-process broker: every channel gets every message once,
whatever the others do with theirs, in memory, spilled to disk and across a graceful restart.

A topic hands the same messages to all its channels (``broker/core/fanout.py``); these tests
try to make one channel's handling leak into another's: REQs, timeouts and FINs on some
channels while others have not read, memory full so that batches spill, a restart halfway.
"""

from __future__ import annotations

import collections

import pytest
import trio

from broker.protocol import encode_mpub, encode_req
from tests.support.draining import drain
from tests.support.v2client import connect, subscriber

CHANNELS = [f"c{i}" for i in range(10)]
COUNT = 600


def _bodies(start: int, count: int) -> list[bytes]:
    return [b"m%05d" % i for i in range(start, start + count)]


async def _publish(daemon, bodies: list[bytes]) -> None:
    client = await connect(daemon.addresses.tcp)
    for i in range(0, len(bodies), 100):
        await client.send(encode_mpub("t", bodies[i:i + 100]))
        await client.expect_response(b"OK")
    await client.aclose()


async def _drain_all(daemon, channels: list[str]) -> dict[str, collections.Counter]:
    """FIN everything each channel delivers until it holds nothing; what each delivered, counted."""
    got: dict[str, collections.Counter] = {}
    topic = daemon.broker.topics["t"]
    for name in channels:
        client = await subscriber(daemon, "t", name, rdy=250)
        channel = topic.channels[name]
        counts: collections.Counter = collections.Counter()
        with trio.fail_after(30):
            await drain(client, lambda c=channel: not c.in_flight and c.depth == 0 and topic.depth == 0,
                        on_message=lambda _, m, counts=counts: counts.update([m.body]))
        await client.aclose()
        got[name] = counts
    return got


@pytest.mark.parametrize("mem", [100_000, 50], ids=["in-memory", "spilling"])
async def test_each_of_ten_channels_gets_every_message_once_whatever_the_others_do(start_daemon, mem: int):
    first, second = _bodies(0, COUNT), _bodies(COUNT, COUNT)
    flags = (f"--mem-queue-size={mem}", "--msg-timeout=1s")
    async with start_daemon(*flags) as d:
        for name in CHANNELS:
            d.broker.get_topic("t").get_channel(name)
        await _publish(d, first)
        # c0 requeues everything it is given once; c1 takes 100 and never answers (they time
        # out and come back); c2 finishes all; the others have not read at all
        c0 = await subscriber(d, "t", "c0", rdy=COUNT)
        requeued = await c0.read_messages(COUNT)
        await c0.send(b"".join(encode_req(m.id, 0) for m in requeued))
        c1 = await subscriber(d, "t", "c1", rdy=100)
        held = await c1.read_messages(100)
        assert len({m.id for m in held}) == 100
        done_early = await _drain_all(d, ["c2"])
        await c0.aclose()
        await c1.aclose()
    assert done_early == {"c2": collections.Counter(first)}
    assert sorted(m.body for m in requeued) == first and all(m.attempts == 1 for m in requeued)

    # a graceful restart keeps each channel's own state, then more messages arrive
    async with start_daemon(*flags) as d:
        await _publish(d, second)
        got = await _drain_all(d, CHANNELS)
    assert got["c2"] == collections.Counter(second)
    for name in CHANNELS:
        if name != "c2":
            assert got[name] == collections.Counter(first + second), name
