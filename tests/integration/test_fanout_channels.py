"""Many channels of one topic on an in-process broker: every channel gets every message once,
whatever the others do with theirs, in memory, spilled to disk and across a graceful restart.

A topic hands the same messages to all its channels (``broker/core/fanout/plain.py``); these tests
try to make one channel's handling leak into another's: REQs, timeouts and FINs on some
channels while others have not read, memory full so that batches spill, a restart halfway.
"""

from __future__ import annotations

import collections
import json

import pytest
import trio

from broker.protocol import encode_req
from tests.support.draining import drain
from tests.support.http_client import request
from tests.support.v2client import publish_batch, subscriber

CHANNELS = [f"c{i}" for i in range(10)]
COUNT = 600


def _bodies(start: int, count: int) -> list[bytes]:
    return [b"m%05d" % i for i in range(start, start + count)]


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
        await publish_batch(d, "t", *first, per_mpub=100)
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
        await publish_batch(d, "t", *second, per_mpub=100)
        got = await _drain_all(d, CHANNELS)
    assert got["c2"] == collections.Counter(second)
    for name in CHANNELS:
        if name != "c2":
            assert got[name] == collections.Counter(first + second), name


async def _channel_stats(daemon) -> tuple[dict, dict[str, dict]]:
    reply = await request(daemon.addresses.http, "GET", "/stats?format=json&topic=t")
    [topic] = json.loads(reply.body)["topics"]
    return topic, {c["channel_name"]: c for c in topic["channels"]}


async def test_ten_channels_nobody_reads_share_one_copy_on_disk_and_each_still_gets_every_message(
        start_daemon, tmp_path):
    """While no channel has a subscriber, the topic writes each message once for all of them;
    /stats shows every channel's depth as nsqd does, and a channel created or emptied meanwhile
    gets only what comes after, through a graceful restart."""
    first, second = _bodies(0, COUNT), _bodies(COUNT, COUNT)
    flags = ("--mem-queue-size=50",)
    data = tmp_path / "data"
    async with start_daemon(*flags) as d:
        assert (await request(d.addresses.http, "POST", "/topic/create?topic=t")).status == 200
        for name in CHANNELS:
            reply = await request(d.addresses.http, "POST", f"/channel/create?topic=t&channel={name}")
            assert reply.status == 200
        await publish_batch(d, "t", *first, per_mpub=100)
        topic, channels = await _channel_stats(d)
        assert (topic["depth"], topic["backend_depth"], topic["message_count"]) == (0, 0, COUNT)
        assert {(c["depth"], c["backend_depth"], c["message_count"]) for c in channels.values()} == {
            (COUNT, COUNT - 50, COUNT)}
        # one copy on disk, in the topic's queue; none of the channels has written a byte
        files = {p.name.split(".diskqueue.")[0]: p.stat().st_size for p in data.glob("*.diskqueue.*.dat")
                 if not p.name.endswith(".meta.dat")}
        assert set(files) == {"t"} and files["t"] >= (COUNT - 50) * 26
        # a channel created now, and one emptied now, get only what is published from now on
        assert (await request(d.addresses.http, "POST", "/channel/create?topic=t&channel=late")).status == 200
        assert (await request(d.addresses.http, "POST", "/channel/empty?topic=t&channel=c3")).status == 200
        await publish_batch(d, "t", *second, per_mpub=100)
        topic, channels = await _channel_stats(d)
        assert (channels["late"]["depth"], channels["c3"]["depth"], channels["c4"]["depth"]) == (
            COUNT, COUNT, 2 * COUNT)
    async with start_daemon(*flags) as d:
        topic, channels = await _channel_stats(d)
        assert (topic["depth"], channels["late"]["depth"], channels["c3"]["depth"], channels["c4"]["depth"]) == (
            0, COUNT, COUNT, 2 * COUNT)
        got = await _drain_all(d, CHANNELS + ["late"])
    for name, counts in got.items():
        expected = second if name in ("late", "c3") else first + second
        assert counts == collections.Counter(expected), name
