"""Floods of cheap input (compressed, TLS, plain on many connections) beside healthy clients.

A flooding client sends megabytes of ``NOP``: as deflate or snappy a few kilobytes on
the wire, through TLS, or plain on many connections at once. Meanwhile a publisher keeps
a ``PUB`` round trip going and a consumer with a 1 s heartbeat answers every heartbeat.
Each connection's input is applied a bounded turn at a time, so the worst round trip
stays far below a second and the consumer is not dropped for silence (``no command for
2s``), as with nsq's own nsqd, which is held to the same bounds. The flood is applied
whole (its last ``PUB`` is answered) and the broker's memory does not grow with it.

A huge publish is the same test with one command: an ``MPUB`` of a million one-byte
bodies (5 MB, within the default ``--max-body-size``), over TCP or as an HTTP ``/mpub``
(text or binary), durable or not. It is answered once, after all of it is queued, and
its messages reach the channel whole and in order.
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest
import trio

from broker.protocol import FRAME_TYPE_RESPONSE, encode_identify, encode_pub, encode_rdy, encode_sub
from tests.support.http_client import HTTPClient, create_channel, request
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
from tests.support.v2client import V2Client, connect, subscriber
from tests.support.waiting import wait_until

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

#: Messages in the huge MPUB: a million one-byte bodies are 5 MB on the wire, within the
#: default --max-body-size; a broker that queues them in one go held everyone for seconds.
HUGE_COUNT = 1_000_000
#: The one-byte bodies, in turn: any byte but a newline (the separator of a text /mpub).
#: Their period does not divide a power of two, so pieces out of order would show.
ALPHABET = bytes(b for b in range(256) if b != ord("\n"))


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


async def _beside_a_probe(proc: BrokerProcess, flood: Callable[[], Awaitable[None]]) -> float:
    """Run ``flood`` while a publisher keeps a PUB round trip going and a consumer with a 1 s
    heartbeat answers every heartbeat; returns the worst round trip. Fails if the consumer
    was dropped."""
    consumer = await connect(proc.tcp)
    await consumer.send(encode_identify({"heartbeat_interval": 1000}) + encode_sub("quiet", "c"))
    await consumer.expect_response(b"OK")
    await consumer.expect_response(b"OK")
    publisher = await connect(proc.tcp)
    await publisher.send(encode_pub("probe", b"first"))
    await publisher.expect_response(b"OK")
    round_trips: list[float] = []
    dropped: list[str] = []
    flooded, probed = trio.Event(), trio.Event()

    async def probe() -> None:
        while not flooded.is_set():  # the round trip under way when the flood ends counts too
            round_trips.append(await publisher.timed_pub("probe", b"x"))
        probed.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(_answer_heartbeats, consumer, dropped)
        nursery.start_soon(probe)
        await flood()
        flooded.set()  # the flood was applied
        await probed.wait()
        nursery.cancel_scope.cancel()
    assert not dropped, f"the consumer answering heartbeats was dropped: {dropped}"
    await consumer.send(encode_pub("quiet", b"still here"))
    await consumer.expect_response(b"OK")
    print(f"{len(round_trips)} round trips, worst {max(round_trips) * 1000:.1f} ms")
    return max(round_trips)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_flood_does_not_hold_the_other_connections(broker, transport):
    if (broker.name, transport) == ("nsqd", "plain"):
        # measured: nsqd's own worst round trip beside 64 plain flooders is 0.2-0.6 s on a busy
        # 2-core machine (Go gives each busy goroutine 10 ms slices), so it cannot be held to the bound
        pytest.skip("nsqd 1.3.0 itself misses the bound beside 64 plain flooders (worst round trip 0.2-0.6 s): "
                    "the plain flood holds pynsqd to it")
    proc = broker.proc
    pynsqd = broker.name == "pynsqd"
    with trio.fail_after(120):
        count = FLOODERS.get(transport, DEFAULT_FLOODERS)
        flooders = [await _flooder(broker, transport) for _ in range(count)]
        rss_before = proc.rss("VmHWM") if pynsqd else 0

        async def flood() -> None:
            async with trio.open_nursery() as floods:
                for flooder in flooders:
                    floods.start_soon(_flood, flooder, FLOOD_BYTES // count)

        worst = await _beside_a_probe(proc, flood)
        print(f"{broker.name} {transport}: worst round trip {worst * 1000:.1f} ms")
        assert worst < MAX_ROUND_TRIP, f"a PUB waited {worst:.2f} s behind the flood"
        if pynsqd:
            growth = proc.rss("VmHWM") - rss_before
            assert growth < MAX_RSS_GROWTH, f"peak RSS grew {growth >> 20} MB"


def _huge_bodies() -> bytes:
    """The :data:`HUGE_COUNT` one-byte bodies, in order (the i-th is ``ALPHABET[i % len(ALPHABET)]``)."""
    repeats = -(-HUGE_COUNT // len(ALPHABET))
    return (ALPHABET * repeats)[:HUGE_COUNT]


def _binary_mpub(bodies: bytes) -> bytes:
    """The binary MPUB body (count, then each size and body) of one-byte ``bodies``."""
    data = bytearray(4 + 5 * len(bodies))
    struct.pack_into(">i", data, 0, len(bodies))
    data[7::5] = b"\x01" * len(bodies)
    data[8::5] = bodies
    return bytes(data)


async def _publish_huge(proc: BrokerProcess, via: str, bodies: bytes) -> None:
    """Publish ``bodies`` to topic ``huge`` as one MPUB over TCP, or one HTTP ``/mpub`` (text or binary)."""
    binary = _binary_mpub(bodies)
    if via == "tcp":
        publisher = await connect(proc.tcp, timeout=60)
        await publisher.send(b"MPUB huge\n" + struct.pack(">i", len(binary)) + binary)
        await publisher.expect_response(b"OK")
        await publisher.aclose()
        return
    if via == "http":
        target, data = "/mpub?topic=huge", b"\n".join(bodies[i:i + 1] for i in range(len(bodies)))
    else:
        target, data = "/mpub?topic=huge&binary=true", binary
    reply = await HTTPClient(proc.http).request("POST", target, data)
    assert (reply.status, reply.body) == (200, b"OK"), reply


async def _all_in_the_channel(proc: BrokerProcess) -> bool:
    """The topic has handed channel ``c`` every message of the huge MPUB."""
    reply = await request(proc.http, "GET", "/stats?format=json&topic=huge&channel=c")
    [topic] = reply.json()["topics"]
    [channel] = topic["channels"]
    return not topic["depth"] and channel["depth"] == HUGE_COUNT


async def _consume(proc: BrokerProcess, bodies: bytes, *, in_order: bool) -> None:
    """Consume channel ``huge/c`` and check that it gives ``bodies`` (one byte each), in order
    if ``in_order`` (nsqd's channel mixes its memory and disk queues)."""
    consumer = await subscriber(proc, "huge", "c", timeout=60)
    stream = consumer.stream  # read raw from here on: a million frames decoded one by one are slow
    await stream.send_all(encode_rdy(2500))
    pending = b""
    got = bytearray()
    unpack = struct.Struct(">ii").unpack_from
    with trio.fail_after(120):
        while len(got) < len(bodies):
            data = await stream.receive_some(1 << 20)
            assert data, "the broker closed the connection"
            pending += data
            pos, end = 0, len(pending)
            fins = []
            while end - pos >= 8:
                size, frame_type = unpack(pending, pos)
                if end - pos < 4 + size:
                    break
                if frame_type == 2:  # a message: timestamp, attempts, id, body
                    assert size == 4 + 26 + 1, size
                    fins.append(b"FIN " + pending[pos + 18:pos + 34] + b"\n")
                    got += pending[pos + 34:pos + 35]
                pos += 4 + size
            pending = pending[pos:]
            if fins:
                await stream.send_all(b"".join(fins))
    await consumer.aclose()
    if in_order:
        assert got == bodies, "the messages came out of order"
    else:
        assert sorted(got) == sorted(bodies), "the messages are not those published"


@pytest.mark.parametrize("via", ["tcp", "http", "http-binary"])
async def test_a_huge_mpub_does_not_hold_the_other_connections(broker, via):
    proc = broker.proc
    bodies = _huge_bodies()
    with trio.fail_after(180):
        await create_channel(proc.http, "huge", "c")
        worst = await _beside_a_probe(proc, lambda: _publish_huge(proc, via, bodies))
        print(f"{broker.name} {via}: worst round trip {worst * 1000:.1f} ms")
        assert worst < MAX_ROUND_TRIP, f"a PUB waited {worst:.2f} s behind the MPUB"
        await wait_until(lambda: _all_in_the_channel(proc), timeout=60, poll=0.1)
        if via == "tcp":
            await _consume(proc, bodies, in_order=broker.name == "pynsqd")


async def test_a_huge_durable_mpub_does_not_hold_the_other_connections(tmp_path):
    proc = BrokerProcess(tmp_path / "data", "--durable").start()
    try:
        bodies = _huge_bodies()
        with trio.fail_after(180):
            await create_channel(proc.http, "huge", "c")
            worst = await _beside_a_probe(proc, lambda: _publish_huge(proc, "tcp", bodies))
            print(f"pynsqd --durable: worst round trip {worst * 1000:.1f} ms")
            assert worst < MAX_ROUND_TRIP, f"a PUB waited {worst:.2f} s behind the MPUB"
            await wait_until(lambda: _all_in_the_channel(proc), timeout=60, poll=0.1)
    finally:
        proc.kill()


#: ``--max-body-size`` for the huge IDENTIFY bodies: 20 MB of numbers or keys took the event
#: loop 1.4 s to decode (nsqd skips what it does not know in milliseconds).
IDENTIFY_BODY_SIZE = 20 * 1024 * 1024


def _huge_identify(kind: str) -> bytes:
    """An IDENTIFY body of almost :data:`IDENTIFY_BODY_SIZE` bytes: valid JSON, every key unknown."""
    item = {"numbers": b"1,", "fractions": b"1.5,", "keys": b'"a":1,'}[kind]
    count = (IDENTIFY_BODY_SIZE - 64) // len(item)
    if kind == "keys":
        return b"{" + item * count + b'"a":1}'
    return b'{"x":[' + item * count + b"1]}"


@pytest.mark.parametrize("program", ["pynsqd", "nsqd"])
@pytest.mark.parametrize("kind", ["numbers", "fractions", "keys"])
async def test_a_huge_identify_does_not_hold_the_other_connections(tmp_path, program, kind):
    if program == "nsqd" and nsq_bin_missing() is not None:
        pytest.skip(nsq_bin_missing() or "")
    nsqd = [str(nsq_bin() / "nsqd")] if program == "nsqd" else None
    proc = BrokerProcess(tmp_path / "data", f"--max-body-size={IDENTIFY_BODY_SIZE}", program=nsqd).start()
    try:
        body = _huge_identify(kind)
        with trio.fail_after(60):
            client = await connect(proc.tcp, timeout=30)

            async def identify() -> None:
                await client.send(b"IDENTIFY\n" + struct.pack(">I", len(body)) + body)
                await client.expect_response(b"OK")

            worst = await _beside_a_probe(proc, identify)
            print(f"{program} {kind}: worst round trip {worst * 1000:.1f} ms")
            assert worst < MAX_ROUND_TRIP, f"a PUB waited {worst:.2f} s behind the IDENTIFY"
    finally:
        proc.kill()
