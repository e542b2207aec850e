"""Inspection: peeking at a channel's ready, deferred, in-flight and buried messages changes nothing.

The endpoint's shapes and errors are covered in ``test_http_inspect.py``; these
tests check the promise behind it in both modes: after any number of peeks the
channel delivers exactly what it would have delivered without them (same
order, same attempts, same due times), including ready messages that are still
unread records on disk.
"""

from __future__ import annotations

import pytest

from broker.protocol import encode_dpub, encode_fin, encode_mpub, encode_rdy, encode_req
from tests.support.http_client import request
from tests.support.v2client import connect, subscriber
from tests.support.waiting import wait_for

MODES = pytest.mark.parametrize("flags", [(), ("--durable",)], ids=["default", "durable"])


async def peek(d, state: str, n: int = 100) -> dict:
    reply = await request(d.addresses.http, "GET", f"/channel/peek?topic=t&channel=c&state={state}&n={n}")
    assert reply.status == 200, reply
    return reply.json()


def summary(channel) -> tuple:
    return (channel.depth, len(channel.in_flight), len(channel.deferred), len(channel.buried),
            channel.backend.depth if channel.backend is not None else 0)


@MODES
async def test_peeking_every_state_changes_nothing(start_daemon, flags):
    async with start_daemon("--max-attempts=1", *flags) as d:
        consumer = await subscriber(d)
        producer = await connect(d.addresses.tcp)
        channel = d.broker.topics["t"].channels["c"]
        # buried: delivered once, requeued, buried instead of a second delivery
        await producer.send(encode_mpub("t", [b"poison"]))
        await producer.expect_response(b"OK")
        await consumer.send(encode_rdy(1))
        poison = await consumer.read_message()
        await consumer.send(encode_req(poison.id, 0))
        await wait_for(lambda: len(channel.buried) == 1)
        # in flight: held; deferred: later (REQ'd with a delay) and a DPUB; ready: r0..r4
        await producer.send(encode_mpub("t", [b"held", b"later"] + [b"r%d" % i for i in range(5)]))
        await producer.expect_response(b"OK")
        await producer.send(encode_dpub("t", 60000, b"deferred"))
        await producer.expect_response(b"OK")
        held = await consumer.read_message()
        await consumer.send(encode_rdy(2))
        later = await consumer.read_message()
        await consumer.send(encode_rdy(1))
        await consumer.send(encode_req(later.id, 30000))
        assert (held.body, later.body) == (b"held", b"later")
        await wait_for(lambda: summary(channel)[:4] == (5, 1, 2, 1))
        before = summary(channel)

        states = ("ready", "deferred", "in_flight", "buried")
        first = {state: await peek(d, state) for state in states}
        second = {state: await peek(d, state) for state in states}
        assert first == second
        assert summary(channel) == before
        assert [m["body"] for m in first["ready"]["messages"]] == ["r0", "r1", "r2", "r3", "r4"]
        assert [(m["body"], m["attempts"]) for m in first["in_flight"]["messages"]] == [("held", 1)]
        assert [m["body"] for m in first["deferred"]["messages"]] == ["later", "deferred"]
        assert [(m["body"], m["attempts"]) for m in first["buried"]["messages"]] == [("poison", 1)]

        # the channel goes on exactly as if nobody had looked
        await consumer.send(encode_fin(held.id))
        await consumer.send(encode_rdy(10))
        rest = [await consumer.read_message() for _ in range(5)]
        assert [(m.body, m.attempts) for m in rest] == [(b"r%d" % i, 1) for i in range(5)]
        await consumer.expect_quiet()
        assert (channel.depth, len(channel.in_flight)) == (0, 5)


@MODES
async def test_peek_ready_reads_unread_disk_records_without_consuming_them(start_daemon, flags):
    async with start_daemon("--mem-queue-size=0", *flags) as d:
        consumer = await subscriber(d)
        producer = await connect(d.addresses.tcp)
        bodies = [b"m%02d" % i for i in range(30)]
        await producer.send(encode_mpub("t", bodies))
        await producer.expect_response(b"OK")
        channel = d.broker.topics["t"].channels["c"]
        await wait_for(lambda: channel.depth == 30)
        doc = await peek(d, "ready", 12)
        assert doc["count"] == 30
        assert [m["body"] for m in doc["messages"]] == [b.decode() for b in bodies[:12]]
        assert all(m["attempts"] == 0 and m["due"] == 0 for m in doc["messages"])
        assert channel.depth == 30
        await consumer.send(encode_rdy(30))
        got = await consumer.read_messages(30)
        assert [(m.body, m.attempts) for m in got] == [(b, 1) for b in bodies]
