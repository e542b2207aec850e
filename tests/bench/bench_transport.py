"""Benchmark: publish and consume throughput over plain TCP, TLS, snappy, deflate and TLS + snappy,
pynsqd against nsq 1.3.0's nsqd, side by side.

Both brokers run as processes with the same certificate; each round measures every transport
on nsqd, then on pynsqd (alternating, so both see the same machine load), with one Python
client (Trio, the client side of tests/support/transports.py: ssl, python-snappy, zlib):

* publish: ``--seconds`` of MPUBs of ``--batch`` bodies of ``--size`` bytes, ``--window``
  MPUBs in flight; messages acknowledged per second;
* consume: the messages just published, read with RDY ``--rdy`` and FIN'd in batches;
  messages per second.

The client costs the same on both sides, so compare within a line; the ratio column is
pynsqd / nsqd (best of ``--rounds``). Numbers on a busy machine are provisional.

Usage (from the repository root)::

    python -m tests.bench.bench_transport                   # 3 rounds, 2 s per case, 200 B bodies
    python -m tests.bench.bench_transport --rounds 5 --seconds 5 --size 1000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import trio

from broker.protocol import FRAME_TYPE_MESSAGE, FrameDecoder, encode_fin, encode_mpub, encode_rdy, encode_sub
from tests.support.paths import nsq_bin
from tests.support.processes import BrokerProcess
from tests.support.transports import DeflateStream, SnappyStream, make_certificates, negotiate, upgrade_tls
from tests.support.v2client import connect

TRANSPORTS = {
    "plain": {},
    "tls": {"tls_v1": True},
    "snappy": {"snappy": True},
    "deflate": {"deflate": True, "deflate_level": 6},
    "tls+snappy": {"tls_v1": True, "snappy": True},
}


async def open_client(address, certs, features: dict):
    client = await connect(address, timeout=30)
    await negotiate(client, **features)
    if features.get("tls_v1"):
        await upgrade_tls(client, certs.client_context())
    if features.get("snappy"):
        client.stream = SnappyStream(client.stream)
        await client.expect_response(b"OK")
    if features.get("deflate"):
        client.stream = DeflateStream(client.stream, features["deflate_level"])
        await client.expect_response(b"OK")
    return client


async def publish(address, certs, features, topic, args) -> tuple[int, float]:
    client = await open_client(address, certs, features)
    body = b"x" * args.size
    command = encode_mpub(topic, [body] * args.batch)
    sent = 0
    started = time.perf_counter()
    deadline = started + args.seconds
    while time.perf_counter() < deadline:
        await client.send(command * args.window)
        for _ in range(args.window):
            await client.expect_response(b"OK")
        sent += args.batch * args.window
    elapsed = time.perf_counter() - started
    await client.aclose()
    return sent, sent / elapsed


async def consume(address, certs, features, topic, expected: int, args) -> float:
    client = await open_client(address, certs, features)
    await client.send(encode_sub(topic, "bench"))
    await client.expect_response(b"OK")
    await client.send(encode_rdy(args.rdy))
    decoder = FrameDecoder()
    received = 0
    started = time.perf_counter()
    with trio.fail_after(300):
        while received < expected:
            data = await client.stream.receive_some(256 * 1024)
            fins = [encode_fin(frame.data[10:26]) for frame in decoder.feed(data)
                    if frame.frame_type == FRAME_TYPE_MESSAGE]
            received += len(fins)
            if fins:
                await client.send(b"".join(fins))
    elapsed = time.perf_counter() - started
    await client.aclose()
    return received / elapsed


async def run(args) -> None:
    if nsq_bin() is None:
        sys.exit("nsq 1.3.0's nsqd is needed (shared/nsq/bin or $NSQ_BIN)")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        certs = make_certificates(folder / "certs")
        flags = certs.broker_flags("--max-deflate-level=9")
        brokers = {
            "nsqd": BrokerProcess(folder / "nsqd", *flags, program=[str(nsq_bin() / "nsqd")]),
            "pynsqd": BrokerProcess(folder / "pynsqd", *flags),
        }
        best: dict[tuple[str, str, str], float] = {}
        try:
            for broker in brokers.values():
                broker.start()
            for round_number in range(args.rounds):
                for transport, features in TRANSPORTS.items():
                    for name, broker in brokers.items():
                        topic = f"bench-{transport.replace('+', '-')}-{round_number}"
                        sent, pub_rate = await publish(broker.tcp, certs, features, topic, args)
                        sub_rate = await consume(broker.tcp, certs, features, topic, sent, args)
                        for kind, rate in (("publish", pub_rate), ("consume", sub_rate)):
                            key = (transport, kind, name)
                            best[key] = max(best.get(key, 0.0), rate)
                print(f"round {round_number + 1}/{args.rounds} done", file=sys.stderr)
        finally:
            for broker in brokers.values():
                broker.kill()
    print(f"{args.size} B bodies, MPUB {args.batch} x {args.window} in flight, RDY {args.rdy}; "
          f"best of {args.rounds} x {args.seconds} s; messages/s")
    print(f"{'transport':<12} {'op':<8} {'nsqd':>10} {'pynsqd':>10} {'ratio':>6} {'pynsqd vs plain':>16}")
    for transport in TRANSPORTS:
        for kind in ("publish", "consume"):
            nsqd, pynsqd = best[(transport, kind, "nsqd")], best[(transport, kind, "pynsqd")]
            plain = best[("plain", kind, "pynsqd")]
            print(f"{transport:<12} {kind:<8} {nsqd:>10.0f} {pynsqd:>10.0f} {pynsqd / nsqd:>6.2f} "
                  f"{pynsqd / plain:>16.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--window", type=int, default=4)
    parser.add_argument("--rdy", type=int, default=1000)
    trio.run(run, parser.parse_args())


if __name__ == "__main__":
    main()
