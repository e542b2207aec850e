"""Keyed publishes: MPUB throughput with and without keys, and what a remembered key costs in memory.

Throughput: fresh brokers (``python -m broker`` on a temporary data path), one topic
nobody reads, the same number of 100-byte messages MPUBed 200 at a time over
``--connections`` connections, each keeping ``--pipeline`` MPUBs on the wire. The
payloads are encoded before the clock starts: every message of a keyed run has its
own 16-byte key, so every key is new and remembered. Unkeyed and keyed runs alternate
(unkeyed first, then keyed first, ...) and the medians are compared, so both face
the same machine.

Memory: a fresh broker per mode, ``--keys`` messages published (default 1,000,000),
then the broker's resident set size. The messages are the same in both modes (the
topic keeps them all, spilling to disk), so the difference over ``--keys`` is the
cost of one remembered key.

Usage (from the repository root)::

    python -m tests.bench.bench_keys                      # 3 rounds of 400,000 messages, then 1 M keys
    python -m tests.bench.bench_keys --rounds 5 --messages 1000000 --keys 0
    python -m tests.bench.bench_keys --broker-cmd "env PYTHONPATH=/tmp/old python3 -P -m broker"
    python -m tests.bench.bench_keys --flags=--durable --batch 1 --pipeline 1 --connections 1 --messages 3000 --keys 0
"""

from __future__ import annotations

import argparse
import shlex
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

from broker.protocol import MAGIC_V2, FrameDecoder, encode_identify, encode_mpub, encode_pub
from broker.protocol.keys import prefix_key
from tests.support.processes import BrokerProcess

TOPIC = "bench_keys"
BATCH = 200
BODY = b"b" * 100
_SIZE = struct.Struct(">I")


def _payloads(count: int, keyed: bool, connection: int, batch: int = BATCH, topic: str = TOPIC) -> list[bytes]:
    """The MPUB commands of one connection (PUBs for a batch of 1); with ``keyed`` every message
    has a new key."""
    out = []
    for start in range(0, count, batch):
        if keyed:
            messages = [prefix_key(b"c%d-%012d" % (connection, n), BODY) for n in range(start, min(count, start + batch))]
        else:
            messages = [BODY] * (min(count, start + batch) - start)
        out.append(encode_pub(topic, messages[0]) if batch == 1 else encode_mpub(topic, messages))
    return out


def _connect(address: tuple[str, int], keyed: bool) -> socket.socket:
    sock = socket.create_connection(address)
    sock.sendall(MAGIC_V2 + encode_identify({"feature_negotiation": True, "publish_keys": keyed}))
    _read_answers(sock, FrameDecoder(), 1)
    return sock


def _read_answers(sock: socket.socket, decoder: FrameDecoder, at_least: int = 1) -> int:
    """Read until ``at_least`` response frames came; returns how many did (one read may bring
    more). Raises on an error frame or a closed connection."""
    count = 0
    while count < at_least:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("the broker closed the connection")
        for frame in decoder.feed(data):
            if frame.frame_type != 0:
                raise RuntimeError(f"broker answered {frame.data!r}")
            if frame.data != b"_heartbeat_":
                count += 1
    return count


def _publish(sock: socket.socket, payloads: list[bytes], pipeline: int) -> None:
    decoder = FrameDecoder()
    sent = answered = 0
    while answered < len(payloads):
        while sent < len(payloads) and sent - answered < pipeline:
            sock.sendall(payloads[sent])
            sent += 1
        answered += _read_answers(sock, decoder)


def _start(program: list[str] | None, data: Path, *flags: str) -> BrokerProcess:
    return BrokerProcess(data, *flags, program=program).start()


def throughput(program: list[str] | None, flags: list[str], keyed: bool, messages: int, connections: int,
               pipeline: int, batch: int) -> float:
    """Messages a second that one fresh broker accepts."""
    per = messages // connections
    payloads = [_payloads(per, keyed, c, batch) for c in range(connections)]
    with tempfile.TemporaryDirectory() as tmp:
        broker = _start(program, Path(tmp) / "data", *flags)
        try:
            elapsed = publish_all([_connect(broker.tcp, keyed) for _ in range(connections)], payloads, pipeline)
        finally:
            broker.kill()
    return per * connections / elapsed


def publish_all(socks: list[socket.socket], payloads: list[list[bytes]], pipeline: int) -> float:
    """Send each connection's payloads from its own thread, all at once; the seconds until every
    one is answered. The sockets are closed."""
    threads = [threading.Thread(target=_publish, args=(s, p, pipeline)) for s, p in zip(socks, payloads)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    for sock in socks:
        sock.close()
    return elapsed


def memory(program: list[str] | None, keyed: bool, count: int) -> int:
    """The resident set size of a broker that was given ``count`` messages, keyed or not."""
    with tempfile.TemporaryDirectory() as tmp:
        broker = _start(program, Path(tmp) / "data")
        try:
            sock = _connect(broker.tcp, keyed)
            for start in range(0, count, 100 * BATCH):  # built a piece at a time: bounded client memory
                _publish(sock, _payloads(min(100 * BATCH, count - start), keyed, start), 8)
            sock.close()
            return broker.rss()
        finally:
            broker.kill()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=400_000, help="messages per throughput run")
    parser.add_argument("--connections", type=int, default=2)
    parser.add_argument("--pipeline", type=int, default=8, help="MPUBs each connection keeps on the wire")
    parser.add_argument("--keys", type=int, default=1_000_000, help="keys for the memory measurement (0: skip it)")
    parser.add_argument("--broker-cmd", help="the broker's command (default: python -m broker of this checkout)")
    parser.add_argument("--flags", action="append", default=[], help="a flag for the broker (repeatable)")
    parser.add_argument("--batch", type=int, default=BATCH, help="messages per MPUB (1: PUB)")
    args = parser.parse_args(argv)
    program = shlex.split(args.broker_cmd) if args.broker_cmd else None
    rates: dict[bool, list[float]] = {False: [], True: []}
    for round_ in range(args.rounds):
        for keyed in ((False, True) if round_ % 2 == 0 else (True, False)):
            rate = throughput(program, args.flags, keyed, args.messages, args.connections, args.pipeline, args.batch)
            rates[keyed].append(rate)
            print(f"round {round_ + 1} {'keyed' if keyed else 'unkeyed'}: {rate:,.0f} msgs/s", file=sys.stderr)
    plain, keyed_rate = statistics.median(rates[False]), statistics.median(rates[True])
    command = "PUB" if args.batch == 1 else f"MPUB {args.batch}"
    print(f"{command} x {len(BODY)} B {' '.join(args.flags)}, {args.connections} connections, "
          f"{args.pipeline} in flight each, median of {args.rounds}:")
    print(f"  unkeyed {plain:,.0f} msgs/s   keyed {keyed_rate:,.0f} msgs/s   keyed/unkeyed {keyed_rate / plain:.2f}")
    if args.keys:
        without = memory(program, False, args.keys)
        with_keys = memory(program, True, args.keys)
        print(f"RSS after {args.keys:,} messages: unkeyed {without / 2**20:.0f} MB, keyed {with_keys / 2**20:.0f} MB: "
              f"{(with_keys - without) / args.keys:.0f} B per remembered key")


if __name__ == "__main__":
    main()
