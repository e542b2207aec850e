"""Prioritised publishing for tests: random priorities, the order a channel must deliver them
in, and a publisher that negotiated priorities (:mod:`broker.protocol.priorities`)."""

from __future__ import annotations

import random

from broker.protocol import encode_mpub
from broker.protocol.priorities import prefix_priority
from tests.support.v2client import V2Client, connect, tcp_address

__all__ = ["DEFAULT", "expected_order", "prioritised_client", "publish_prioritised", "random_priorities"]

#: The priority of a message published without one (``default_priority`` in IDENTIFY's answer).
DEFAULT = 1 << 31


def random_priorities(seed: int, count: int) -> list[int]:
    """Half from ten levels (so many share one and arrival decides), half anywhere in 0..2**32-1,
    and one in ten the default (sent as a number: stored as a message without a priority)."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        roll = rng.random()
        out.append(DEFAULT if roll < 0.1 else rng.choice(range(0, 1000, 100)) if roll < 0.55 else rng.getrandbits(32))
    return out


def expected_order(priorities: list[int]) -> list[bytes]:
    """The bodies :func:`publish_prioritised` gives ``priorities``, in (priority, arrival) order."""
    return [b"m%d" % i for i in sorted(range(len(priorities)), key=lambda i: (priorities[i], i))]


async def prioritised_client(broker) -> V2Client:
    """A client of ``broker`` (see :func:`~tests.support.v2client.tcp_address`) that negotiated priorities."""
    client = await connect(tcp_address(broker))
    answer = await client.identify(feature_negotiation=True, priorities=True)
    assert answer is not None and (answer["priorities"], answer["default_priority"]) == (True, DEFAULT)
    return client


async def publish_prioritised(broker, topic: str, priorities: list[int], batch: int = 250, first: int = 0) -> None:
    """MPUB ``priorities`` in batches; the bodies are ``m<first>``, ``m<first+1>``, ..."""
    client = await prioritised_client(broker)
    for start in range(0, len(priorities), batch):
        bodies = [prefix_priority(p, b"m%d" % i)
                  for i, p in enumerate(priorities[start:start + batch], first + start)]
        await client.send(encode_mpub(topic, bodies))
        await client.expect_response(b"OK")
    await client.aclose()
