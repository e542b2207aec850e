"""statsd pushes of pynsqd and nsq 1.3.0's nsqd, side by side, after the same load.

Each program pushes to a UDP socket the test owns. After the load has settled, the
second complete push (a push ends with ``mem.gc_runs``) is compared: the metric names
after the prefix, in order, with their types; gauge values and the counters' deltas
summed over every push, except memory and latency values, which are the process's own;
and the packets: no larger than ``--statsd-udp-packet-size`` unless one line is, packed
greedily with whole lines as nsqd packs them.
"""

from __future__ import annotations

import itertools
import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field

import pytest
import trio

from broker.protocol import encode_fin, encode_rdy, encode_req
from tests.support.http_client import request
from tests.support.nsq_programs import nsq_bin, nsq_bin_missing
from tests.support.paths import REPO
from tests.support.processes import BrokerProcess
from tests.support.v2client import V2Client, subscriber
from tests.support.waiting import wait_for, wait_until

pytestmark = pytest.mark.skipif(nsq_bin_missing() is not None, reason=str(nsq_bin_missing()))

#: nsqd spreads a push's packets over the interval less one second (and panics below that).
INTERVAL = "1200ms"
PACKET_SIZE = 150
LONG_TOPIC = "long_" + "t" * 59  # 64 characters, nsqd's longest name: its channel lines exceed a packet
LONG_CHANNEL = "c" * 64
MESSAGES = 10


@dataclass
class Receiver:
    """A UDP socket collecting packets; ``pushes`` are the lists of lines that end with ``mem.gc_runs``."""

    sock: trio.socket.SocketType
    packets: list[bytes] = field(default_factory=list)
    pushes: list[list[bytes]] = field(default_factory=list)
    push_packets: list[list[bytes]] = field(default_factory=list)
    settled_at: int | None = None  # how many pushes had completed when the load had settled

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    async def run(self) -> None:
        lines: list[bytes] = []
        packets: list[bytes] = []
        while True:
            packet = await self.sock.recv(65536)
            self.packets.append(packet)
            packets.append(packet)
            for line in packet.splitlines(keepends=True):
                lines.append(line)
                if b".mem.gc_runs:" in line or line.startswith(b"mem.gc_runs:"):
                    self.pushes.append(lines)
                    self.push_packets.append(packets)
                    lines, packets = [], []


def _parse(line: bytes, prefix: bytes) -> tuple[str, int, str]:
    assert line.startswith(prefix) and line.endswith(b"\n"), line
    name, _, rest = line[len(prefix):-1].decode().partition(":")
    value, _, kind = rest.partition("|")
    return name, int(value), kind


async def _settled(http: tuple[str, int]) -> bool:
    """Whether every queue of the load shows its final numbers in ``/stats``."""
    stats = json.loads((await request(http, "GET", "/stats?format=json")).body)
    got = {(t["topic_name"], c["channel_name"]): (c["depth"], c["in_flight_count"], c["deferred_count"])
           for t in stats["topics"] for c in t["channels"]}
    return got == {
        ("t1", "c1"): (0, 2, 2), ("t1", "c2"): (MESSAGES, 0, 0), ("t1", "e#ephemeral"): (MESSAGES, 0, 0),
        ("eph#ephemeral", "c"): (3, 0, 0), (LONG_TOPIC, LONG_CHANNEL): (1, 0, 0),
    }


async def _apply_load(tcp: tuple[str, int], http: tuple[str, int]) -> list[V2Client]:
    """Topics with a consumed channel, an idle one and ephemeral ones; FIN 6, REQ 2, 2 left in flight."""
    consumer = await subscriber(tcp, "t1", "c1")
    idle = [await subscriber(tcp, "t1", "e#ephemeral"), await subscriber(tcp, "eph#ephemeral", "c")]
    for target in ("/channel/create?topic=t1&channel=c2", f"/topic/create?topic={LONG_TOPIC}", f"/channel/create?topic={LONG_TOPIC}&channel={LONG_CHANNEL}"):
        assert (await request(http, "POST", target)).status == 200
    bodies = b"\n".join(b"message-%d" % i for i in range(MESSAGES))
    assert (await request(http, "POST", "/mpub?topic=t1", bodies)).status == 200
    for i in range(3):
        assert (await request(http, "POST", "/pub?topic=eph%23ephemeral", b"e%d" % i)).status == 200
    assert (await request(http, "POST", f"/pub?topic={LONG_TOPIC}", b"long")).status == 200
    await consumer.send(encode_rdy(MESSAGES))
    messages = await consumer.read_messages(MESSAGES)
    await consumer.send(b"".join(encode_fin(m.id) for m in messages[:6]))
    await consumer.send(b"".join(encode_req(m.id, 60_000) for m in messages[6:8]))
    await consumer.sync()
    return [consumer, *idle]


@dataclass
class Observed:
    prefix: bytes
    names: list[tuple[str, str]]  # (name, type) of the compared push, in order
    values: dict[str, int]  # gauges of the compared push, counters summed over every push up to it
    pushes: list[list[bytes]]
    push_packets: list[list[bytes]]


async def _observe(program: list[str], tmp_path, name: str, *flags: str) -> Observed:
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    await sock.bind(("127.0.0.1", 0))
    receiver = Receiver(sock)
    # pynsqd runs as ``python -m broker`` in REPO, which puts this checkout first on sys.path
    proc = BrokerProcess(tmp_path / name, "--broadcast-address=127.0.0.1", f"--statsd-address=127.0.0.1:{receiver.port}",
                         f"--statsd-interval={INTERVAL}", f"--statsd-udp-packet-size={PACKET_SIZE}",
                         "--e2e-processing-latency-percentile=1.0,0.5", *flags,
                         program=program, cwd=REPO, log_path=tmp_path / f"{name}.log")
    try:
        with sock, trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(receiver.run)
                await trio.to_thread.run_sync(proc.start)
                clients = await _apply_load(proc.tcp, proc.http)
                await wait_until(lambda: _settled(proc.http), timeout=30, poll=0.02)
                settled_at = len(receiver.pushes)
                # the push that completes first may have been taken before the load settled
                await wait_for(lambda: len(receiver.pushes) >= settled_at + 2, timeout=30, poll=0.02)
                for client in clients:
                    await client.aclose()
                nursery.cancel_scope.cancel()
    finally:
        proc.kill()
    pushes = receiver.pushes[:settled_at + 2]
    prefix = b"nsq.127_0_0_1_%d." % proc.http[1]
    counters: dict[str, int] = defaultdict(int)
    for push in pushes:
        for line in push:
            metric, value, kind = _parse(line, prefix)
            if kind == "c":
                counters[metric] += value
    names, values = [], {}
    for line in pushes[-1]:
        metric, value, kind = _parse(line, prefix)
        names.append((metric, kind))
        values[metric] = counters[metric] if kind == "c" else value
    return Observed(prefix, names, values, pushes, receiver.push_packets[:settled_at + 2])


def _own_values(name: str) -> bool:
    """Memory and latency numbers belong to each process; everything else must match."""
    return name.startswith("mem.") or "e2e_processing_latency" in name


@pytest.mark.parametrize("exclude_ephemeral", [False, True], ids=["all", "exclude-ephemeral"])
async def test_statsd_push_matches_nsqd(tmp_path, exclude_ephemeral):
    flags = ["--statsd-exclude-ephemeral"] if exclude_ephemeral else []
    results: dict[str, Observed] = {}

    async def observe(name: str, program: list[str]) -> None:
        results[name] = await _observe(program, tmp_path, name, *flags)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(observe, "nsqd", [str(nsq_bin() / "nsqd")])
        nursery.start_soon(observe, "pynsqd", [sys.executable, "-m", "broker"])
    nsqd, ours = results["nsqd"], results["pynsqd"]

    assert ours.names == nsqd.names
    assert {k: v for k, v in ours.values.items() if not _own_values(k)} == \
           {k: v for k, v in nsqd.values.items() if not _own_values(k)}
    # the numbers the load makes, so that agreeing on wrong ones fails too
    expected = {
        "topic.t1.message_count": MESSAGES, "topic.t1.message_bytes": sum(len(b"message-%d" % i) for i in range(MESSAGES)),
        "topic.t1.channel.c1.message_count": MESSAGES, "topic.t1.channel.c1.in_flight_count": 2,
        "topic.t1.channel.c1.deferred_count": 2, "topic.t1.channel.c1.requeue_count": 2,
        "topic.t1.channel.c1.clients": 1, "topic.t1.channel.c2.depth": MESSAGES, "topic.t1.channel.c2.clients": 0,
        f"topic.{LONG_TOPIC}.channel.{LONG_CHANNEL}.depth": 1,
    }
    assert {k: ours.values[k] for k in expected} == expected
    ephemeral = [n for n, _ in ours.names if "#ephemeral" in n]
    if exclude_ephemeral:
        assert ephemeral == []
    else:
        assert ours.values["topic.eph#ephemeral.message_count"] == 3
        assert ours.values["topic.t1.channel.e#ephemeral.clients"] == 1
    assert [n for n, _ in ours.names if n.startswith("mem.")] == [
        "mem.heap_objects", "mem.heap_idle_bytes", "mem.heap_in_use_bytes", "mem.heap_released_bytes",
        "mem.gc_pause_usec_100", "mem.gc_pause_usec_99", "mem.gc_pause_usec_95", "mem.next_gc_bytes", "mem.gc_runs"]
    assert {kind for _, kind in ours.names} == {"c", "g"}

    for observed in (nsqd, ours):
        for lines, packets in zip(observed.pushes, observed.push_packets):
            _assert_packed_as_nsqd(lines, packets)
        assert any(len(p) > PACKET_SIZE for p in observed.push_packets[-1])


def _assert_packed_as_nsqd(lines: list[bytes], packets: list[bytes]) -> None:
    """Whole lines in order, as many as fit; only a line longer than a packet travels alone."""
    assert b"".join(packets) == b"".join(lines)
    assert all(p.endswith(b"\n") for p in packets)
    assert all(len(p) <= PACKET_SIZE or p.count(b"\n") == 1 for p in packets)
    for packet, following in itertools.pairwise(packets):
        first_line = following[:following.index(b"\n") + 1]
        assert len(packet) + len(first_line) > PACKET_SIZE, (packet, first_line)

