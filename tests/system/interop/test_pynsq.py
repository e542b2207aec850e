"""What only pynsq 0.9.1 (``nsq.Writer`` / ``nsq.Reader`` on Tornado) is tested doing against the broker.

Batches held up to max_in_flight, timeouts and TOUCH, two readers on one channel, and a Reader whose
messages are buried after ``--max-attempts``. The scenarios pynsq shares with the other libraries
are in ``test_clients.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import trio

from broker.protocol import encode_mpub
from tests.support.http_client import request
from tests.support.interop import (
    PYNSQ,
    assert_no_errors,
    consume_config,
    of_kind,
    publish_with,
    run_client,
)


async def publish(broker, logs, *ops) -> list[dict]:
    return await publish_with(PYNSQ, broker, logs, *ops)


async def consume(broker, logs, topic: str, **options) -> list[dict]:
    """The events of a pynsq Reader of ``topic`` run to its end (``options``: see ``consume_config``)."""
    return await run_client(PYNSQ, "consume", consume_config(broker, topic, **options), log_dir=logs)


async def test_reader_with_max_in_flight_holds_many_messages_at_once(broker, logs):
    bodies = [f"m{i:03d}" for i in range(200)]
    with trio.fail_after(30):
        await publish(broker, logs, {"op": "mpub", "topic": "bulk", "bodies": bodies})
        events = await consume(broker, logs, "bulk", max_in_flight=25, batch=True, expect=200)
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


async def test_unanswered_message_times_out_and_is_redelivered(broker_process, logs):
    broker = broker_process("--msg-timeout=1s")
    with trio.fail_after(30):
        await publish(broker, logs, {"op": "pub", "topic": "slow", "body": "stuck"})
        events = await consume(broker, logs, "slow", hold_below=2, expect=1)
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
        events = await consume(broker, logs, "long", finish_after_ms=2200, touch_every_ms=300, expect=1, linger=0.5)
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
        events = await consume(broker, logs, "jobs", channels=["workers", "workers"], finish_after_ms=10, expect=60)
    assert_no_errors(events)
    messages = of_kind(events, "message")
    assert sorted(m["body"] for m in messages) == bodies
    per_reader = [[m for m in messages if m["reader"] == r] for r in (0, 1)]
    assert all(per_reader), "both readers receive part of the channel's messages"


_PYNSQ_READER = textwrap.dedent("""
    import json, sys
    import nsq
    import tornado.ioloop

    seen = {}

    def handler(message):
        seen.setdefault(message.body.decode(), []).append(message.attempts)
        return False  # failed: pynsq sends REQ

    reader = nsq.Reader(topic="t", channel="c", message_handler=handler,
                        nsqd_tcp_addresses=[sys.argv[1]], max_in_flight=10,
                        max_tries=0, requeue_delay=0, max_backoff_duration=0.2)
    loop = tornado.ioloop.IOLoop.current()
    loop.call_later(float(sys.argv[2]), loop.stop)
    loop.start()
    print(json.dumps(seen))
""")


async def test_pynsq_reader_that_keeps_failing_gets_its_messages_buried(broker_process):
    proc = broker_process("--max-attempts=4")
    async with await trio.open_tcp_stream(*proc.tcp) as stream:
        await stream.send_all(b"  V2" + encode_mpub("t", [b"p0", b"p1", b"p2"]))
        assert b"OK" in await stream.receive_some(1024)
    address = f"{proc.tcp[0]}:{proc.tcp[1]}"
    result = await trio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, "-c", _PYNSQ_READER, address, "4"], capture_output=True, timeout=60, text=True))
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen == {"p0": [1, 2, 3, 4], "p1": [1, 2, 3, 4], "p2": [1, 2, 3, 4]}, seen
    reply = await request(proc.http, "GET", "/channel/peek?topic=t&channel=c&state=buried")
    doc = reply.json()
    assert doc["count"] == 3
    assert sorted((m["body"], m["attempts"]) for m in doc["messages"]) == [("p0", 4), ("p1", 4), ("p2", 4)]
    proc.terminate()
