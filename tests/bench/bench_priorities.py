"""Priorities: MPUB write and drain rates of a prioritised topic against a plain one.

Fresh brokers (``python -m broker`` on a temporary data path) with a topic and its channel
created first. Each round runs both modes on their own broker, alternating which goes
first: *plain* publishes without priorities (the FIFO path every topic without priorities
takes), *prioritised* publishes the same messages each with one of ``--levels`` priorities
(round robin), which makes the channel rank.

* **write**: ``--messages`` 100-byte messages MPUBed 200 at a time over ``--connections``
  connections (each keeping ``--pipeline`` MPUBs on the wire), nobody reading: the
  channel keeps ``--mem-queue-size`` in memory and spills the rest;
* **drain**: then one consumer (RDY ``--rdy``, a FIN for every message) reads them all
  (``--drain`` of them, when given): a backlog on disk, which a ranked channel sweeps (see
  ``broker.core.ranking``). Meanwhile a second connection keeps one ``PUB`` to another
  topic in flight at a time, every few milliseconds: its worst round trip is the longest
  the broker kept every client waiting (*stall*; a sweep does bounded work per turn);
* **live**: on a fresh broker, the same publishers while the consumer reads, so the
  backlog stays small (how a channel that keeps up runs); ``--no-live`` skips it.

``--before DIR`` runs every broker a second time with the code of the checkout ``DIR``
(``python -m broker`` there), in the same rounds, and prints its table beside this one's.

Usage (from the repository root)::

    python -m tests.bench.bench_priorities                    # 3 rounds, 200,000 messages, 10 levels
    python -m tests.bench.bench_priorities --rounds 1 --messages 50000 --flags=--mem-queue-size=1000
    python -m tests.bench.bench_priorities --rounds 1 --messages 1000000 --drain 100000 --no-live \\
        --flags=--mem-queue-size=10000 --before ../main     # the stall of a sweep of 1 M, before and after
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from broker.protocol import (
    MAGIC_V2,
    FrameDecoder,
    encode_fin,
    encode_identify,
    encode_mpub,
    encode_pub,
    encode_rdy,
    encode_sub,
)
from broker.protocol.frames import FRAME_TYPE_MESSAGE, decode_message
from broker.protocol.priorities import prefix_priority
from tests.bench.bench_keys import _read_answers, publish_all
from tests.support.processes import BrokerProcess

TOPIC = "bench_priorities"
CHANNEL = "c"
#: The topic of the stall probe's PUBs (nobody reads it).
PROBE_TOPIC = "bench_probe"
#: Seconds between the probe's round trips (so it costs the broker little).
PROBE_PAUSE = 0.005
BATCH = 200
BODY = b"b" * 100
MODES = ("plain", "prioritised")


def _payloads(count: int, levels: int) -> list[bytes]:
    """One connection's MPUBs; with ``levels`` each message has priority ``n % levels`` (0: none)."""
    out = []
    for start in range(0, count, BATCH):
        n = min(count, start + BATCH) - start
        if levels:
            messages = [prefix_priority((start + i) % levels, BODY) for i in range(n)]
        else:
            messages = [BODY] * n
        out.append(encode_mpub(TOPIC, messages))
    return out


def _connect(address: tuple[str, int], prioritised: bool) -> socket.socket:
    sock = socket.create_connection(address)
    sock.sendall(MAGIC_V2 + encode_identify({"feature_negotiation": True, "priorities": prioritised}))
    _read_answers(sock, FrameDecoder(), 1)
    return sock


def _consume(address: tuple[str, int], count: int, rdy: int, ready: threading.Event | None = None) -> None:
    """Read ``count`` messages on one connection, FINning each (the FINs of one read sent at once)."""
    sock = socket.create_connection(address)
    sock.sendall(MAGIC_V2 + encode_sub(TOPIC, CHANNEL))
    decoder = FrameDecoder()
    _read_answers(sock, decoder, 1)
    sock.sendall(encode_rdy(rdy))
    if ready is not None:
        ready.set()
    got = 0
    while got < count:
        data = sock.recv(1 << 20)
        if not data:
            raise ConnectionError("the broker closed the connection")
        fins = []
        for frame in decoder.feed(data):
            if frame.frame_type == FRAME_TYPE_MESSAGE:
                fins.append(encode_fin(decode_message(frame.data).id))
        got += len(fins)
        if fins:
            sock.sendall(b"".join(fins))
    sock.close()


def _probe(address: tuple[str, int], stop: threading.Event, trips: list[float]) -> None:
    """One PUB at a time until ``stop`` is set, each round trip's seconds appended to ``trips``."""
    sock = socket.create_connection(address)
    sock.sendall(MAGIC_V2)
    decoder = FrameDecoder()
    pub = encode_pub(PROBE_TOPIC, BODY)
    while not stop.is_set():
        start = time.perf_counter()
        sock.sendall(pub)
        _read_answers(sock, decoder, 1)
        trips.append(time.perf_counter() - start)
        time.sleep(PROBE_PAUSE)
    sock.close()


def _start(data: Path, flags: list[str], cwd: Path | None) -> BrokerProcess:
    broker = BrokerProcess(data, *flags, cwd=cwd).start()
    host, port = broker.http
    for path in (f"/topic/create?topic={TOPIC}", f"/channel/create?topic={TOPIC}&channel={CHANNEL}"):
        urllib.request.urlopen(urllib.request.Request(f"http://{host}:{port}{path}", method="POST"), timeout=10)
    return broker


def _write(broker: BrokerProcess, payloads: list[list[bytes]], prioritised: bool, pipeline: int) -> float:
    return publish_all([_connect(broker.tcp, prioritised) for _ in payloads], payloads, pipeline)


def run(mode: str, args: argparse.Namespace, cwd: Path | None = None) -> dict[str, float]:
    """Rates (messages a second) of one mode: write, drain, live; and the stall (seconds) while
    draining. ``cwd``: the checkout whose broker runs (None: this one)."""
    levels = args.levels if mode == "prioritised" else 0
    per = args.messages // args.connections
    total = per * args.connections
    drain = min(total, args.drain or total)
    payloads = [_payloads(per, levels) for _ in range(args.connections)]
    rates = {}
    with tempfile.TemporaryDirectory() as tmp:
        broker = _start(Path(tmp) / "a", args.flags, cwd)
        try:
            rates["write"] = total / _write(broker, payloads, bool(levels), args.pipeline)
            stop = threading.Event()
            trips: list[float] = []
            prober = threading.Thread(target=_probe, args=(broker.tcp, stop, trips))
            prober.start()
            start = time.perf_counter()
            try:
                _consume(broker.tcp, drain, args.rdy)
            finally:
                stop.set()
                prober.join()
            rates["drain"] = drain / (time.perf_counter() - start)
            rates["stall"] = max(trips)
        finally:
            broker.kill()
        if args.no_live:
            return rates
        broker = _start(Path(tmp) / "b", args.flags, cwd)
        try:
            subscribed = threading.Event()
            reader = threading.Thread(target=_consume, args=(broker.tcp, total, args.rdy, subscribed))
            reader.start()
            subscribed.wait(30)
            start = time.perf_counter()
            _write(broker, payloads, bool(levels), args.pipeline)
            reader.join()
            rates["live"] = total / (time.perf_counter() - start)
        finally:
            broker.kill()
    return rates


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--levels", type=int, default=10, help="priorities of the prioritised mode")
    parser.add_argument("--connections", type=int, default=2)
    parser.add_argument("--pipeline", type=int, default=8, help="MPUBs each connection keeps on the wire")
    parser.add_argument("--rdy", type=int, default=2500, help="the consumer's RDY")
    parser.add_argument("--flags", action="append", default=[], help="a flag for the broker (repeatable)")
    parser.add_argument("--drain", type=int, default=0, help="messages the consumer drains (0: all)")
    parser.add_argument("--no-live", action="store_true", help="skip the live phase")
    parser.add_argument("--before", type=Path, help="a checkout whose brokers run too, side by side")
    args = parser.parse_args(argv)
    codes: list[tuple[str, Path | None]] = [("this checkout", None)]
    if args.before is not None:
        codes.append((str(args.before), args.before.resolve()))
    results: dict[tuple[str, str], dict[str, list[float]]] = {(code, m): {} for code, _ in codes for m in MODES}
    for round_ in range(args.rounds):
        for code, cwd in (codes if round_ % 2 == 0 else codes[::-1]):
            for mode in (MODES if round_ % 2 == 0 else MODES[::-1]):
                rates = run(mode, args, cwd)
                for key, rate in rates.items():
                    results[code, mode].setdefault(key, []).append(rate)
                print(f"round {round_ + 1} {code} {mode}: "
                      + "  ".join(f"{k} {v * 1000:,.0f} ms" if k == "stall" else f"{k} {v:,.0f}/s"
                                  for k, v in rates.items()), file=sys.stderr)
    drained = f", {args.drain:,} drained" if args.drain else ""
    print(f"MPUB {BATCH} x {len(BODY)} B, {args.messages:,} messages{drained}, {args.levels} levels, "
          f"{' '.join(args.flags) or 'default flags'}, median of {args.rounds}:")
    for code, _ in codes:
        if len(codes) > 1:
            print(f"  {code}:")
        print(f"  {'':6} {'plain msgs/s':>14} {'prioritised':>14} {'ratio':>6}")
        plain, ranked = results[code, "plain"], results[code, "prioritised"]
        for key in ("write", "drain", "live"):
            if key in plain:
                low, high = statistics.median(plain[key]), statistics.median(ranked[key])
                print(f"  {key:6} {low:>14,.0f} {high:>14,.0f} {high / low:>6.2f}")
        low, high = statistics.median(plain["stall"]), statistics.median(ranked["stall"])
        print(f"  {'stall':6} {low * 1000:>11,.0f} ms {high * 1000:>11,.0f} ms   "
              "(the worst PUB round trip of another client while draining)")


if __name__ == "__main__":
    main()
