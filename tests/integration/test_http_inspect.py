"""pynsqd's own HTTP routes: peeking at a channel's messages and managing its dead letters.

Besides each route's answers and errors: peeking changes nothing, in both modes. After any
number of peeks the channel delivers exactly what it would have delivered without them
(same order, same attempts, same due times), ready messages that are still unread records
on disk included.
"""

from __future__ import annotations

import base64
import json

import pytest

from broker.protocol import encode_dpub, encode_fin, encode_mpub, encode_rdy, encode_req
from tests.support.http_client import request
from tests.support.v2client import connect, subscriber
from tests.support.waiting import wait_for

MODES = pytest.mark.parametrize("flags", [(), ("--durable",)], ids=["default", "durable"])


async def call(d, method, target, body=None):
    return await request(d.addresses.http, method, target, body)


async def peek(d, query: str) -> dict:
    reply = await call(d, "GET", "/channel/peek?" + query)
    assert reply.status == 200, reply
    assert reply.headers["content-type"] == "application/json; charset=utf-8"
    return reply.json()


async def test_peek_ready_and_deferred(daemon):
    await call(daemon, "POST", "/topic/create?topic=t")
    await call(daemon, "POST", "/channel/create?topic=t&channel=c")
    await call(daemon, "POST", "/mpub?topic=t&binary=true",
               b"\x00\x00\x00\x02" + b"\x00\x00\x00\x03one" + b"\x00\x00\x00\x02\xff\x00")
    await call(daemon, "POST", "/pub?topic=t&defer=60000", b"later")
    channel = daemon.broker.topics["t"].channels["c"]
    await wait_for(lambda: channel.depth == 2 and len(channel.deferred) == 1)

    doc = await peek(daemon, "topic=t&channel=c")
    assert (doc["topic"], doc["channel"], doc["state"], doc["count"]) == ("t", "c", "ready", 2)
    first, second = doc["messages"]
    assert set(first) == {"id", "timestamp", "attempts", "due", "body", "body_base64"}
    assert (first["body"], first["attempts"], first["due"]) == ("one", 0, 0)
    assert len(first["id"]) == 16 and first["timestamp"] > 0
    assert second["body"] is None and base64.b64decode(second["body_base64"]) == b"\xff\x00"
    assert [m["body"] for m in (await peek(daemon, "topic=t&channel=c&n=1"))["messages"]] == ["one"]
    assert channel.depth == 2  # peeking changes nothing

    doc = await peek(daemon, "topic=t&channel=c&state=deferred")
    assert doc["count"] == 1
    assert doc["messages"][0]["body"] == "later" and doc["messages"][0]["due"] > doc["messages"][0]["timestamp"]


async def test_peek_in_flight(daemon):
    await call(daemon, "POST", "/pub?topic=t", b"busy")
    consumer = await subscriber(daemon, rdy=1)
    msg = await consumer.read_message()
    doc = await peek(daemon, "topic=t&channel=c&state=in_flight")
    assert doc["count"] == 1
    assert doc["messages"][0]["id"] == msg.id.decode() and doc["messages"][0]["attempts"] == 1
    await consumer.send(encode_fin(msg.id))
    await consumer.aclose()


async def test_buried_messages_can_be_peeked_kicked_and_deleted(start_daemon):
    async with start_daemon("--max-attempts=1") as d:
        await call(d, "POST", "/topic/create?topic=t")
        await call(d, "POST", "/channel/create?topic=t&channel=c")
        await call(d, "POST", "/mpub?topic=t", b"a\nb\nc")
        channel = d.broker.topics["t"].channels["c"]
        consumer = await subscriber(d, rdy=10)
        for msg in await consumer.read_messages(3):
            await consumer.send(encode_req(msg.id, 0))
        await wait_for(lambda: len(channel.buried) == 3)

        doc = await peek(d, "topic=t&channel=c&state=buried")
        assert doc["count"] == 3
        assert sorted(m["body"] for m in doc["messages"]) == ["a", "b", "c"]
        assert all(m["attempts"] == 1 for m in doc["messages"])

        # kick one by id: it is delivered again, starting over at attempt 1
        target = doc["messages"][0]
        reply = await call(d, "POST", f"/channel/kick?topic=t&channel=c&id={target['id']}")
        assert (reply.status, reply.json()) == (200, {"kicked": 1})
        msg = await consumer.read_message()
        assert (msg.id.decode(), msg.body.decode(), msg.attempts) == (target["id"], target["body"], 1)
        await consumer.send(encode_fin(msg.id))

        reply = await call(d, "POST", f"/channel/kick?topic=t&channel=c&id={target['id']}")
        assert reply.json() == {"kicked": 0}
        reply = await call(d, "POST", "/channel/delete_buried?topic=t&channel=c&n=1")
        assert reply.json() == {"deleted": 1}
        reply = await call(d, "POST", "/channel/delete_buried?topic=t&channel=c")
        assert reply.json() == {"deleted": 1}
        assert len(channel.buried) == 0
        assert (await peek(d, "topic=t&channel=c&state=buried"))["messages"] == []
        await consumer.aclose()


async def test_max_attempts_per_channel(daemon):
    await call(daemon, "POST", "/topic/create?topic=t")
    await call(daemon, "POST", "/channel/create?topic=t&channel=c")
    reply = await call(daemon, "POST", "/channel/max_attempts?topic=t&channel=c&value=5")
    assert (reply.status, reply.body) == (200, b'{"max_attempts":5}')
    assert daemon.broker.topics["t"].channels["c"].max_attempts == 5
    reply = await call(daemon, "POST", "/channel/max_attempts?topic=t&channel=c&value=default")
    assert reply.json() == {"max_attempts": None}


@pytest.mark.parametrize(
    "method, target, status, message",
    [
        ("GET", "/channel/peek?topic=t&channel=c&state=gone", 400, "INVALID_STATE"),
        ("GET", "/channel/peek?topic=t&channel=c&n=-1", 400, "INVALID_N"),
        ("GET", "/channel/peek?topic=t&channel=c&n=1001", 400, "INVALID_N"),
        ("GET", "/channel/peek?topic=t&channel=nope", 404, "CHANNEL_NOT_FOUND"),
        ("GET", "/channel/peek?topic=nope&channel=c", 404, "TOPIC_NOT_FOUND"),
        ("GET", "/channel/peek?topic=t", 400, "MISSING_ARG_CHANNEL"),
        ("POST", "/channel/kick?topic=t&channel=c&id=xyz", 400, "INVALID_ID"),
        ("POST", "/channel/kick?topic=t&channel=c&n=x", 400, "INVALID_N"),
        ("POST", "/channel/delete_buried?topic=t&channel=nope", 404, "CHANNEL_NOT_FOUND"),
        ("POST", "/channel/max_attempts?topic=t&channel=c", 400, "MISSING_ARG_VALUE"),
        ("POST", "/channel/max_attempts?topic=t&channel=c&value=-3", 400, "INVALID_VALUE"),
        ("POST", "/channel/peek?topic=t&channel=c", 405, "METHOD_NOT_ALLOWED"),
    ],
)
async def test_errors(daemon, method, target, status, message):
    await call(daemon, "POST", "/topic/create?topic=t")
    await call(daemon, "POST", "/channel/create?topic=t&channel=c")
    reply = await call(daemon, method, target)
    assert (reply.status, json.loads(reply.body)) == (status, {"message": message})


# ---------------------------------------------------------------- peeking changes nothing


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
        first = {state: await peek(d, f"topic=t&channel=c&state={state}&n=100") for state in states}
        second = {state: await peek(d, f"topic=t&channel=c&state={state}&n=100") for state in states}
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
        doc = await peek(d, "topic=t&channel=c&state=ready&n=12")
        assert doc["count"] == 30
        assert [m["body"] for m in doc["messages"]] == [b.decode() for b in bodies[:12]]
        assert all(m["attempts"] == 0 and m["due"] == 0 for m in doc["messages"])
        assert channel.depth == 30
        await consumer.send(encode_rdy(30))
        got = await consumer.read_messages(30)
        assert [(m.body, m.attempts) for m in got] == [(b, 1) for b in bodies]
