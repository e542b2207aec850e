"""A real pynsqd whose topic queue was damaged on disk delivers everything but the damaged message."""

from __future__ import annotations

import re
import subprocess
import sys

import trio

from broker.protocol import encode_fin, encode_mpub
from diskqueue.format import HEADER_SIZE, RECORD_HEADER_SIZE, segment_filename
from tests.support.diskqueues import flip, record_spans
from tests.support.paths import REPO
from tests.support.v2client import connect, subscriber

COUNT = 3000


async def test_flipped_bytes_mid_segment_lose_exactly_the_damaged_message(broker_process) -> None:
    proc = broker_process("--mem-queue-size=0")
    bodies = [b"body-%05d-" % i + b"x" * (i % 97) for i in range(COUNT)]
    with trio.fail_after(60):
        producer = await connect(proc.tcp)
        for start in range(0, COUNT, 500):
            await producer.send(encode_mpub("t", bodies[start : start + 500]))
            await producer.expect_response()
        await producer.aclose()
    assert proc.terminate() == 0

    segment = proc.data_path / segment_filename("t", 0)
    spans = record_spans(segment)
    assert len(spans) == COUNT
    at = spans[COUNT // 2][0] + RECORD_HEADER_SIZE + 20  # inside one message, as a bad sector would be
    assert at > HEADER_SIZE
    flip(segment, at)
    damaged = [i for i, (s, e) in enumerate(spans) if s < at + 8 and at < e]

    report = subprocess.run([sys.executable, "-m", "diskqueue", str(proc.data_path), "t"],
                            capture_output=True, text=True, cwd=REPO, timeout=60)
    assert report.returncode == 1
    assert re.search(rf"records lost: {len(damaged)}$", report.stdout, re.M), report.stdout

    restarted = broker_process()
    received: list[bytes] = []
    with trio.fail_after(60):
        consumer = await subscriber(restarted, "t", "c", rdy=500)
        while len(received) < COUNT - len(damaged):
            msg = await consumer.read_message()
            received.append(msg.body)
            await consumer.send(encode_fin(msg.id))
        await consumer.expect_quiet()
    assert received == [b for i, b in enumerate(bodies) if i not in damaged]
    assert f"DISKQUEUE(t): {len(damaged)} record(s) lost to damage in segment 000000" in restarted.log_text()
