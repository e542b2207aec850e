"""nsqjs 0.13.0 (Node ``nsq.Writer`` / ``nsq.Reader``) works against the broker unchanged.

Needs node and ``npm ci --prefix tests/interop/js`` (the version is pinned by package-lock.json).
"""

from __future__ import annotations

import pytest
import trio

from .harness import (
    HEX16,
    NSQJS,
    assert_no_errors,
    consume_config,
    nsqjs_missing,
    of_kind,
    publish_with,
    run_client,
    start_client,
    text,
)

pytestmark = pytest.mark.skipif(nsqjs_missing() is not None, reason=str(nsqjs_missing()))


async def publish(broker, logs, *ops) -> list[dict]:
    return await publish_with(NSQJS, broker, logs, *ops)


async def test_writer_publish_mpub_defer_then_reader_receives_every_body(broker, logs):
    binary = text(bytes(range(256)))
    with trio.fail_after(30):
        await publish(
            broker,
            logs,
            {"op": "pub", "topic": "js", "body": "first"},
            {"op": "mpub", "topic": "js", "bodies": ["second", "third", binary]},
            {"op": "dpub", "topic": "js", "defer_ms": 200, "body": "deferred"},
        )
        events = await run_client(NSQJS, "consume", consume_config(broker, "js", max_in_flight=5, expect=5), log_dir=logs)
    assert_no_errors(events)
    messages = of_kind(events, "message")
    assert sorted(m["body"] for m in messages) == sorted(["first", "second", "third", binary, "deferred"])
    assert all(m["attempts"] == 1 and HEX16.match(m["id"]) for m in messages)
    deferred = next(m for m in messages if m["body"] == "deferred")
    assert deferred["received_ns"] - deferred["timestamp"] >= 200_000_000 - 5_000_000


async def test_reader_requeue_redelivers_with_attempts_plus_one(broker, logs):
    bodies = [f"q{i}" for i in range(5)]
    with trio.fail_after(30):
        config = consume_config(broker, "jsq", max_in_flight=5, requeue_below=2, expect=5, linger=0.3)
        async with start_client(NSQJS, "consume", config, log_dir=logs) as consumer:
            await consumer.wait_for("subscribed")
            await publish(broker, logs, {"op": "mpub", "topic": "jsq", "bodies": bodies})
            events = await consumer.result()
    assert_no_errors(events)
    messages = of_kind(events, "message")
    assert sorted((m["body"], m["attempts"], m["action"]) for m in messages) == sorted(
        [(b, 1, "req") for b in bodies] + [(b, 2, "fin") for b in bodies]
    )
    for body in bodies:
        assert len({m["id"] for m in messages if m["body"] == body}) == 1


async def test_max_attempts_discards(broker, logs):
    with trio.fail_after(30):
        await publish(broker, logs, {"op": "pub", "topic": "jsbad", "body": "poison"})
        events = await run_client(
            NSQJS,
            "consume",
            consume_config(broker, "jsbad", max_attempts=2, requeue_below=1000, expect=1, linger=0.5),
            log_dir=logs,
        )
    assert_no_errors(events)
    assert [m["attempts"] for m in of_kind(events, "message")] == [1, 2]
    assert [g["attempts"] for g in of_kind(events, "giving_up")] == [3]
