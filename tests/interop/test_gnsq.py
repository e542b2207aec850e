"""gnsq 1.0.2 (``gnsq.Producer`` / ``gnsq.Consumer`` on gevent, ``gnsq.NsqdHTTPClient``) works
against the broker unchanged. gevent runs only inside the client processes."""

from __future__ import annotations

import trio

from .harness import (
    GNSQ,
    HEX16,
    address,
    assert_no_errors,
    consume_config,
    of_kind,
    publish_with,
    run_client,
    start_client,
    text,
)


async def publish(broker, logs, *ops) -> list[dict]:
    return await publish_with(GNSQ, broker, logs, *ops)


async def http(broker, logs, *ops) -> list[dict]:
    events = await run_client(GNSQ, "http", {"http": address(broker.http), "ops": list(ops)}, log_dir=logs)
    return of_kind(events, "http")


async def test_producer_publish_multipublish_defer_then_consumer_with_max_in_flight(broker, logs):
    bodies = [f"n{i:02d}" for i in range(30)]
    binary = text(b"\x00\xff\n" * 10)
    with trio.fail_after(30):
        await publish(
            broker,
            logs,
            {"op": "pub", "topic": "numbers", "body": binary},
            {"op": "mpub", "topic": "numbers", "bodies": bodies},
            {"op": "dpub", "topic": "numbers", "defer_ms": 200, "body": "deferred"},
        )
        events = await run_client(
            GNSQ, "consume", consume_config(broker, "numbers", max_in_flight=10, expect=32), log_dir=logs
        )
    assert_no_errors(events)
    messages = of_kind(events, "message")
    assert sorted(m["body"] for m in messages) == sorted([binary, "deferred", *bodies])
    assert all(m["attempts"] == 1 for m in messages)
    assert all(HEX16.match(m["id"]) for m in messages)
    assert len({m["id"] for m in messages}) == 32
    deferred = next(m for m in messages if m["body"] == "deferred")
    assert deferred["received_ns"] - deferred["timestamp"] >= 200_000_000 - 5_000_000


async def test_consumer_requeue_redelivers_with_attempts_plus_one(broker, logs):
    bodies = ["r1", "r2", "r3"]
    with trio.fail_after(30):
        await publish(broker, logs, {"op": "mpub", "topic": "again", "bodies": bodies})
        events = await run_client(
            GNSQ,
            "consume",
            consume_config(broker, "again", max_in_flight=3, requeue_below=2, expect=3, linger=0.3),
            log_dir=logs,
        )
    assert_no_errors(events)
    messages = of_kind(events, "message")
    assert sorted((m["body"], m["attempts"], m["action"]) for m in messages) == sorted(
        [(b, 1, "req") for b in bodies] + [(b, 2, "fin") for b in bodies]
    )
    for body in bodies:
        assert len({m["id"] for m in messages if m["body"] == body}) == 1


async def test_consumer_requeue_with_delay_waits_before_redelivery(broker, logs):
    with trio.fail_after(30):
        await publish(broker, logs, {"op": "pub", "topic": "delayed", "body": "d"})
        events = await run_client(
            GNSQ,
            "consume",
            consume_config(broker, "delayed", requeue_below=2, requeue_with="method", requeue_delay_ms=500, expect=1),
            log_dir=logs,
        )
    assert_no_errors(events)
    first, second = of_kind(events, "message")
    assert (first["attempts"], second["attempts"]) == (1, 2)
    assert second["received_ns"] - first["received_ns"] >= 500_000_000


async def test_two_consumers_on_two_channels_each_receive_every_message(broker, logs):
    bodies = [f"tick{i}" for i in range(15)]
    with trio.fail_after(30):
        config = consume_config(broker, "ticks", channels=["left", "right"], max_in_flight=5, expect=30)
        async with start_client(GNSQ, "consume", config, log_dir=logs) as consumer:
            await consumer.wait_for("subscribed", 2)
            await publish(broker, logs, {"op": "mpub", "topic": "ticks", "bodies": bodies})
            events = await consumer.result()
    assert_no_errors(events)
    messages = of_kind(events, "message")
    for channel in ("left", "right"):
        assert sorted(m["body"] for m in messages if m["channel"] == channel) == sorted(bodies)


async def test_max_tries_gives_up(broker, logs):
    with trio.fail_after(30):
        await publish(broker, logs, {"op": "pub", "topic": "bad", "body": "poison"})
        events = await run_client(
            GNSQ,
            "consume",
            consume_config(broker, "bad", max_tries=3, requeue_below=1000, expect=1, linger=0.5),
            log_dir=logs,
        )
    assert_no_errors(events)
    assert [m["attempts"] for m in of_kind(events, "message")] == [1, 2, 3]
    assert [g["attempts"] for g in of_kind(events, "giving_up")] == [4]


async def test_http_client_publish_multipublish_create_and_stats(broker, logs):
    with trio.fail_after(30):
        results = await http(
            broker,
            logs,
            {"op": "ping"},
            {"op": "info"},
            {"op": "create_topic", "topic": "web"},
            {"op": "create_channel", "topic": "web", "channel": "site"},
            {"op": "pub", "topic": "web", "body": "single"},
            {"op": "mpub", "topic": "web", "bodies": ["t1", "t2"]},
            {"op": "mpub", "topic": "web", "bodies": ["b1", text(b"b2\nwith newline")], "binary": True},
            {"op": "pub", "topic": "web", "body": "deferred", "defer_ms": 100},
            {"op": "stats", "topic": "web"},
            {"op": "stats", "topic": "web", "channel": "site", "text": True},
        )
        by_op = [(r["op"], r.get("result", r.get("error"))) for r in results]
        assert all("error" not in r for r in results), by_op
        ping, info, create_topic, create_channel, pub, mpub, mpub_binary, dpub, stats, stats_text = (
            r["result"] for r in results
        )
        assert ping == "OK"
        assert info["version"] and info["tcp_port"] == broker.tcp[1] and info["http_port"] == broker.http[1]
        assert (pub, mpub, mpub_binary, dpub) == ("OK", "OK", "OK", "OK")
        (topic,) = stats["topics"]
        assert topic["topic_name"] == "web"
        assert topic["message_count"] == 6
        (channel,) = topic["channels"]
        assert channel["channel_name"] == "site"
        assert channel["message_count"] == 6
        assert channel["depth"] + channel["deferred_count"] == 6
        assert "[web" in stats_text and "[site" in stats_text

        events = await run_client(GNSQ, "consume", consume_config(broker, "web", channels=["site"], expect=6), log_dir=logs)
    assert_no_errors(events)
    assert sorted(m["body"] for m in of_kind(events, "message")) == sorted(
        ["single", "t1", "t2", "b1", text(b"b2\nwith newline"), "deferred"]
    )
