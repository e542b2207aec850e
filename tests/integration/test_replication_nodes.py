"""Replication between nodes in one process, found through a real nsqlookupd: copies held by
the peer and dropped once finished, publishes refused when too few nodes can take a copy
(the connection stays open), a takeover after a node stops, and a node that comes back
skipping what was taken over. With ``--replicas`` 1 nothing of it shows."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack

import msgpack
import pytest
import trio

from broker.protocol import FRAME_TYPE_ERROR, encode_nop, encode_pub, encode_rdy, encode_sub
from broker.protocol.replica import encode_repl
from tests.conftest import running_daemon
from tests.support.http_client import request
from tests.support.nsq_programs import nsq_bin_missing
from tests.support.replica_nodes import (
    copies_held,
    holder_of,
    linked,
    node_flags,
    node_replication,
    topic_replication,
    topic_stats,
)
from tests.support.v2client import connect, consume, publish
from tests.support.waiting import wait_until

pytestmark = pytest.mark.skipif(nsq_bin_missing() is not None, reason=nsq_bin_missing() or "")


async def test_the_peer_holds_a_copy_of_each_message_until_every_channel_finished_it(tmp_path, lookupd):
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(running_daemon(tmp_path / "a", *node_flags(lookupd, "--replicas=2")))
        b = await stack.enter_async_context(running_daemon(tmp_path / "b", *node_flags(lookupd, "--replicas=2")))
        await wait_until(lambda: linked(a, b))
        client = await connect(a.addresses.tcp)
        await client.send(encode_sub("t", "c"))  # the channel exists before the messages
        await client.expect_response(b"OK")
        await publish(a, "t", *[b"m%d" % i for i in range(10)])

        await wait_until(lambda: copies_held(b, "t", 10))
        assert (await topic_replication(a, "t")) == {"replicas": 2, "copies_held": 0, "copies_waiting": 0,
                                                "takeovers": 0, "publishes_refused": 0, "copies_missing": 0}
        await client.send(encode_rdy(10))
        for _ in range(10):
            msg = await client.read_message()
            await client.send(b"FIN %s\n" % msg.id)
        await wait_until(lambda: copies_held(b, "t", 0))
        metrics = (await request(a.addresses.http, "GET", "/metrics")).text
        assert 'nsq_topic_replicas{topic="t"} 2.0' in metrics
        assert 'nsq_topic_copies_held{topic="t"} 0.0' in metrics
        assert 'nsq_topic_copies_missing{topic="t"} 0.0' in metrics
        assert "nsq_replication_copies_missing 0.0" in metrics and "nsq_replication_copies_restored 0.0" in metrics


async def test_a_publish_too_few_nodes_can_hold_is_refused_and_the_connection_stays(tmp_path, lookupd):
    async with running_daemon(tmp_path / "a", *node_flags(lookupd, "--replicas=2")) as a:
        client = await connect(a.addresses.tcp)
        for _ in range(2):
            await client.send(encode_pub("t", b"never"))
            frame = await client.read_frame()
            assert frame.frame_type == FRAME_TYPE_ERROR
            assert frame.data == b"E_PUB_FAILED PUB failed only 1 of 2 copies: 0 of 0 peers connected"
        await client.send(encode_nop() + encode_sub("t", "c") + encode_rdy(10))
        await client.expect_response(b"OK")
        reply = await request(a.addresses.http, "POST", "/pub?topic=t", b"never")
        assert reply.status == 503
        assert json.loads(reply.body) == {"message": "PUB_FAILED only 1 of 2 copies: 0 of 0 peers connected"}
        stats = await topic_stats(a, "t")
        assert stats["replication"]["publishes_refused"] == 3
        assert stats["message_count"] == 0 and stats["channels"][0]["depth"] == 0
        await client.expect_quiet()


async def test_a_stopped_node_is_taken_over_and_skips_what_was_taken_when_it_returns(tmp_path, lookupd):
    """Three nodes: a publishes, its copies go to b or c; a stops; the holder, with the third node
    a majority that does not reach a, takes a's messages over; a comes back and skips them."""
    bodies = [b"m%d" % i for i in range(20)]
    flags = node_flags(lookupd, "--replicas=2", "--durable")
    async with AsyncExitStack() as stack:
        b = await stack.enter_async_context(running_daemon(tmp_path / "b", *flags))
        c = await stack.enter_async_context(running_daemon(tmp_path / "c", *flags))
        async with running_daemon(tmp_path / "a", *flags) as a:
            await wait_until(lambda: linked(a, b, c))
            client = await connect(a.addresses.tcp)
            await client.send(encode_sub("t", "c"))
            await client.expect_response(b"OK")
            await client.aclose()
            await publish(a, "t", *bodies)
            holder = await holder_of([b, c], "t", 20)
        # a stopped; after --replica-timeout the holder queues a's messages in its own channel c
        await wait_until(lambda: _taken_over(holder, "t", 20))
        with trio.fail_after(15):
            assert sorted(await consume(holder.addresses.tcp, "t", "c", 20)) == sorted(bodies)

        async with running_daemon(tmp_path / "a", *flags) as a:
            # a kept its 20 messages on disk; the holder took them over, so a's consumer gets none
            stats = await topic_stats(a, "t")
            assert stats["channels"][0]["depth"] == 20
            client = await connect(a.addresses.tcp)
            await client.send(encode_sub("t", "c") + encode_rdy(100))
            await client.expect_response(b"OK")
            await wait_until(lambda: _channel_empty(a, "t", "c"))
            await client.expect_quiet()
            # a learnt of the takeover: the holder need not remember it for a any more
            await wait_until(lambda: _remembered(holder, 0))


async def test_copies_a_stopped_holder_held_are_counted_missing_until_another_node_takes_them(tmp_path, lookupd):
    """Two nodes: a's copies are on b; b stops: once gone, /stats and /metrics count a's copies
    missing, while no other node can take them; c starts: a makes them again there."""
    bodies = [b"m%d" % i for i in range(20)]
    flags = node_flags(lookupd, "--replicas=2")
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(running_daemon(tmp_path / "a", *flags))
        async with running_daemon(tmp_path / "b", *flags) as b:
            await wait_until(lambda: linked(a, b))
            client = await connect(a.addresses.tcp)
            await client.send(encode_sub("t", "c"))
            await client.expect_response(b"OK")
            await client.aclose()
            await publish(a, "t", *bodies)
            await wait_until(lambda: copies_held(b, "t", 20))
        await wait_until(lambda: _missing(a, "t", 20))
        metrics = (await request(a.addresses.http, "GET", "/metrics")).text
        assert 'nsq_topic_copies_missing{topic="t"} 20.0' in metrics and "nsq_replication_copies_missing 20.0" in metrics
        c = await stack.enter_async_context(running_daemon(tmp_path / "c", *flags))
        await wait_until(lambda: _missing(a, "t", 0))
        assert await copies_held(c, "t", 20)
        node = await node_replication(a)
        assert (node["copies_missing"], node["copies_restored"]) == (0, 20)


async def _missing(node, topic: str, count: int) -> bool:
    """``node`` counts ``count`` copies of ``topic`` missing, for the topic and in all."""
    return ((await topic_replication(node, topic)).get("copies_missing") == count
            and (await node_replication(node)).get("copies_missing") == count)


async def _remembered(node, count: int) -> bool:
    return (await node_replication(node))["takeovers_remembered"] == count


async def _taken_over(node, topic: str, count: int) -> bool:
    return (await topic_replication(node, topic)).get("takeovers") == count


async def _channel_empty(node, topic: str, channel: str) -> bool:
    stats = await topic_stats(node, topic)
    found = [c for c in stats["channels"] if c["channel_name"] == channel]
    return bool(found) and found[0]["depth"] == 0 and found[0]["in_flight_count"] == 0


async def test_with_one_replica_the_role_is_not_offered_and_nothing_shows(tmp_path, lookupd):
    async with running_daemon(tmp_path / "a", *node_flags(lookupd)) as a:
        client = await connect(a.addresses.tcp)
        answer = await client.identify(feature_negotiation=True, replica="0" * 32)
        assert "replica" not in answer
        await client.send(encode_repl(b"\x92\x01\x90"))
        await client.expect_error(b"E_INVALID invalid command REPL")
        await publish(a, "t", b"x")
        assert "replication" not in await topic_stats(a, "t")
        metrics = (await request(a.addresses.http, "GET", "/metrics")).text
        assert "nsq_topic_replicas" not in metrics and "nsq_topic_copies_held" not in metrics


async def test_garbage_from_a_peer_connection_is_answered_with_an_error_and_changes_nothing(tmp_path, lookupd):
    async with running_daemon(tmp_path / "a", *node_flags(lookupd, "--replicas=2")) as a:
        client = await connect(a.addresses.tcp)
        answer = await client.identify_as_node("f" * 32)
        assert answer["replica"] != "f" * 32 and len(answer["replica"]) == 32
        bodies = [b"\xc1", b"not msgpack at all", b"\x92\x01\x91\x93\x02\xa1t\x90",  # an ADD cut short
                  b"\x92\x05\x91\x92\x63\x01", b"\x93\x01\x02\x03"]
        for body in bodies:
            await client.send(encode_repl(body))
        answers = []
        for _ in bodies:
            frame = await client.read_frame()
            answers.append(msgpack.unpackb(frame.data))
        assert all(error for _seq, error, _extra in answers), answers
        # the node still serves, holds nothing, and a publish still needs its copy
        assert (await node_replication(a))["copies_held"] == 0
        await client.send(encode_pub("t", b"x"))
        frame = await client.read_frame()
        assert frame.frame_type == FRAME_TYPE_ERROR and frame.data.startswith(b"E_PUB_FAILED")
