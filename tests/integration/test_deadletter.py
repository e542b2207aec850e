"""Dead letters: a channel's maximum attempts, its buried set, kick and delete, across restarts.

The HTTP endpoints themselves (shapes, errors) are covered in ``test_http_inspect.py``;
these tests follow messages through the broker: buried after the limit with a
raw client (pynsq's Reader is in ``tests/system/interop/test_pynsq.py``), kept
across graceful restarts in both modes, and the per-channel setting kept in
``nsqd.dat``.
"""

from __future__ import annotations

import json

import pytest
import trio

from broker.protocol import encode_fin, encode_rdy, encode_req, encode_sub
from tests.support.http_client import request
from tests.support.v2client import connect, subscriber
from tests.support.v2client import publish_batch as publish
from tests.support.waiting import wait_for

MODES = pytest.mark.parametrize("flags", [(), ("--durable",)], ids=["default", "durable"])


async def call(daemon, method, target):
    return await request(daemon.addresses.http, method, target)


async def buried(daemon, topic="t", channel="c") -> list[dict]:
    reply = await call(daemon, "GET", f"/channel/peek?topic={topic}&channel={channel}&state=buried&n=1000")
    assert reply.status == 200, reply
    return reply.json()["messages"]


async def requeue_until_buried(daemon, consumer, topic="t", channel="c") -> dict[bytes, list[int]]:
    """REQ every delivery at once until the channel holds nothing but buried messages.

    Starts once the topic has handed everything published to its channels. Returns the
    attempts each body was delivered with.
    """
    t = daemon.broker.topics[topic]
    ch = t.channels[channel]
    await wait_for(lambda: t.depth == 0)
    seen: dict[bytes, list[int]] = {}
    with trio.fail_after(20):
        while True:
            arrived = await consumer.sync()
            for msg in arrived:
                seen.setdefault(msg.body, []).append(msg.attempts)
                await consumer.send(encode_req(msg.id, 0))
            if not arrived and not ch.in_flight and ch.depth == 0 and not ch.deferred:
                return seen


@MODES
async def test_message_is_buried_instead_of_a_delivery_past_max_attempts(start_daemon, flags):
    async with start_daemon("--max-attempts=3", *flags) as d:
        consumer = await subscriber(d, rdy=10)
        await publish(d, "t", b"poison", b"other")
        seen = await requeue_until_buried(d, consumer)
        channel = d.broker.topics["t"].channels["c"]
        assert seen == {b"poison": [1, 2, 3], b"other": [1, 2, 3]}
        assert len(channel.buried) == 2 and channel.depth == 0 and not channel.in_flight
        docs = await buried(d)
        assert sorted((m["body"], m["attempts"]) for m in docs) == [("other", 3), ("poison", 3)]


async def test_without_max_attempts_nothing_is_buried(daemon):
    consumer = await subscriber(daemon, rdy=1)
    await publish(daemon, "t", b"again")
    for attempt in range(1, 8):
        msg = await consumer.read_message()
        assert msg.attempts == attempt
        await consumer.send(encode_req(msg.id, 0))
    assert len(daemon.broker.topics["t"].channels["c"].buried) == 0


async def test_timeouts_count_towards_max_attempts(start_daemon):
    async with start_daemon("--max-attempts=2") as d:
        consumer = await connect(d.addresses.tcp)
        await consumer.identify(msg_timeout=1000)
        await consumer.send(encode_sub("t", "c"))
        await consumer.expect_response(b"OK")
        await consumer.send(encode_rdy(1))
        await publish(d, "t", b"slow")
        assert (await consumer.read_message()).attempts == 1
        with trio.fail_after(3):
            assert (await consumer.read_message()).attempts == 2
        channel = d.broker.topics["t"].channels["c"]
        await wait_for(lambda: len(channel.buried) == 1, timeout=3)


@MODES
async def test_buried_messages_survive_a_graceful_restart_and_can_be_kicked(start_daemon, flags):
    async with start_daemon("--max-attempts=1", *flags) as d:
        consumer = await subscriber(d, rdy=10)
        await publish(d, "t", b"a", b"b", b"c")
        await requeue_until_buried(d, consumer)
        assert len(d.broker.topics["t"].channels["c"].buried) == 3
    async with start_daemon("--max-attempts=1", *flags) as d:
        docs = await buried(d)
        assert sorted(m["body"] for m in docs) == ["a", "b", "c"]
        reply = await call(d, "POST", f"/channel/kick?topic=t&channel=c&id={docs[0]['id']}")
        assert reply.json() == {"kicked": 1}
        reply = await call(d, "POST", "/channel/delete_buried?topic=t&channel=c&n=1")
        assert reply.json() == {"deleted": 1}
        consumer = await subscriber(d, rdy=10)
        msg = await consumer.read_message()
        assert (msg.body.decode(), msg.attempts) == (docs[0]["body"], 1)  # a fresh series of attempts
        await consumer.send(encode_fin(msg.id))
        await consumer.expect_quiet()
        channel = d.broker.topics["t"].channels["c"]
        assert (channel.depth, len(channel.in_flight), len(channel.buried)) == (0, 0, 1)
    async with start_daemon("--max-attempts=1", *flags) as d:
        # the kick and the delete were kept: one buried message is left
        assert [m["body"] for m in await buried(d)] == [docs[2]["body"]]


async def test_channel_max_attempts_is_kept_in_the_metadata(start_daemon, tmp_path):
    async with start_daemon() as d:
        await subscriber(d)
        reply = await call(d, "POST", "/channel/max_attempts?topic=t&channel=c&value=2")
        assert reply.status == 200
        await d.broker.persist_metadata()
        doc = json.loads((tmp_path / "data" / "nsqd.dat").read_bytes())
        assert doc["topics"][0]["channels"] == [{"max_attempts": 2, "name": "c", "paused": False}]
    async with start_daemon() as d:
        channel = d.broker.topics["t"].channels["c"]
        assert channel.max_attempts == 2
        consumer = await subscriber(d, rdy=1)
        await publish(d, "t", b"twice")
        assert await requeue_until_buried(d, consumer) == {b"twice": [1, 2]}
        assert len(channel.buried) == 1
        # back to the flag's value (0: never); the setting leaves the metadata
        await call(d, "POST", "/channel/max_attempts?topic=t&channel=c&value=default")
        await d.broker.persist_metadata()
        doc = json.loads((tmp_path / "data" / "nsqd.dat").read_bytes())
        assert doc["topics"][0]["channels"] == [{"name": "c", "paused": False}]


async def test_many_buried_and_kicked_messages_keep_the_store_small(start_daemon, tmp_path):
    async with start_daemon("--max-attempts=1", "--durable") as d:
        consumer = await subscriber(d, rdy=2500)
        for round_number in range(3):
            await publish(d, "t", *[b"r%d-%d" % (round_number, i) for i in range(2500)])
            await requeue_until_buried(d, consumer)
            channel = d.broker.topics["t"].channels["c"]
            assert len(channel.buried) == 2500
            reply = await call(d, "POST", "/channel/delete_buried?topic=t&channel=c")
            assert reply.json() == {"deleted": 2500}
    async with start_daemon("--max-attempts=1", "--durable") as d:
        assert await buried(d) == []
        assert d.broker.topics["t"].channels["c"].depth == 0


async def test_buried_counts_appear_in_stats_and_metrics(start_daemon):
    async with start_daemon("--max-attempts=1") as d:
        consumer = await subscriber(d, rdy=10)
        await subscriber(d, channel="other")
        await publish(d, "t", b"x", b"y")
        await requeue_until_buried(d, consumer)
        doc = (await call(d, "GET", "/stats?format=json&topic=t")).json()
        channels = {c["channel_name"]: c for c in doc["topics"][0]["channels"]}
        assert (channels["c"]["buried_count"], channels["c"]["max_attempts"]) == (2, 1)
        assert (channels["other"]["buried_count"], channels["other"]["max_attempts"]) == (0, 1)
        lines = (await call(d, "GET", "/stats?topic=t")).body.decode().split("\n")
        assert [line.partition("e2e%: ")[2] for line in lines if "[c " in line or "[other " in line] == [
            " buried: 2 max-attempts: 1", " buried: 0 max-attempts: 1"]
        text = (await call(d, "GET", "/metrics")).body.decode()
        assert 'nsq_topic_channel_buried_count{channel="c",topic="t"} 2.0' in text
        assert 'nsq_topic_channel_buried_count{channel="other",topic="t"} 0.0' in text
