"""The real ``pynsqd`` process: start-up, graceful restart, misbehaving clients."""

from __future__ import annotations

import json
import subprocess
import sys

import trio

from broker.protocol import (
    encode_dpub,
    encode_fin,
    encode_identify,
    encode_mpub,
    encode_pub,
    encode_rdy,
    encode_sub,
)
from tests.support.http_client import request
from tests.support.v2client import connect
from tests.support.waiting import wait_for


async def _subscribe(address, topic="t", channel="c", rdy=100, **identify):
    client = await connect(address)
    if identify:
        await client.identify(**identify)
    await client.send(encode_sub(topic, channel))
    await client.expect_response(b"OK")
    await client.send(encode_rdy(rdy))
    return client


async def test_sigterm_restart_keeps_everything(broker_process):
    proc = broker_process("--mem-queue-size=50")
    producer = await connect(proc.tcp)
    bodies = [b"msg-%04d" % i for i in range(500)]
    await producer.send(encode_mpub("t", bodies))
    await producer.expect_response()
    await producer.send(encode_dpub("t", 2000, b"deferred"))
    await producer.expect_response()
    consumer = await _subscribe(proc.tcp, rdy=10)
    in_flight = await consumer.read_messages(10)
    assert proc.terminate() == 0
    log = proc.log_text()
    assert "shutting down" in log

    meta = json.loads((proc.data_path / "nsqd.dat").read_bytes())
    assert meta["topics"] == [{"channels": [{"name": "c", "paused": False}], "name": "t", "paused": False}]

    restarted = broker_process()
    start = trio.current_time()
    consumer = await _subscribe(restarted.tcp, rdy=1000)
    seen = {}
    while len(seen) < 500:
        msg = await consumer.read_message()
        seen[msg.body] = msg.attempts
        await consumer.send(encode_fin(msg.id))
    assert sorted(seen) == bodies
    assert all(seen[m.body] == 2 for m in in_flight)
    late = await consumer.read_message()
    assert late.body == b"deferred"
    assert trio.current_time() - start >= 0.5


async def test_refuses_a_data_path_in_use(broker_process, tmp_path):
    proc = broker_process()
    second = subprocess.run(
        [sys.executable, "-m", "broker", f"--data-path={proc.data_path}", "--tcp-address=127.0.0.1:0",
         "--http-address=127.0.0.1:0"],
        capture_output=True, timeout=30,
    )
    assert second.returncode == 1
    assert b"in use" in second.stderr


async def test_a_consumer_that_stops_reading_does_not_stall_others(broker_process):
    proc = broker_process()
    stuck = await connect(proc.tcp)
    await stuck.send(encode_identify({"heartbeat_interval": 1000, "output_buffer_size": 64}))
    await stuck.read_frame()
    await stuck.send(encode_sub("t", "stuck") + encode_rdy(2500))
    healthy = await _subscribe(proc.tcp, channel="healthy", rdy=2500)
    producer = await connect(proc.tcp)
    body = b"x" * 100_000
    for _ in range(20):
        await producer.send(encode_mpub("t", [body] * 50))
        await producer.expect_response()
    received = 0
    with trio.fail_after(20):
        while received < 1000:
            msg = await healthy.read_message()
            await healthy.send(encode_fin(msg.id))
            received += 1
    # the stuck client never read a byte; within a heartbeat interval of its
    # writes blocking the broker drops it, and its messages wait for the next consumer
    await wait_for(lambda: "write timed out" in proc.log_text(), timeout=10, poll=0.1)


async def test_bad_input_is_refused_and_nothing_accepted_is_lost(broker_process):
    proc = broker_process("--max-msg-size=1000")
    good = await connect(proc.tcp)
    await good.send(encode_pub("t", b"accepted"))
    await good.expect_response()
    cases = [
        (encode_pub("t", b"y" * 1001), b"E_BAD_MESSAGE PUB message too big 1001 > 1000"),
        (b"PUB bad!name\n", b'E_BAD_TOPIC PUB topic name "bad!name" is not valid'),
        (b"RDY -1\n", b"E_INVALID cannot RDY in current state"),
        (b"FIN 0123456789abcdef\n", b"E_INVALID cannot FIN in current state"),
        (b"HELLO\n", b"E_INVALID invalid command HELLO"),
        (encode_mpub("t", [b"ok", b""]), b"E_BAD_MESSAGE MPUB invalid message(1) body size 0"),
    ]
    for data, error in cases:
        bad = await connect(proc.tcp)
        await bad.send(data)
        await bad.expect_error(error)
    bad = await connect(proc.tcp, magic=False)
    await bad.send(b"  V1")
    await bad.expect_error(b"E_BAD_PROTOCOL")
    # HTTP sent to the TCP port: the log names what came, as nsqd's does
    http_to_tcp = await connect(proc.tcp, magic=False)
    await http_to_tcp.send(b"POST /pub?topic=t HTTP/1.1\r\n\r\n")
    await http_to_tcp.expect_error(b"E_BAD_PROTOCOL")
    await wait_for(lambda: "ERROR: client(" in proc.log_text() and "bad protocol magic 'POST'" in proc.log_text(),
                   timeout=10, poll=0.05)
    consumer = await _subscribe(proc.tcp)
    msg = await consumer.read_message()
    assert msg.body == b"accepted"
    await consumer.expect_quiet()
    stats = (await request(proc.http, "GET", "/stats?format=json&topic=t")).json()
    assert stats["topics"][0]["message_count"] == 1
