"""A consumer that stops reading its socket, beside healthy ones, against a real ``pynsqd``.

The contract, as nsqd keeps it with its per-client ``bufio.Writer``: a client whose
socket does not drain is given nothing beyond its output buffer
(``output_buffer_size``), so the broker's memory levels off; the write that cannot
progress for a heartbeat interval drops the client; its in-flight messages time
out and go to the other consumers. A delivery attempt counts only once the
message was handed to the socket, so ``--max-attempts`` never buries a message
that the stuck consumer could not have received.
"""

from __future__ import annotations

import sys

import pytest
import trio

from broker.protocol import FRAME_TYPE_MESSAGE, decode_message, encode_rdy
from tests.support.draining import drain
from tests.support.http_client import request
from tests.support.v2client import publish_batch, subscriber
from tests.support.waiting import wait_for, wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the broker's RSS from /proc")

BODY_SIZE = 50 * 1024
#: V2 message frame around a body: size, frame type, timestamp, attempts, id.
FRAME_OVERHEAD = 4 + 4 + 8 + 2 + 16
FRAME_SIZE = FRAME_OVERHEAD + BODY_SIZE
#: nsqd's output buffer before IDENTIFY changes it (``output_buffer_size``).
OUTPUT_BUFFER_SIZE = 16 * 1024
MEM_QUEUE_SIZE = 10
#: Freed 50 KB bodies that CPython's allocator keeps mapped between collections.
ALLOCATOR_SLACK = 16 * 1024 * 1024
#: 4.5 MB per MPUB, under nsqd's default --max-body-size of 5 MB.
MPUB_COUNT = 90


def _bodies(n: int) -> list[bytes]:
    return [b"%06d" % i + b"x" * (BODY_SIZE - 6) for i in range(n)]


async def _channel(proc) -> dict:
    stats = (await request(proc.http, "GET", "/stats?format=json&topic=t&channel=c")).json()
    return stats["topics"][0]["channels"][0]


async def _fanned_out(proc, n: int) -> None:
    """Wait until the topic has handed all ``n`` messages to the channel."""
    async def done() -> bool:
        stats = (await request(proc.http, "GET", "/stats?format=json&topic=t")).json()
        topic = stats["topics"][0]
        return topic["depth"] == 0 and topic["channels"][0]["depth"] == n

    await wait_until(done, timeout=30)


class _Proc:
    """The broker process seen through the address shape tests.support.v2client expects."""

    def __init__(self, proc):
        self.addresses = proc


async def _stuck(proc, **identify):
    """A consumer that subscribes with RDY 2500 and then never reads again."""
    identify.setdefault("msg_timeout", 1000)
    client = await subscriber(_Proc(proc), rdy=2500, **identify)
    return client


async def _stuck_then_healthy(proc, bodies: list[bytes]):
    """``bodies`` published, a stuck consumer that the broker drops once its writes time out,
    then a healthy consumer with RDY 50: (stuck, healthy)."""
    await publish_batch(proc, "t", *bodies, per_mpub=MPUB_COUNT, timeout=30)
    stuck = await _stuck(proc, heartbeat_interval=1000)
    await wait_for(lambda: "write timed out; closing" in proc.log_text(), timeout=10)
    return stuck, await subscriber(_Proc(proc), rdy=50)


async def test_memory_levels_off_while_a_consumer_does_not_read(broker_process):
    proc = broker_process(f"--mem-queue-size={MEM_QUEUE_SIZE}")
    with trio.fail_after(120):
        # the channel exists first, so that publishing is what the baseline includes
        await request(proc.http, "POST", "/topic/create?topic=t")
        await request(proc.http, "POST", "/channel/create?topic=t&channel=c")
        await publish_batch(proc, "t", *_bodies(3000), per_mpub=MPUB_COUNT, timeout=30)
        await _fanned_out(proc, 3000)
        baseline = proc.rss()
        stuck = await _stuck(proc)
        # the broker's own queues hold a topic's and a channel's memory queue; the
        # stuck client gets at most its output buffer plus the one frame that overflows it
        bound = baseline + 2 * MEM_QUEUE_SIZE * FRAME_SIZE + OUTPUT_BUFFER_SIZE + FRAME_SIZE + ALLOCATOR_SLACK
        samples = []
        # What is checked is that memory stays flat while time passes: several
        # 1 s message timeouts must go by, each of which frees the RDY window again.
        for _ in range(24):
            await trio.sleep(0.25)
            samples.append(proc.rss())
        channel = await _channel(proc)
        assert max(samples) <= bound, (
            f"RSS {max(samples) >> 20} MB > bound {bound >> 20} MB (baseline {baseline >> 20} MB); "
            f"samples {[s >> 20 for s in samples]}, channel {channel}")
        await stuck.aclose()


async def test_stuck_consumer_is_dropped_and_its_messages_go_to_the_others(broker_process):
    proc = broker_process(f"--mem-queue-size={MEM_QUEUE_SIZE}")
    bodies = _bodies(400)
    with trio.fail_after(60):
        stuck, healthy = await _stuck_then_healthy(proc, bodies)
        received: list = []
        await drain(healthy, lambda: len(received) >= len(bodies), on_message=lambda _, msg: received.append(msg))
        assert sorted(m.body for m in received) == bodies
        channel = await _channel(proc)
        assert len(channel["clients"]) == 1
        await stuck.aclose()
        await healthy.aclose()


async def test_max_attempts_buries_only_what_the_stuck_consumer_was_sent(broker_process):
    proc = broker_process(f"--mem-queue-size={MEM_QUEUE_SIZE}", "--max-attempts=1")
    bodies = _bodies(400)
    with trio.fail_after(60):
        stuck, healthy = await _stuck_then_healthy(proc, bodies)
        await healthy.send(encode_rdy(50))
        received: list = []

        async def buried_count() -> int:
            return (await _channel(proc)).get("buried_count", 0)

        async def all_accounted_for() -> bool:
            return len(received) + await buried_count() >= len(bodies)

        # every message reaches the healthy consumer or the buried set
        await drain(healthy, all_accounted_for, on_message=lambda _, msg: received.append(msg))
        buried = await buried_count()
        assert len(received) + buried == len(bodies)

        # what the stuck consumer could ever have read is what the kernel holds for it
        stuck_ids = set()
        while True:
            try:
                frame = await stuck.read_frame()
            except EOFError:
                break
            if frame.frame_type == FRAME_TYPE_MESSAGE:
                stuck_ids.add(decode_message(frame.data).id)
        peek = (await request(proc.http, "GET", "/channel/peek?topic=t&channel=c&state=buried&n=1000")).json()
        buried_ids = {m["id"].encode() for m in peek["messages"]}
        assert len(buried_ids) == buried
        assert buried_ids <= stuck_ids, f"{len(buried_ids - stuck_ids)} of {buried} buried messages were never sent"
        await healthy.aclose()
