"""Load on one ``pynsqd`` process: idle connections, many consumers, a stuck consumer.

Each scenario starts a fresh broker (``python -m broker`` on a temporary data
path) and drives it from this process with Trio:

- ``idle``: N connections IDENTIFY with a heartbeat interval and then only
  answer each ``_heartbeat_`` with ``NOP``. The run holds them until every
  connection has received ``--hold`` heartbeats and reports the broker's RSS
  before, once connected and after holding them, and any connection it closed.
- ``consumers``: N consumers on one channel with ``RDY --rdy`` each; a producer
  MPUBs ``--messages`` bodies of ``--size`` bytes; every consumer FINs what it
  gets. Reports msgs/s from the first publish to the last message received,
  how many consumers got messages, duplicates and the broker's peak RSS.
- ``stuck``: ``--healthy`` consumers drain a backlog of ``--messages`` bodies of
  ``--size`` bytes, once alone and once beside a consumer that subscribes with
  RDY 2500 first and never reads. Reports both drain rates, their ratio, the
  broker's peak RSS in each, and whether every message reached a healthy
  consumer exactly once (the stuck consumer's messages time out after its
  ``msg_timeout`` of 1 s and go to the others).

Usage (from the repository root)::

    python -m tests.bench.bench_load                          # all three, full size
    python -m tests.bench.bench_load idle --connections 10000 --heartbeat-ms 5000
    python -m tests.bench.bench_load consumers --consumers 1000 --messages 100000
    python -m tests.bench.bench_load stuck --healthy 4 --messages 20000 --size 10000
    python -m tests.bench.bench_load idle --connections 500 --json   # what CI runs, smaller

Thousands of connections need as many file descriptors in this process and in
the broker (which inherits the limit): the soft ``ulimit -n`` is raised to the
hard limit at start, and a run that still does not fit says so.
"""

from __future__ import annotations

import argparse
import collections
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import trio

from broker.protocol import (
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    decode_message,
    encode_fin,
    encode_mpub,
    encode_nop,
)
from tests.support.http_client import request
from tests.support.processes import BrokerProcess
from tests.support.v2client import connect, subscriber

#: Connections opened at once: stays under the listen backlog (somaxconn, 4096 by default).
CONNECT_BATCH = 500
#: Bodies per MPUB; with 10 KB bodies still under the default --max-body-size of 5 MB.
MPUB_COUNT = 200
HEARTBEAT = b"_heartbeat_"
TOPIC = "load"
SCENARIOS = ("idle", "consumers", "stuck")
STUCK_ID = "stuck"
#: descriptors besides the connections: log, data files, listeners, the interpreter's own
FD_RESERVE = 100
#: seconds a whole scenario may take before it is reported as stuck
SCENARIO_TIMEOUT = 600


def raise_fd_limit() -> int:
    """Raise the soft limit on open files to the hard limit; returns the limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class _Target:
    """A broker process as :func:`tests.support.v2client.subscriber` takes it (``.addresses.tcp``)."""

    def __init__(self, proc: BrokerProcess):
        self.addresses = proc


def _bodies(n: int, size: int) -> list[bytes]:
    return [b"%09d" % i + b"x" * max(0, size - 9) for i in range(n)]


async def _publish(proc: BrokerProcess, bodies: list[bytes]) -> None:
    producer = await connect(proc.tcp, timeout=60)
    for start in range(0, len(bodies), MPUB_COUNT):
        await producer.send(encode_mpub(TOPIC, bodies[start:start + MPUB_COUNT]))
        await producer.expect_response()
    await producer.aclose()


# ---------------------------------------------------------------- idle


async def idle(proc: BrokerProcess, connections: int, heartbeat_ms: int, hold: int) -> dict:
    """``connections`` idle clients answer heartbeats until each has seen ``hold`` of them."""
    rss_before = proc.rss()
    counts = [0] * connections
    closed = 0
    done = 0  # connections that saw ``hold`` heartbeats or were closed
    all_done = trio.Event()

    def finished() -> None:
        nonlocal done
        done += 1
        if done == connections:
            all_done.set()

    async def one(i: int, task_status=trio.TASK_STATUS_IGNORED) -> None:
        nonlocal closed
        client = await connect(proc.tcp, timeout=heartbeat_ms / 1000 * 3)
        await client.identify(heartbeat_interval=heartbeat_ms)
        task_status.started()
        try:
            while True:
                frame = await client.read_frame(skip_heartbeats=False)
                if (frame.frame_type, frame.data) != (FRAME_TYPE_RESPONSE, HEARTBEAT):
                    raise AssertionError(f"unexpected frame {frame}")
                counts[i] += 1
                if counts[i] == hold:
                    finished()
                await client.send(encode_nop())
        except (EOFError, trio.BrokenResourceError):
            closed += 1
            if counts[i] < hold:
                finished()
        finally:
            with trio.CancelScope(shield=True):
                await client.aclose()

    start = time.monotonic()
    async with trio.open_nursery() as nursery:
        for first in range(0, connections, CONNECT_BATCH):
            async with trio.open_nursery() as batch:
                for i in range(first, min(first + CONNECT_BATCH, connections)):
                    batch.start_soon(nursery.start, one, i)
        connect_s = time.monotonic() - start
        rss_connected = proc.rss()
        await all_done.wait()
        rss_held = proc.rss()
        nursery.cancel_scope.cancel()
    return {
        "scenario": "idle",
        "connections": connections,
        "heartbeat_ms": heartbeat_ms,
        "heartbeats_each": hold,
        "connect_s": round(connect_s, 2),
        "closed_by_server": closed,
        "min_heartbeats": min(counts),
        "rss_before_mb": _mb(rss_before),
        "rss_connected_mb": _mb(rss_connected),
        "rss_held_mb": _mb(rss_held),
        "rss_per_connection_kb": round((rss_held - rss_before) / connections / 1024, 1),
    }


def _mb(n: int) -> float:
    return round(n / 2**20, 1)


# ---------------------------------------------------------------- consumers


class _Tally:
    """Bodies received by a group of consumers, and by which consumer."""

    def __init__(self, expected: int):
        self.expected = expected
        self.bodies: collections.Counter[bytes] = collections.Counter()
        self.per_consumer: collections.Counter[int] = collections.Counter()
        self.received = 0
        self.complete = trio.Event()
        self.last = 0.0

    def add(self, consumer: int, body: bytes) -> None:
        self.bodies[body] += 1
        self.per_consumer[consumer] += 1
        self.received += 1
        self.last = time.monotonic()
        if self.received >= self.expected:
            self.complete.set()


async def _consume(proc: BrokerProcess, number: int, rdy: int, tally: _Tally,
                   task_status=trio.TASK_STATUS_IGNORED, **identify) -> None:
    """One consumer that FINs every message; started once subscribed with its RDY sent."""
    client = await subscriber(_Target(proc), topic=TOPIC, channel="c", rdy=rdy, **identify)
    client.timeout = SCENARIO_TIMEOUT
    task_status.started()
    try:
        while True:
            frame = await client.read_frame()
            if frame.frame_type != FRAME_TYPE_MESSAGE:
                raise AssertionError(f"unexpected frame {frame}")
            msg = decode_message(frame.data)
            tally.add(number, msg.body)
            await client.send(encode_fin(msg.id))
    finally:
        with trio.CancelScope(shield=True):
            await client.aclose()


async def consumers(proc: BrokerProcess, count: int, rdy: int, messages: int, size: int) -> dict:
    """``count`` consumers on one channel share ``messages`` published while they consume."""
    bodies = _bodies(messages, size)
    tally = _Tally(messages)
    async with trio.open_nursery() as nursery:
        for first in range(0, count, CONNECT_BATCH):
            async with trio.open_nursery() as batch:
                for i in range(first, min(first + CONNECT_BATCH, count)):
                    batch.start_soon(nursery.start, _consume, proc, i, rdy, tally)
        start = time.monotonic()
        await _publish(proc, bodies)
        await tally.complete.wait()
        nursery.cancel_scope.cancel()
    elapsed = tally.last - start
    return {
        "scenario": "consumers",
        "consumers": count,
        "rdy": rdy,
        "messages": messages,
        "size": size,
        "received": tally.received,
        "distinct": len(tally.bodies),
        "duplicates": tally.received - len(tally.bodies),
        "consumers_served": len(tally.per_consumer),
        "msgs_per_s": round(messages / elapsed) if elapsed > 0 else None,
        "rss_peak_mb": _mb(proc.rss("VmHWM")),
    }


# ---------------------------------------------------------------- stuck


async def _backlog_run(proc: BrokerProcess, healthy: int, bodies: list[bytes], with_stuck: bool) -> dict:
    """Healthy consumers drain a backlog of ``bodies``, with a stuck consumer beside them or not."""
    await request(proc.http, "POST", f"/topic/create?topic={TOPIC}")
    await request(proc.http, "POST", f"/channel/create?topic={TOPIC}&channel=c")
    await _publish(proc, bodies)
    rss_before = proc.rss()
    tally = _Tally(len(bodies))
    stuck = None
    if with_stuck:
        stuck = await subscriber(_Target(proc), topic=TOPIC, channel="c", rdy=2500, msg_timeout=1000,
                                 client_id=STUCK_ID)
    async with trio.open_nursery() as nursery:
        start = time.monotonic()
        for i in range(healthy):
            await nursery.start(_consume, proc, i, 100, tally)
        await tally.complete.wait()
        nursery.cancel_scope.cancel()
    stats = (await request(proc.http, "GET", f"/stats?format=json&topic={TOPIC}")).json()
    clients = stats["topics"][0]["channels"][0]["clients"]
    stuck_sent = sum(c["message_count"] for c in clients if c["client_id"] == STUCK_ID)
    if stuck is not None:
        await stuck.aclose()
    elapsed = tally.last - start
    return {
        "received": tally.received,
        "distinct": len(tally.bodies),
        "msgs_per_s": round(len(bodies) / elapsed) if elapsed > 0 else None,
        "stuck_was_sent": stuck_sent,
        "rss_before_mb": _mb(rss_before),
        "rss_peak_mb": _mb(proc.rss("VmHWM")),
        "rss_growth_mb": _mb(proc.rss("VmHWM") - rss_before),
    }


async def stuck(make_broker, healthy: int, messages: int, size: int) -> dict:
    """The drain rate of healthy consumers alone and beside a consumer that never reads."""
    bodies = _bodies(messages, size)
    runs = {}
    for name, with_stuck in (("alone", False), ("beside_stuck", True)):
        proc = make_broker()
        try:
            runs[name] = await _backlog_run(proc, healthy, bodies, with_stuck)
        finally:
            proc.kill()
    alone, beside = runs["alone"]["msgs_per_s"], runs["beside_stuck"]["msgs_per_s"]
    return {
        "scenario": "stuck",
        "healthy": healthy,
        "messages": messages,
        "size": size,
        **{f"{name}_{key}": value for name, run in runs.items() for key, value in run.items()},
        "ratio": round(beside / alone, 2) if alone and beside else None,
    }


# ---------------------------------------------------------------- main


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("scenarios", nargs="*", metavar="{idle,consumers,stuck}",
                   help="which to run (default: all three)")
    p.add_argument("--connections", type=int, default=10_000, help="idle: connections (default 10000)")
    p.add_argument("--heartbeat-ms", type=int, default=5000, help="idle: IDENTIFY heartbeat_interval (default 5000)")
    p.add_argument("--hold", type=int, default=2, help="idle: heartbeats every connection must see (default 2)")
    p.add_argument("--consumers", type=int, default=1000, help="consumers: how many (default 1000)")
    p.add_argument("--rdy", type=int, default=1, help="consumers: RDY each (default 1)")
    p.add_argument("--healthy", type=int, default=4, help="stuck: healthy consumers (default 4)")
    p.add_argument("--messages", type=int, default=None,
                   help="consumers / stuck: messages (default 100000 / 20000)")
    p.add_argument("--size", type=int, default=None, help="body bytes (default 100 / 10000)")
    p.add_argument("--json", action="store_true", help="print one JSON object per scenario")
    opts = p.parse_args(argv)
    unknown = set(opts.scenarios) - set(SCENARIOS)
    if unknown:
        p.error(f"unknown scenario {', '.join(sorted(unknown))}: choose from {', '.join(SCENARIOS)}")
    opts.scenarios = opts.scenarios or list(SCENARIOS)
    return opts


async def _run(opts: argparse.Namespace, workdir: Path) -> list[dict]:
    runs = 0

    def make_broker() -> BrokerProcess:
        nonlocal runs
        runs += 1
        return BrokerProcess(workdir / f"data{runs}").start()

    results = []
    for scenario in opts.scenarios:
        with trio.fail_after(SCENARIO_TIMEOUT):
            if scenario == "stuck":
                results.append(await stuck(make_broker, opts.healthy, opts.messages or 20_000, opts.size or 10_000))
                continue
            proc = make_broker()
            try:
                if scenario == "idle":
                    results.append(await idle(proc, opts.connections, opts.heartbeat_ms, opts.hold))
                else:
                    results.append(await consumers(proc, opts.consumers, opts.rdy, opts.messages or 100_000,
                                                   opts.size or 100))
            finally:
                proc.kill()
    return results


def main(argv: list[str] | None = None) -> int:
    opts = _parse(sys.argv[1:] if argv is None else argv)
    limit = raise_fd_limit()
    # this process and the broker (which inherits the limit) each hold one descriptor a connection
    needed = max(opts.connections if "idle" in opts.scenarios else 0,
                 opts.consumers if "consumers" in opts.scenarios else 0) + FD_RESERVE
    if limit < needed:
        print(f"ulimit -n is {limit} (hard limit): the connections need about {needed}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="bench_load") as tmp:
        results = trio.run(_run, opts, Path(tmp))
    for result in results:
        if opts.json:
            print(json.dumps(result))
        else:
            print(" ".join(f"{key}={value}" for key, value in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
