"""Publishers of every kind nsqd takes (TCP ``PUB``, ``MPUB``, ``DPUB``, HTTP ``/pub``, ``/mpub``)
that keep a ledger of what was acknowledged and what was refused, and a consumer that counts
what it is given.

The :class:`~tests.support.ledger.Ledger` makes the bodies: every body is unique (its kind
and a number, padded to ``size``), so a test can tell which acknowledged message was
delivered and which was not. A refused publish is recorded with
the broker's answer: the error frame for TCP (after which the broker closes the connection,
as nsqd does: the publisher connects again), the status and body for HTTP.
"""

from __future__ import annotations

from collections import Counter

import trio

from broker.protocol import (
    FRAME_TYPE_RESPONSE,
    encode_dpub,
    encode_fin,
    encode_mpub,
    encode_pub,
    encode_rdy,
    encode_sub,
)
from tests.support.draining import drain
from tests.support.http_client import HTTPClient
from tests.support.ledger import Ledger
from tests.support.v2client import V2Client, connect

__all__ = ["KINDS", "Consumer", "Ledger", "publish_once", "publish_until"]

KINDS = ("PUB", "MPUB", "DPUB", "HTTP /pub", "HTTP /mpub")
#: Messages per MPUB and per HTTP /mpub.
BATCH = 10
#: DPUB's deferral: short, so deferred messages are due by the time a test drains.
DEFER_MS = 20


class _Publisher:
    """One kind of publisher; a TCP one keeps its connection until the broker closes it."""

    def __init__(self, kind: str, tcp: tuple[str, int], http: tuple[str, int], ledger: Ledger):
        self.kind = kind
        self.tcp = tcp
        self.http = http
        self.ledger = ledger
        self.client: V2Client | None = None

    async def publish(self) -> bytes | None:
        """One publish of new bodies: None if acknowledged (recorded), else the broker's answer (recorded)."""
        kind, ledger = self.kind, self.ledger
        bodies = ledger.bodies(kind, BATCH if "MPUB" in kind.upper() else 1)
        if kind.startswith("HTTP"):
            target = f"/pub?topic={ledger.topic}" if kind == "HTTP /pub" else f"/mpub?topic={ledger.topic}"
            async with HTTPClient(self.http) as client:
                reply = await client.post(target, b"\n".join(bodies))
            ok = (reply.status, reply.body) == (200, b"OK")
            answer = b"%d %s" % (reply.status, reply.body)
        else:
            if self.client is None:
                self.client = await connect(self.tcp, timeout=30)
            if kind == "PUB":
                await self.client.send(encode_pub(ledger.topic, bodies[0]))
            elif kind == "MPUB":
                await self.client.send(encode_mpub(ledger.topic, bodies))
            else:
                await self.client.send(encode_dpub(ledger.topic, DEFER_MS, bodies[0]))
            frame = await self.client.read_frame()
            ok = (frame.frame_type, frame.data) == (FRAME_TYPE_RESPONSE, b"OK")
            answer = frame.data
            if not ok:
                await self.client.expect_closed()
                await self.client.aclose()
                self.client = None
        if ok:
            ledger.acked.update(bodies)
            return None
        ledger.refused.setdefault(kind, []).append(answer)
        return answer

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.aclose()
            self.client = None


async def publish_once(kind: str, tcp: tuple[str, int], http: tuple[str, int], ledger: Ledger) -> bytes | None:
    """One publish of ``kind`` on a new connection: None if acknowledged, else the broker's answer."""
    publisher = _Publisher(kind, tcp, http, ledger)
    try:
        return await publisher.publish()
    finally:
        await publisher.aclose()


async def publish_until(tcp: tuple[str, int], http: tuple[str, int], ledger: Ledger, *, refusals: int = 1) -> None:
    """Every kind publishes, all at once, until each has been refused ``refusals`` times."""
    async def run(kind: str) -> None:
        publisher = _Publisher(kind, tcp, http, ledger)
        try:
            while len(ledger.refused.get(kind, ())) < refusals:
                await publisher.publish()
        finally:
            await publisher.aclose()

    async with trio.open_nursery() as nursery:
        for kind in KINDS:
            nursery.start_soon(run, kind)


class Consumer:
    """A subscriber that FINs what it is given and counts every delivery in ``delivered``
    (which a consumer of the same channel after a restart takes over)."""

    def __init__(self, client: V2Client, delivered: Counter[bytes] | None = None):
        self.client = client
        self.delivered: Counter[bytes] = Counter() if delivered is None else delivered

    @classmethod
    async def subscribe(cls, tcp: tuple[str, int], topic: str, channel: str, rdy: int = 100,
                        delivered: Counter[bytes] | None = None) -> Consumer:
        client = await connect(tcp, timeout=30)
        await client.send(encode_sub(topic, channel))
        await client.expect_response(b"OK")
        await client.send(encode_rdy(rdy))
        return cls(client, delivered)

    async def take(self, count: int) -> None:
        """Receive and FIN ``count`` messages."""
        for _ in range(count):
            msg = await self.client.read_message()
            self.delivered[msg.body] += 1
            await self.client.send(encode_fin(msg.id))

    async def drain(self, expected: set[bytes]) -> None:
        """Receive and FIN until every body of ``expected`` was delivered."""
        def count(client: V2Client, msg) -> None:
            self.delivered[msg.body] += 1

        await drain(self.client, lambda: expected <= self.delivered.keys(), on_message=count)

    async def aclose(self) -> None:
        await self.client.aclose()
