"""Floods of cheap input (compressed, TLS, plain on many connections) beside healthy clients.

A flooding client sends megabytes of ``NOP``: as deflate or snappy a few kilobytes on
the wire, through TLS, or plain on many connections at once. Meanwhile a publisher keeps
a ``PUB`` round trip going and a consumer with a 1 s heartbeat answers every heartbeat.
Each connection's input is applied a bounded turn at a time, so the worst round trip
stays far below a second and the consumer is not dropped for silence (``no command for
2s``), as with nsq's own nsqd, which is held to the same bounds. The flood is applied
whole (its last ``PUB`` is answered) and the broker's memory does not grow with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import trio

from broker.protocol import FRAME_TYPE_RESPONSE, encode_identify, encode_pub, encode_sub
from tests.support.nsq_programs import nsq_bin_missing
from tests.support.paths import nsq_bin
from tests.support.processes import BrokerProcess
from tests.support.transports import (
    Certificates,
    DeflateStream,
    SnappyStream,
    compress_with,
    make_certificates,
    negotiate,
    upgrade_tls,
)
from tests.support.v2client import V2Client, connect

#: Plain bytes of NOP sent in all, shared by the flooding connections: a broker that applies
#: each read whole spent seconds on it and dropped the consumer.
FLOOD_BYTES = 8 * 1024 * 1024
#: How many connections flood at once: plain ones are many (the read poller applies plain
#: input for all of them in one task); a compressed one sends megabytes in one read.
FLOODERS = {"plain": 64}
DEFAULT_FLOODERS = 4
#: The worst PUB round trip allowed while a flood is applied: nsqd stays within a few
#: milliseconds; the margin is for a busy 2-core machine.
MAX_ROUND_TRIP = 0.5
#: How much a pynsqd's resident memory may grow while applying a flood.
MAX_RSS_GROWTH = 64 * 1024 * 1024

TRANSPORTS = ["deflate", "snappy", "tls", "tls+snappy", "plain"]


@dataclass
class Broker:
    """A running broker process and the certificates its TLS uses."""

    name: str
    proc: BrokerProcess
    certs: Certificates


@pytest.fixture(params=["pynsqd", "nsqd"])
def broker(request, tmp_path):
    """A pynsqd process, or nsq's own nsqd, with a TLS certificate; killed at the end."""
    if request.param == "nsqd" and nsq_bin_missing() is not None:
        pytest.skip(nsq_bin_missing() or "")
    certs = make_certificates(tmp_path / "certs")
    program = [str(nsq_bin() / "nsqd")] if request.param == "nsqd" else None
    proc = BrokerProcess(tmp_path / "data", *certs.broker_flags(), program=program)
    try:
        yield Broker(request.param, proc.start(), certs)
    finally:
        proc.kill()


async def _flooder(broker: Broker, transport: str) -> V2Client:
    """A connection upgraded as ``transport`` says (``tls``, ``deflate``, ``snappy``, both joined by ``+``)."""
    client = await connect(broker.proc.tcp, timeout=60)
    if transport == "plain":
        return client
    features = transport.split("+")
    await negotiate(client, **{"tls_v1" if feature == "tls" else feature: True for feature in features})
    if "tls" in features:
        await upgrade_tls(client, broker.certs.client_context())
    if "deflate" in features:
        await compress_with(client, DeflateStream)
    if "snappy" in features:
        await compress_with(client, SnappyStream)
    return client


async def _flood(client: V2Client, size: int) -> None:
    """``size`` bytes of NOP in one send, then a PUB whose answer says every NOP was applied."""
    await client.send(b"NOP\n" * (size // 4) + encode_pub("flood", b"last"))
    await client.expect_response(b"OK")


async def _answer_heartbeats(consumer: V2Client, dropped: list[str]) -> None:
    """Answer each heartbeat with NOP, as a client library does; notes a disconnection."""
    while True:
        try:
            frame = await consumer.read_frame(skip_heartbeats=False)
        except (EOFError, trio.BrokenResourceError) as exc:
            dropped.append(repr(exc))
            return
        assert (frame.frame_type, frame.data) == (FRAME_TYPE_RESPONSE, b"_heartbeat_"), frame
        await consumer.send(b"NOP\n")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_flood_does_not_hold_the_other_connections(broker, transport):
    if (broker.name, transport) == ("nsqd", "plain"):
        # measured: nsqd's own worst round trip beside 64 plain flooders is 0.2-0.6 s on a busy
        # 2-core machine (Go gives each busy goroutine 10 ms slices), so it cannot be held to the bound
        pytest.skip("nsqd is not held to the bound under 64 plain flooders")
    proc = broker.proc
    pynsqd = broker.name == "pynsqd"
    with trio.fail_after(120):
        consumer = await connect(proc.tcp)
        await consumer.send(encode_identify({"heartbeat_interval": 1000}) + encode_sub("quiet", "c"))
        await consumer.expect_response(b"OK")
        await consumer.expect_response(b"OK")
        publisher = await connect(proc.tcp)
        await publisher.send(encode_pub("probe", b"first"))
        await publisher.expect_response(b"OK")
        count = FLOODERS.get(transport, DEFAULT_FLOODERS)
        flooders = [await _flooder(broker, transport) for _ in range(count)]
        rss_before = proc.rss("VmHWM") if pynsqd else 0
        round_trips: list[float] = []
        dropped: list[str] = []
        flooded, probed = trio.Event(), trio.Event()

        async def probe() -> None:
            while not flooded.is_set():  # the round trip under way when the floods end counts too
                start = trio.current_time()
                await publisher.send(encode_pub("probe", b"x"))
                await publisher.expect_response(b"OK")
                round_trips.append(trio.current_time() - start)
            probed.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(_answer_heartbeats, consumer, dropped)
            nursery.start_soon(probe)
            async with trio.open_nursery() as floods:
                for flooder in flooders:
                    floods.start_soon(_flood, flooder, FLOOD_BYTES // count)
            flooded.set()  # every flood was applied
            await probed.wait()
            nursery.cancel_scope.cancel()
        worst = max(round_trips)
        print(f"{broker.name} {transport}: {len(round_trips)} round trips, worst {worst * 1000:.1f} ms")
        assert worst < MAX_ROUND_TRIP, f"a PUB waited {worst:.2f} s behind the flood"
        assert not dropped, f"the consumer answering heartbeats was dropped: {dropped}"
        if pynsqd:
            growth = proc.rss("VmHWM") - rss_before
            assert growth < MAX_RSS_GROWTH, f"peak RSS grew {growth >> 20} MB"
        await consumer.send(encode_pub("quiet", b"still here"))
        await consumer.expect_response(b"OK")

