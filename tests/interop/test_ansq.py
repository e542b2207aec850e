"""ansq 0.3.0 (``create_writer`` / ``create_reader`` on asyncio) works against the broker unchanged."""

from __future__ import annotations

import trio

from .harness import ANSQ, HEX16, assert_no_errors, consume_config, of_kind, publish_with, run_client, start_client


async def publish(broker, logs, *ops) -> list[dict]:
    return await publish_with(ANSQ, broker, logs, *ops)


async def test_writer_pub_mpub_dpub_then_reader_fin(broker, logs):
    with trio.fail_after(30):
        await publish(
            broker,
            logs,
            {"op": "pub", "topic": "mail", "body": "hello"},
            {"op": "mpub", "topic": "mail", "bodies": ["m1", "m2", "m3"]},
            {"op": "dpub", "topic": "mail", "defer_ms": 200, "body": "soon"},
        )
        events = await run_client(ANSQ, "consume", consume_config(broker, "mail", expect=5, linger=0.3), log_dir=logs)
    assert_no_errors(events)
    messages = of_kind(events, "message")
    assert sorted(m["body"] for m in messages) == ["hello", "m1", "m2", "m3", "soon"]
    assert all(m["attempts"] == 1 and HEX16.match(m["id"]) for m in messages)
    soon = next(m for m in messages if m["body"] == "soon")
    assert soon["received_ns"] - soon["timestamp"] >= 200_000_000 - 5_000_000


async def test_reader_req_redelivers_with_attempts_plus_one(broker, logs):
    with trio.fail_after(30):
        config = consume_config(broker, "tasks", requeue_below=3, expect=2, linger=0.3)
        async with start_client(ANSQ, "consume", config, log_dir=logs) as consumer:
            await consumer.wait_for("subscribed")
            await publish(broker, logs, {"op": "mpub", "topic": "tasks", "bodies": ["x", "y"]})
            events = await consumer.result()
    assert_no_errors(events)
    messages = of_kind(events, "message")
    assert sorted((m["body"], m["attempts"], m["action"]) for m in messages) == [
        ("x", 1, "req"),
        ("x", 2, "req"),
        ("x", 3, "fin"),
        ("y", 1, "req"),
        ("y", 2, "req"),
        ("y", 3, "fin"),
    ]
    for body in ("x", "y"):
        assert len({m["id"] for m in messages if m["body"] == body}) == 1
