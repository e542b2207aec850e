"""Real NSQ client libraries work against the broker unchanged: the scenarios they share.

Each scenario runs once per client library that can express it: pynsq 0.9.1 (``nsq.Writer`` /
``nsq.Reader`` on Tornado), gnsq 1.0.2 (``gnsq.Producer`` / ``gnsq.Consumer`` on gevent, only
inside its client process), ansq 0.3.0 (``create_writer`` / ``create_reader`` on asyncio) and
nsqjs 0.13.0 (Node ``nsq.Writer`` / ``nsq.Reader``; needs node and
``npm ci --prefix tests/system/interop/js``, the version pinned by package-lock.json).
What only one library does is tested in that library's own module.
"""

from __future__ import annotations

import trio

from tests.support.interop import (
    HEX16,
    Library,
    assert_no_errors,
    consume_config,
    libraries,
    of_kind,
    publish_with,
    run_client,
    start_client,
    text,
)

BINARY = text(bytes(range(256)) + b"\n\r\x00end")


def by_body(messages: list[dict], body: str) -> list[dict]:
    """The deliveries of one body, in the order the client saw them."""
    return [m for m in messages if m["body"] == body]


@libraries()
async def test_pub_mpub_dpub_then_reader_receives_every_body(library: Library, broker, logs):
    numbered = [f"n{i:02d}" for i in range(30)]
    expected = ["one", "two", "three", BINARY, *numbered, "later"]
    with trio.fail_after(30):
        await publish_with(
            library.argv,
            broker,
            logs,
            {"op": "pub", "topic": "orders", "body": "one"},
            {"op": "mpub", "topic": "orders", "bodies": ["two", "three", BINARY, *numbered]},
            {"op": "dpub", "topic": "orders", "defer_ms": 300, "body": "later"},
        )
        config = consume_config(broker, "orders", max_in_flight=10, expect=len(expected), linger=0.3)
        events = await run_client(library.argv, "consume", config, log_dir=logs)
    assert_no_errors(events)
    messages = of_kind(events, "message")
    assert sorted(m["body"] for m in messages) == sorted(expected)
    assert all(m["attempts"] == 1 for m in messages)
    assert all(HEX16.match(m["id"]) for m in messages)
    assert len({m["id"] for m in messages}) == len(expected)
    # The deferred message is delivered no earlier than its delay after it was published.
    (later,) = by_body(messages, "later")
    assert later["received_ns"] - later["timestamp"] >= 300_000_000 - 5_000_000


@libraries()
async def test_requeue_redelivers_with_attempts_plus_one(library: Library, broker, logs):
    bodies = ["a", "b", "c", "d"]
    with trio.fail_after(30):
        config = consume_config(broker, "retry", max_in_flight=4, requeue_below=3, expect=4, linger=0.3)
        async with start_client(library.argv, "consume", config, log_dir=logs) as consumer:
            await consumer.wait_for("subscribed")
            await publish_with(library.argv, broker, logs, {"op": "mpub", "topic": "retry", "bodies": bodies})
            events = await consumer.result()
    assert_no_errors(events)
    messages = of_kind(events, "message")
    assert len(messages) == 3 * len(bodies)
    for body in bodies:
        deliveries = by_body(messages, body)
        assert [(m["attempts"], m["action"]) for m in deliveries] == [(1, "req"), (2, "req"), (3, "fin")]
        # A requeued message keeps its ID and its timestamp.
        assert len({m["id"] for m in deliveries}) == 1
        assert len({m["timestamp"] for m in deliveries}) == 1


@libraries("pynsq", "gnsq")
async def test_requeue_with_delay_is_redelivered_after_the_delay(library: Library, broker, logs):
    with trio.fail_after(30):
        await publish_with(library.argv, broker, logs, {"op": "pub", "topic": "later", "body": "x"})
        config = consume_config(
            broker, "later", requeue_below=2, requeue_with="method", requeue_delay_ms=1000, expect=1
        )
        events = await run_client(library.argv, "consume", config, log_dir=logs)
    assert_no_errors(events)
    first, second = of_kind(events, "message")
    assert (first["attempts"], second["attempts"]) == (1, 2)
    assert first["id"] == second["id"]
    assert second["received_ns"] - first["received_ns"] >= 1_000_000_000


@libraries("pynsq", "gnsq")
async def test_two_channels_each_receive_every_message(library: Library, broker, logs):
    bodies = [f"event{i}" for i in range(20)]
    with trio.fail_after(30):
        config = consume_config(broker, "events", channels=["audit", "billing"], max_in_flight=5, expect=40)
        async with start_client(library.argv, "consume", config, log_dir=logs) as consumer:
            await consumer.wait_for("subscribed", 2)
            await publish_with(
                library.argv,
                broker,
                logs,
                {"op": "mpub", "topic": "events", "bodies": bodies[:10]},
                *({"op": "pub", "topic": "events", "body": b} for b in bodies[10:]),
            )
            events = await consumer.result()
    assert_no_errors(events)
    messages = of_kind(events, "message")
    for channel in ("audit", "billing"):
        assert sorted(m["body"] for m in messages if m["channel"] == channel) == sorted(bodies)
    # A message has one ID, whichever channel delivers it.
    ids = {channel: {m["body"]: m["id"] for m in messages if m["channel"] == channel} for channel in ("audit", "billing")}
    assert ids["audit"] == ids["billing"]


@libraries("pynsq", "gnsq", "nsqjs")
async def test_max_attempts_gives_up_and_the_message_is_gone(library: Library, broker, logs):
    with trio.fail_after(30):
        await publish_with(library.argv, broker, logs, {"op": "mpub", "topic": "poison", "bodies": ["p1", "p2"]})
        config = consume_config(
            broker, "poison", requeue_below=1000, expect=2, linger=0.5, **{library.max_attempts_option: 2}
        )
        events = await run_client(library.argv, "consume", config, log_dir=logs)
    assert_no_errors(events)
    messages = of_kind(events, "message")
    # Attempts 1 and 2 reach the handler and are requeued; attempt 3 exceeds the limit, so the
    # library gives up and finishes it, and the broker never delivers it again.
    for body in ("p1", "p2"):
        assert [m["attempts"] for m in by_body(messages, body)] == [1, 2]
    giving_up = of_kind(events, "giving_up")
    assert sorted(g["attempts"] for g in giving_up) == [3, 3]
    assert {g["id"] for g in giving_up} == {m["id"] for m in messages}
