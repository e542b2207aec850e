"""What only gnsq 1.0.2 does: its nsqd HTTP client (``gnsq.NsqdHTTPClient``), in a client process.

The scenarios gnsq shares with the other libraries are in ``test_clients.py``."""

from __future__ import annotations

import trio

from tests.support.http_client import request
from tests.support.interop import (
    GNSQ,
    address,
    assert_no_errors,
    consume_config,
    of_kind,
    run_client,
    text,
)
from tests.support.waiting import wait_until


async def http(broker, logs, *ops) -> list[dict]:
    events = await run_client(GNSQ, "http", {"http": address(broker.http), "ops": list(ops)}, log_dir=logs)
    return of_kind(events, "http")


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
        # the topic's pump copies to its channels after the publishes are answered (as nsqd's
        # messagePump does): wait until the channel holds all six
        async def site_holds_six() -> dict | None:
            [channel] = (await request(broker.http, "GET", "/stats?format=json&topic=web")).json()["topics"][0]["channels"]
            return channel if channel["message_count"] == 6 else None

        channel = await wait_until(site_holds_six, poll=0.02)
        assert channel["depth"] + channel["deferred_count"] == 6
        assert "[web" in stats_text and "[site" in stats_text

        events = await run_client(GNSQ, "consume", consume_config(broker, "web", channels=["site"], expect=6), log_dir=logs)
    assert_no_errors(events)
    assert sorted(m["body"] for m in of_kind(events, "message")) == sorted(
        ["single", "t1", "t2", "b1", text(b"b2\nwith newline"), "deferred"]
    )
