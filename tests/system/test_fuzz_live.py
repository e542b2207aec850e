"""A live fuzz run: random and mutated V2 commands and HTTP requests on hundreds of
connections to a real pynsqd, while a well-behaved producer and consumer keep a round trip.

The broker must stay up and keep the good round trip (every acknowledged message arrives,
each PUB is acknowledged within seconds), log no traceback, and keep its RSS bounded.
The CI run is seeded and short; a longer one (the numbers are printed with ``-s``)::

    PYNSQD_FUZZ_SECONDS=300 PYNSQD_FUZZ_CONNECTIONS=500 PYNSQD_FUZZ_SEED=7 \\
        python -m pytest -q -s -p no:cacheprovider tests/system/test_fuzz_live.py
"""

from __future__ import annotations

import os
import random
import struct

import pytest
import trio

from broker.protocol import encode_fin, encode_pub
from tests.support.http_client import request
from tests.support.v2client import connect, subscriber
from tests.support.waiting import wait_for

SECONDS = float(os.environ.get("PYNSQD_FUZZ_SECONDS", "6"))
CONNECTIONS = int(os.environ.get("PYNSQD_FUZZ_CONNECTIONS", "200"))
SEED = int(os.environ.get("PYNSQD_FUZZ_SEED", "1"))
RSS_GROWTH_LIMIT_KB = 300 * 1024

_NAMES = [b"f0", b"f1", b"f2#ephemeral", b"", b"bad name", b"x" * 65, b"\xff"]
_NUMBERS = [b"0", b"1", b"10", b"2500", b"-1", b"99999999999999999999", b"x", b""]


def _sized(rng: random.Random, body: bytes) -> bytes:
    size = len(body) if rng.random() < 0.8 else rng.choice([-1, 0, 1 << 30, len(body) + 7])
    return struct.pack(">i", size) + body


def _command(rng: random.Random) -> bytes:
    """One V2 command, usually well formed, with names that never reach the good topic."""
    name, number = rng.choice(_NAMES), rng.choice(_NUMBERS)
    body = rng.randbytes(rng.choice([0, 1, 10, 200]))
    kind = rng.randrange(12)
    if kind == 0:
        return b"SUB " + name + b" " + rng.choice(_NAMES) + b"\n"
    if kind == 1:
        return b"RDY " + number + b"\n"
    if kind == 2:
        return b"FIN " + rng.randbytes(16) + b"\n"
    if kind == 3:
        return b"REQ " + rng.randbytes(16) + b" " + number + b"\n"
    if kind == 4:
        return b"PUB " + name + b"\n" + _sized(rng, body)
    if kind == 5:
        return b"DPUB " + name + b" " + number + b"\n" + _sized(rng, body)
    if kind == 6:
        bodies = [rng.randbytes(rng.randrange(1, 30)) for _ in range(rng.randrange(0, 5))]
        inner = struct.pack(">i", len(bodies)) + b"".join(struct.pack(">i", len(b)) + b for b in bodies)
        return b"MPUB " + name + b"\n" + _sized(rng, inner)
    if kind == 7:
        return b"IDENTIFY\n" + _sized(rng, rng.choice([b'{"heartbeat_interval":1000}', b"[" * 5000, body,
                                                        b'{"output_buffer_size":-5}', b'{"msg_timeout":1}']))
    if kind == 8:
        return b"AUTH\n" + _sized(rng, body)
    if kind == 9:
        return rng.choice([b"NOP\n", b"CLS\n", b"TOUCH " + rng.randbytes(16) + b"\n", b"\r\n", b"BOGUS\n"])
    if kind == 10:
        return b"A" * rng.choice([100, 20000]) + b"\n"
    return rng.randbytes(rng.randrange(1, 40))


def _mutate(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        if not out:
            break
        at = rng.randrange(len(out))
        op = rng.randrange(3)
        if op == 0:
            out[at] = rng.randrange(256)
        elif op == 1:
            del out[at : at + rng.randrange(1, 8)]
        else:
            out[at:at] = rng.randbytes(rng.randrange(1, 8))
    return bytes(out)


_HTTP = [b"/pub?topic=f0", b"/mpub?topic=f1&binary=true", b"/config/nsqlookupd_tcp_addresses", b"/stats?format=json",
         b"/channel/peek?topic=f0&channel=c&n=5", b"/topic/create?topic=f1", b"/ping", b"/nope"]


def _http_request(rng: random.Random) -> bytes:
    method = rng.choice([b"GET", b"POST", b"PUT", b"DELETE"])
    body = rng.choice([b"", rng.randbytes(20), b"[" * 3000, b'["a:1"]'])
    raw = (method + b" " + rng.choice(_HTTP) + b" HTTP/1.1\r\nHost: x\r\nContent-Length: "
           + str(len(body)).encode() + b"\r\n\r\n" + body)
    return _mutate(rng, raw) if rng.random() < 0.5 else raw


class Tally:
    def __init__(self) -> None:
        self.connections = 0
        self.commands = 0
        self.requests = 0


async def _fuzz_connection(rng: random.Random, proc, tally: Tally, stop_at: float) -> None:
    while trio.current_time() < stop_at:
        http = rng.random() < 0.2
        if http:
            data = _http_request(rng)
            tally.requests += 1
        else:
            commands = [_command(rng) for _ in range(rng.randrange(1, 12))]
            data = b"".join(commands)
            if rng.random() < 0.4:
                data = _mutate(rng, data)
            data = (b"  V2" if rng.random() < 0.95 else rng.randbytes(4)) + data
            tally.commands += len(commands)
        tally.connections += 1
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream(*(proc.http if http else proc.tcp))
            try:
                async with trio.open_nursery() as nursery:
                    # read all along: a fuzzer may have subscribed, and the broker, like nsqd,
                    # stops reading a client whose socket does not take what it writes
                    nursery.start_soon(_read_until_closed, stream)
                    await _send_in_pieces(rng, stream, data)
                    await trio.sleep(rng.uniform(0.05, 0.5))
                    nursery.cancel_scope.cancel()
            finally:
                await stream.aclose()


async def _send_in_pieces(rng: random.Random, stream: trio.SocketStream, data: bytes) -> None:
    """As a slow or odd client sends; the broker closing a connection it refused is expected."""
    step = max(rng.randrange(1, 64), len(data) // 40)  # at most 40 pieces: hundreds of clients share one loop
    try:
        for pos in range(0, len(data), step):
            await stream.send_all(data[pos : pos + step])
    except trio.BrokenResourceError:
        pass


async def _read_until_closed(stream: trio.SocketStream) -> None:
    try:
        while await stream.receive_some(65536):
            pass
    except trio.BrokenResourceError:
        pass


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.deadline(SECONDS + 300)  # a run as long as PYNSQD_FUZZ_SECONDS says
async def test_fuzzed_connections_do_not_disturb_a_good_round_trip(broker_process) -> None:
    proc = broker_process()
    rng = random.Random(SEED)
    tally = Tally()
    published: list[bytes] = []
    received: set[bytes] = set()
    slowest_ack = 0.0
    rss_before = _rss_kb(proc.proc.pid)

    async def produce(stop_at: float) -> None:
        nonlocal slowest_ack
        producer = await connect(proc.tcp, timeout=10)
        n = 0
        while trio.current_time() < stop_at:
            body = b"good-%06d" % n
            sent = trio.current_time()
            await producer.send(encode_pub("good", body))
            await producer.expect_response()
            slowest_ack = max(slowest_ack, trio.current_time() - sent)
            published.append(body)
            n += 1
            await trio.sleep(0.005)
        await producer.aclose()

    async def consume() -> None:
        consumer = await subscriber(proc, "good", "c", rdy=100, timeout=SECONDS + 30)
        while True:
            msg = await consumer.read_message()
            received.add(msg.body)
            await consumer.send(encode_fin(msg.id))

    with trio.fail_after(SECONDS + 60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            stop_at = trio.current_time() + SECONDS
            async with trio.open_nursery() as fuzzers:
                fuzzers.start_soon(produce, stop_at)
                for _ in range(CONNECTIONS):
                    fuzzers.start_soon(_fuzz_connection, random.Random(rng.random()), proc, tally, stop_at)
            await wait_for(lambda: received >= set(published), timeout=30)
            nursery.cancel_scope.cancel()
        reply = await request(proc.http, "GET", "/ping")
    rss_after = _rss_kb(proc.proc.pid)
    print(f"\nlive fuzz (seed {SEED}, {SECONDS:g} s, {CONNECTIONS} concurrent): {tally.connections} connections, "
          f"{tally.commands} V2 commands, {tally.requests} HTTP requests; good round trip {len(published)} messages, "
          f"slowest PUB ack {slowest_ack * 1000:.0f} ms; RSS {rss_before // 1024} -> {rss_after // 1024} MB")
    assert (reply.status, reply.body) == (200, b"OK")
    assert proc.proc.poll() is None
    assert received == set(published) and len(published) > 10
    assert slowest_ack < 5
    assert rss_after - rss_before < RSS_GROWTH_LIMIT_KB
    assert "Traceback" not in proc.log_text()
    assert proc.terminate() == 0

