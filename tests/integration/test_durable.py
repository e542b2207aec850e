"""Durable mode (``--durable``) and deferred messages across restarts, on an in-process broker.

The crash side (SIGKILL of a real process) is in ``test_crash_durable.py``;
these tests cover group commit, the ack floor (what a graceful restart
re-delivers, what disk space is given back) and due times kept across a
graceful restart in both modes.
"""

from __future__ import annotations

import logging

import pytest
import trio

from broker.protocol import (
    encode_dpub,
    encode_fin,
    encode_mpub,
    encode_pub,
    encode_req,
)
from tests.support.draining import drain
from tests.support.v2client import connect, publish, subscriber
from tests.support.waiting import wait_for

MODES = pytest.mark.parametrize("flags", [(), ("--durable",)], ids=["default", "durable"])


def tcp(daemon):
    return daemon.addresses.tcp


async def drain_channel(client, channel) -> list:
    """Every message ``channel`` delivers to ``client``, each FIN'd, until it holds none."""
    with trio.fail_after(10):
        return await drain(client, lambda: not channel.in_flight and channel.depth == 0 and not channel.deferred)


# ---------------------------------------------------------------- group commit


async def test_concurrent_publishers_share_fsyncs(start_daemon):
    async with start_daemon("--durable") as d:
        async def publisher(i: int) -> None:
            client = await connect(tcp(d))
            for j in range(10):
                await client.send(encode_pub("t", b"%d-%d" % (i, j)))
                await client.expect_response(b"OK")
            await client.aclose()

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for i in range(16):
                    nursery.start_soon(publisher, i)
        topic = d.broker.topics["t"]
        assert topic.depth == 160
        # one sync served several publishers: far fewer syncs than acknowledged PUBs
        assert 0 < topic.fanout.group.syncs < 160 * 3 // 4, topic.fanout.group.syncs


async def test_durable_publish_reaches_the_file_before_ok(start_daemon, tmp_path):
    async with start_daemon("--durable") as d:
        client = await connect(tcp(d))
        await client.send(encode_mpub("t", [b"first-durable-body", b"second-durable-body"]))
        await client.expect_response(b"OK")
        data = b"".join(p.read_bytes() for p in (tmp_path / "data").glob("t.diskqueue.0*.dat"))
        assert b"first-durable-body" in data and b"second-durable-body" in data


async def test_durable_mode_delivers_to_every_channel(start_daemon):
    async with start_daemon("--durable") as d:
        one = await subscriber(d, channel="one", rdy=10)
        two = await subscriber(d, channel="two", rdy=10)
        eph = await subscriber(d, channel="e#ephemeral", rdy=10)
        await publish(d, "t", b"a", b"b", b"c")
        for client in (one, two, eph):
            assert sorted(m.body for m in await client.read_messages(3)) == [b"a", b"b", b"c"]


async def test_durable_topic_defers_for_an_ephemeral_channel_too(start_daemon):
    async with start_daemon("--durable") as d:
        eph = await subscriber(d, channel="e#ephemeral", rdy=10)
        producer = await connect(tcp(d))
        await producer.send(encode_dpub("t", 300, b"later"))
        await producer.expect_response(b"OK")
        await producer.send(encode_pub("t", b"now"))
        await producer.expect_response(b"OK")
        start = trio.current_time()
        (first,) = await eph.read_messages(1)
        assert first.body == b"now"
        (second,) = await eph.read_messages(1)
        assert second.body == b"later" and trio.current_time() - start > 0.2


async def test_durable_backlog_waits_for_the_first_channel(start_daemon):
    async with start_daemon("--durable") as d:
        await publish(d, "t", *[b"m%d" % i for i in range(50)])
        consumer = await subscriber(d, rdy=100)
        got = await consumer.read_messages(50)
        assert [m.body for m in got] == [b"m%d" % i for i in range(50)]


async def test_a_message_of_the_largest_size_takes_every_move_in_durable_mode(start_daemon, caplog):
    """Records carry prefixes (a due time, where they come from) on top of the largest body:
    DPUB, its copy into the channel, REQ with a delay and its release all write them."""
    body = b"x" * 1000
    async with start_daemon("--durable", "--max-msg-size=1000") as d:
        consumer = await subscriber(d, rdy=1)
        producer = await connect(tcp(d))
        await producer.send(encode_dpub("t", 50, body))
        await producer.expect_response(b"OK")
        with trio.fail_after(10):
            (msg,) = await consumer.read_messages(1)
            await consumer.send(encode_req(msg.id, 50))
            (msg,) = await consumer.read_messages(1)
            await consumer.send(encode_req(msg.id, 0))
            (msg,) = await consumer.read_messages(1)
        assert (msg.body, msg.attempts) == (body, 3)
        await consumer.send(encode_fin(msg.id))
        channel = d.broker.topics["t"].channels["c"]
        await wait_for(lambda: channel.backend.uncommitted == 0 and not channel.in_flight)
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# ---------------------------------------------------------------- the ack floor


async def test_durable_graceful_restart_delivers_each_live_message_once(start_daemon):
    bodies = [b"m%02d" % i for i in range(12)]
    async with start_daemon("--durable") as d:
        consumer = await subscriber(d, rdy=6)
        await publish(d, "t", *bodies)
        got = await consumer.read_messages(6)
        for msg in got[:3]:  # finished: never again
            await consumer.send(encode_fin(msg.id))
        await consumer.send(encode_req(got[3].id, 0))  # requeued: once more
        # got[4], got[5] stay in flight; the rest stay unread (or in flight, unread)
        await consumer.sync()
    async with start_daemon("--durable") as d:
        consumer = await subscriber(d, rdy=50)
        again = await drain_channel(consumer, d.broker.topics["t"].channels["c"])
    finished = {m.body for m in got[:3]}
    seen = [m.body for m in again]
    assert sorted(seen) == sorted(set(bodies) - finished), seen
    assert len(seen) == len(set(seen)), "a graceful restart must not duplicate"


async def test_durable_timeout_and_requeue_redeliver(start_daemon):
    async with start_daemon("--durable") as d:
        consumer = await subscriber(d, rdy=2, msg_timeout=1000)
        await publish(d, "t", b"times-out", b"requeued")
        first = {m.body: m for m in await consumer.read_messages(2)}
        await consumer.send(encode_req(first[b"requeued"].id, 0))
        with trio.fail_after(5):
            again = {m.body: m for m in await consumer.read_messages(2)}
        assert again[b"requeued"].attempts == 2
        assert again[b"times-out"].attempts == 2
        for msg in again.values():
            await consumer.send(encode_fin(msg.id))
        channel = d.broker.topics["t"].channels["c"]
        # every record read is finished: the ack floor reaches the end of the queue
        await wait_for(lambda: channel.backend.uncommitted == 0)
        await wait_for(lambda: d.broker.topics["t"].backend.uncommitted == 0)


async def test_durable_finished_segments_are_removed(start_daemon, tmp_path):
    async with start_daemon("--durable", "--max-bytes-per-file=4096") as d:
        consumer = await subscriber(d, rdy=500)
        producer = await connect(tcp(d))
        await producer.send(encode_mpub("t", [b"x" * 100 for _ in range(400)]))
        await producer.expect_response(b"OK")
        msgs = await consumer.read_messages(400)
        files = lambda: list((tmp_path / "data").glob("t:c.diskqueue.0*.dat"))  # noqa: E731
        assert len(files()) > 3
        for msg in msgs:
            await consumer.send(encode_fin(msg.id))
        # committed, then the next sync (the policy loop's) removes the segments below the floor
        await wait_for(lambda: len(files()) <= 1, timeout=10)


async def test_durable_channel_empty_drops_everything(start_daemon):
    async with start_daemon("--durable") as d:
        consumer = await subscriber(d, rdy=1)
        await publish(d, "t", b"a", b"b", b"c")
        await consumer.read_message()
        channel = d.broker.topics["t"].channels["c"]
        channel.empty()
        assert channel.depth == 0 and not channel.in_flight
    async with start_daemon("--durable") as d:
        consumer = await subscriber(d, rdy=10)
        await consumer.expect_quiet()
        channel = d.broker.topics["t"].channels["c"]
        assert (channel.depth, len(channel.in_flight), len(channel.deferred)) == (0, 0, 0)


# ---------------------------------------------------------------- due times across restarts


@MODES
async def test_dpub_keeps_its_due_time_across_a_graceful_restart(start_daemon, flags):
    async with start_daemon(*flags) as d:
        await subscriber(d)  # the channel exists, so the message is deferred in it
        producer = await connect(tcp(d))
        await producer.send(encode_dpub("t", 2000, b"later"))
        await producer.expect_response(b"OK")
        await wait_for(lambda: d.broker.topics["t"].channels["c"].deferred)
        published = trio.current_time()
    async with start_daemon(*flags) as d:
        consumer = await subscriber(d, rdy=1)
        msg = await consumer.read_message()
        assert msg.body == b"later"
        assert trio.current_time() - published >= 1.9


@MODES
async def test_req_delay_keeps_its_due_time_across_a_graceful_restart(start_daemon, flags):
    async with start_daemon(*flags) as d:
        consumer = await subscriber(d, rdy=1)
        await publish(d, "t", b"retry-me")
        msg = await consumer.read_message()
        await consumer.send(encode_req(msg.id, 2000))
        await wait_for(lambda: d.broker.topics["t"].channels["c"].deferred)
        requeued = trio.current_time()
    async with start_daemon(*flags) as d:
        consumer = await subscriber(d, rdy=1)
        msg = await consumer.read_message()
        assert (msg.body, msg.attempts) == (b"retry-me", 2)
        assert trio.current_time() - requeued >= 1.9


async def test_deferred_on_a_topic_without_channels_keeps_its_due_time(start_daemon):
    async with start_daemon("--durable") as d:
        producer = await connect(tcp(d))
        await producer.send(encode_dpub("t", 1500, b"waiting-at-topic"))
        await producer.expect_response(b"OK")
        published = trio.current_time()
    async with start_daemon("--durable") as d:
        consumer = await subscriber(d, rdy=1)
        msg = await consumer.read_message()
        assert msg.body == b"waiting-at-topic"
        assert trio.current_time() - published >= 1.2
