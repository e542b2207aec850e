"""pynsq 0.9.1 (``nsq.Writer`` / ``nsq.Reader`` on Tornado) works against the broker unchanged."""

from __future__ import annotations

import trio

from .harness import (
    HEX16,
    PYNSQ,
    assert_no_errors,
    consume_config,
    of_kind,
    publish_with,
    run_client,
    start_client,
    text,
)

BINARY = text(bytes(range(256)) + b"\n\r\x00end")


async def publish(broker, logs, *ops) -> list[dict]:
    return await publish_with(PYNSQ, broker, logs, *ops)


async def test_writer_pub_mpub_dpub_then_reader_receives_every_body(broker, logs):
    with trio.fail_after(30):
        await publish(
            broker,
            logs,
            {"op": "pub", "topic": "orders", "body": "one"},
            {"op": "mpub", "topic": "orders", "bodies": ["two", "three", BINARY]},
            {"op": "dpub", "topic": "orders", "defer_ms": 300, "body": "later"},
        )
        events = await run_client(
            PYNSQ, "consume", consume_config(broker, "orders", max_in_flight=10, expect=5), log_dir=logs
        )
    assert_no_errors(events)
    messages = of_kind(events, "message")
    assert sorted(m["body"] for m in messages) == sorted(["one", "two", "three", BINARY, "later"])
    assert all(m["attempts"] == 1 for m in messages)
    assert all(HEX16.match(m["id"]) for m in messages)
    assert len({m["id"] for m in messages}) == 5
    # The deferred message is delivered no earlier than its delay after it was published.
    later = next(m for m in messages if m["body"] == "later")
    assert later["received_ns"] - later["timestamp"] >= 300_000_000 - 5_000_000


async def test_reader_with_max_in_flight_holds_many_messages_at_once(broker, logs):
    bodies = [f"m{i:03d}" for i in range(200)]
    with trio.fail_after(30):
        await publish(broker, logs, {"op": "mpub", "topic": "bulk", "bodies": bodies})
        events = await run_client(
            PYNSQ,
            "consume",
            consume_config(broker, "bulk", max_in_flight=25, batch=True, expect=200),
            log_dir=logs,
        )
    assert_no_errors(events)
    messages = of_kind(events, "message")
    assert sorted(m["body"] for m in messages) == bodies
    assert len({m["id"] for m in messages}) == 200
    # The handler answers only in batches, so a batch's size is how many messages the broker
    # had in flight to this reader at once: more than one, never more than max_in_flight.
    sizes = [b["size"] for b in of_kind(events, "batch")]
    assert sum(sizes) == 200
    assert max(sizes) > 1
    assert max(sizes) <= 25


async def test_returning_false_requeues_and_redelivers_with_attempts_plus_one(broker, logs):
    bodies = ["a", "b", "c", "d"]
    with trio.fail_after(30):
        await publish(broker, logs, {"op": "mpub", "topic": "retry", "bodies": bodies})
        events = await run_client(
            PYNSQ,
            "consume",
            consume_config(broker, "retry", max_in_flight=4, requeue_below=2, expect=4, linger=0.3),
            log_dir=logs,
        )
    assert_no_errors(events)
    messages = of_kind(events, "message")
    assert sorted((m["body"], m["attempts"]) for m in messages) == sorted(
        [(b, 1) for b in bodies] + [(b, 2) for b in bodies]
    )
    for body in bodies:
        first, second = [m for m in messages if m["body"] == body]
        assert (first["action"], second["action"]) == ("req", "fin")
        assert first["id"] == second["id"]
        assert first["timestamp"] == second["timestamp"]


async def test_message_requeue_with_delay_is_redelivered_after_the_delay(broker, logs):
    with trio.fail_after(30):
        await publish(broker, logs, {"op": "pub", "topic": "later", "body": "x"})
        events = await run_client(
            PYNSQ,
            "consume",
            consume_config(
                broker, "later", requeue_below=2, requeue_with="method", requeue_delay_ms=1000, expect=1
            ),
            log_dir=logs,
        )
    assert_no_errors(events)
    first, second = of_kind(events, "message")
    assert (first["attempts"], second["attempts"]) == (1, 2)
    assert first["id"] == second["id"]
    assert second["received_ns"] - first["received_ns"] >= 1_000_000_000


async def test_unanswered_message_times_out_and_is_redelivered(broker_process, logs):
    broker = broker_process("--msg-timeout=1s")
    with trio.fail_after(30):
        await publish(broker, logs, {"op": "pub", "topic": "slow", "body": "stuck"})
        events = await run_client(
            PYNSQ, "consume", consume_config(broker, "slow", hold_below=2, expect=1), log_dir=logs
        )
    assert_no_errors(events)
    first, second = of_kind(events, "message")
    assert (first["action"], second["action"]) == ("hold", "fin")
    assert (first["attempts"], second["attempts"]) == (1, 2)
    assert first["id"] == second["id"] and first["body"] == second["body"] == "stuck"
    waited = (second["received_ns"] - first["received_ns"]) / 1e9
    assert 1.0 <= waited < 5.0


async def test_touch_keeps_a_slow_message_in_flight_past_the_timeout(broker_process, logs):
    broker = broker_process("--msg-timeout=1s")
    with trio.fail_after(30):
        await publish(broker, logs, {"op": "pub", "topic": "long", "body": "work"})
        events = await run_client(
            PYNSQ,
            "consume",
            consume_config(broker, "long", finish_after_ms=2200, touch_every_ms=300, expect=1, linger=0.5),
            log_dir=logs,
        )
    assert_no_errors(events)
    # Held for more than twice the message timeout, the message is delivered only once: every
    # TOUCH pushed its deadline back.
    (only,) = of_kind(events, "message")
    assert only["attempts"] == 1
    assert len(of_kind(events, "touch")) >= 5


async def test_two_readers_on_one_channel_share_the_messages(broker, logs):
    bodies = [f"job{i:03d}" for i in range(60)]
    with trio.fail_after(30):
        await publish(broker, logs, {"op": "mpub", "topic": "jobs", "bodies": bodies})
        # Each reader keeps its message in flight for a moment, so the other one is offered the next.
        events = await run_client(
            PYNSQ,
            "consume",
            consume_config(broker, "jobs", channels=["workers", "workers"], finish_after_ms=10, expect=60),
            log_dir=logs,
        )
    assert_no_errors(events)
    messages = of_kind(events, "message")
    assert sorted(m["body"] for m in messages) == bodies
    per_reader = [[m for m in messages if m["reader"] == r] for r in (0, 1)]
    assert all(per_reader), "both readers receive part of the channel's messages"


async def test_two_channels_each_receive_every_message(broker, logs):
    bodies = [f"event{i}" for i in range(20)]
    with trio.fail_after(30):
        config = consume_config(broker, "events", channels=["audit", "billing"], expect=40)
        async with start_client(PYNSQ, "consume", config, log_dir=logs) as consumer:
            await consumer.wait_for("subscribed", 2)
            await publish(
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


async def test_max_tries_gives_up_and_the_message_is_gone(broker, logs):
    with trio.fail_after(30):
        await publish(broker, logs, {"op": "mpub", "topic": "poison", "bodies": ["p1", "p2"]})
        events = await run_client(
            PYNSQ,
            "consume",
            consume_config(broker, "poison", max_tries=2, requeue_below=1000, expect=2, linger=0.5),
            log_dir=logs,
        )
    assert_no_errors(events)
    messages = of_kind(events, "message")
    # Attempts 1 and 2 reach the handler and are requeued; attempt 3 exceeds max_tries, so pynsq
    # gives up and finishes it, and the broker never delivers it again.
    assert sorted((m["body"], m["attempts"]) for m in messages) == [("p1", 1), ("p1", 2), ("p2", 1), ("p2", 2)]
    giving_up = of_kind(events, "giving_up")
    assert sorted(g["attempts"] for g in giving_up) == [3, 3]
    assert {g["id"] for g in giving_up} == {m["id"] for m in messages}
