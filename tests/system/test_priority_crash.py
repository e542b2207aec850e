"""A prioritised channel of a real ``pynsqd --durable`` killed with SIGKILL while it drains a backlog.

3,000 messages of random priority wait, mostly on disk (``--mem-queue-size=100``); a
consumer with RDY 1 finishes them one by one while the broker is killed at seeded random
points of the drain (in the middle of sweeps, of their write-backs, of commits), three
times. Durable delivery is at least once: a message finished since the last commit may
come again after a crash. So the test checks what broker/protocol/README.md promises: no message is
lost, and after every restart the messages not delivered yet come in (priority, arrival)
order; repeats of delivered messages are counted, and bounded.
"""

from __future__ import annotations

import os
import random

import pytest

from tests.support.http_client import create_channel
from tests.support.priorities import expected_order, publish_prioritised, random_priorities
from tests.support.v2client import consume_new

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("PYNSQD_PRIORITY_CRASH_SEED", "20261127"))
COUNT = 3000
KILLS = 3


async def test_kill_9_while_draining_loses_nothing_and_keeps_order(broker_process):
    rng = random.Random(SEED)
    priorities = random_priorities(SEED, COUNT)
    proc = broker_process("--durable", "--mem-queue-size=100", "--sync-timeout=100ms")
    await create_channel(proc.http)
    await publish_prioritised(proc.tcp, "t", priorities)
    seen: set[bytes] = set()
    first: list[bytes] = []  # each message's first delivery, across the crashes
    repeats = 0
    for want in [rng.randrange(50, 600) for _ in range(KILLS)] + [None]:
        bodies, again = await consume_new(proc, "t", "c", COUNT - len(seen) if want is None else want, seen)
        first += bodies
        repeats += again
        if want is not None:
            proc.kill()
            proc.start()
    assert len(seen) == COUNT  # none lost
    assert first == expected_order(priorities)  # in (priority, arrival) order
    assert repeats <= KILLS * 600, repeats
