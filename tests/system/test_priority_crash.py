"""A prioritised channel of a real ``pynsqd --durable`` killed with SIGKILL while it drains a backlog.

3,000 messages of random priority wait, mostly on disk (``--mem-queue-size=100``); a
consumer with RDY 1 finishes them one by one while the broker is killed at seeded random
points of the drain (in the middle of sweeps, of their write-backs, of commits), three
times. Durable delivery is at least once: a message finished since the last commit may
come again after a crash. So the test checks what the README promises: no message is
lost, and after every restart the messages not delivered yet come in (priority, arrival)
order; repeats of delivered messages are counted, and bounded.
"""

from __future__ import annotations

import os
import random

import pytest

from broker.protocol import encode_fin, encode_rdy
from tests.integration.test_priorities import create_channel, expected_order, publish_prioritised, random_priorities
from tests.support.v2client import connect

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("PYNSQD_PRIORITY_CRASH_SEED", "20261127"))
COUNT = 3000
KILLS = 3


async def drain_until(address, want: int | None, seen: set[bytes], order: list[list[bytes]]) -> int:
    """Consume with RDY 1 until ``want`` new messages came (None: every message), FINning each;
    new bodies go to ``order[-1]``; returns how many repeats came."""
    client = await connect(address)
    await client.send(b"SUB t c\n")
    await client.expect_response(b"OK")
    await client.send(encode_rdy(1))
    repeats = new = 0
    while want is None and len(seen) < COUNT or want is not None and new < want:
        msg = await client.read_message()
        await client.send(encode_fin(msg.id))
        if msg.body in seen:
            repeats += 1
            continue
        seen.add(msg.body)
        order[-1].append(msg.body)
        new += 1
    await client.aclose()
    return repeats


async def test_kill_9_while_draining_loses_nothing_and_keeps_order(broker_process):
    rng = random.Random(SEED)
    priorities = random_priorities(SEED, COUNT)
    proc = broker_process("--durable", "--mem-queue-size=100", "--sync-timeout=100ms")
    await create_channel(proc.http)
    await publish_prioritised(proc.tcp, "t", priorities)
    seen: set[bytes] = set()
    order: list[list[bytes]] = [[]]
    repeats = 0
    for _ in range(KILLS):
        repeats += await drain_until(proc.tcp, rng.randrange(50, 600), seen, order)
        proc.kill()
        proc.start()
        order.append([])
    repeats += await drain_until(proc.tcp, None, seen, order)
    assert len(seen) == COUNT  # none lost
    # first deliveries, across the crashes, in (priority, arrival) order
    assert [body for run in order for body in run] == expected_order(priorities)
    assert repeats <= KILLS * 600, repeats
