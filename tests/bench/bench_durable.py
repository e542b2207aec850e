"""Publish throughput with and without ``--durable``, for 1, 8 and 32 concurrent publishers.

Each run starts a fresh broker (``python -m broker`` on a temporary data path,
one topic with one channel that nobody reads, so every message stays queued)
and drives it with ``python -m broker.bench writer``: ``--connections N``
publishers, each sending one ``PUB`` (or one ``MPUB`` with ``--batch-size``)
and waiting for its ``OK`` before the next, as NSQ clients do.

Without ``--durable`` an ``OK`` means "queued in memory"; with it, "on stable
storage", so every publisher waits for an fsync. Group commit lets all the
publishers waiting at the same moment share one fsync, so durable throughput
should grow with the number of publishers, while one publisher is bounded by
the disk's fsync latency. The last column compares the durable publishes a
second with the fsyncs this disk completes a second (the median of 500 writes
and fdatasyncs of a small record, measured at the start of the same run).

Usage (from the repository root)::

    python -m tests.bench.bench_durable                 # 5 s per run
    python -m tests.bench.bench_durable --runfor 10s --publishers 1 8 32 64
    python -m tests.bench.bench_durable --batch-size 20 --json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support.processes import stop_process

ROOT = Path(__file__).resolve().parents[2]
LISTENING = re.compile(rb"(TCP|HTTP): listening on \[?([^\s\]]*)\]?:(\d+)")
START_TIMEOUT = 30.0
TOPIC = "bench_durable"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _fsync_latency_ms(directory: Path, rounds: int = 500) -> float:
    """Median latency of write + fdatasync of a small record in ``directory``."""
    path = directory / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    samples = []
    try:
        for _ in range(rounds):
            start = time.perf_counter()
            os.write(fd, b"x" * 256)
            os.fdatasync(fd)
            samples.append(time.perf_counter() - start)
    finally:
        os.close(fd)
        path.unlink()
    samples.sort()
    return samples[len(samples) // 2] * 1000


class Broker:
    """A broker process for one run; owns the process."""

    def __init__(self, data_path: Path, flags: list[str]):
        self.data_path = data_path
        self.flags = flags
        self.proc: subprocess.Popen | None = None
        self.log = data_path.parent / f"{data_path.name}.log"

    def __enter__(self) -> Broker:
        self.data_path.mkdir(parents=True)
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "broker", f"--data-path={self.data_path}",
                 "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", *self.flags],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=ROOT, env=_env())
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            found = {m.group(1): (m.group(2).decode(), int(m.group(3))) for m in LISTENING.finditer(self.log.read_bytes())}
            if b"TCP" in found and b"HTTP" in found:
                self.tcp, self.http = found[b"TCP"], found[b"HTTP"]
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.__exit__()
        raise RuntimeError(f"broker did not start:\n{self.log.read_text(errors='replace')[-2000:]}")

    def create_channel(self) -> None:
        """A channel nobody reads: messages go through the topic into it and stay."""
        import urllib.request

        for path in (f"/topic/create?topic={TOPIC}", f"/channel/create?topic={TOPIC}&channel=idle"):
            request = urllib.request.Request(f"http://{self.http[0]}:{self.http[1]}{path}", method="POST")
            urllib.request.urlopen(request, timeout=10).read()

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            stop_process(self.proc, 60)


def run_writer(address: tuple[str, int], connections: int, runfor: str, batch_size: int, size: int) -> dict:
    command = [sys.executable, "-m", "broker.bench", "writer", f"--nsqd-tcp-address={address[0]}:{address[1]}",
               f"--topic={TOPIC}", f"--connections={connections}", f"--runfor={runfor}",
               f"--batch-size={batch_size}", f"--size={size}", "--progress=0", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"bench writer failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runfor", default="5s", help="duration of each run (default 5s)")
    parser.add_argument("--publishers", type=int, nargs="+", default=[1, 8, 32],
                        help="concurrent publishers per run (default 1 8 32)")
    parser.add_argument("--batch-size", type=int, default=1, help="messages per publish; 1 = PUB (default)")
    parser.add_argument("--size", type=int, default=200, help="message body bytes (default 200)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)

    rows = []
    with tempfile.TemporaryDirectory(prefix="pynsqd-bench-durable-") as tmp:
        fsync_ms = _fsync_latency_ms(Path(tmp))
        for publishers in args.publishers:
            for mode, flags in (("memory", []), ("durable", ["--durable"])):
                data = Path(tmp) / f"{mode}-{publishers}"
                with Broker(data, flags) as broker:
                    broker.create_channel()
                    result = run_writer(broker.tcp, publishers, args.runfor, args.batch_size, args.size)
                rows.append({"mode": mode, "publishers": publishers, "msgs_per_s": result["msgs_per_s"],
                             "latency_ms": result.get("latency_ms"), "messages": result["messages"]})
    if args.json:
        print(json.dumps({"fsync_ms": fsync_ms, "batch_size": args.batch_size, "runs": rows}, indent=2))
        return 0
    verb = "PUB" if args.batch_size == 1 else f"MPUB x{args.batch_size}"
    fsyncs = 1000 / fsync_ms
    print(f"# {verb}, {args.size} B bodies, {args.runfor} per run; median write+fdatasync here: {fsync_ms:.3f} ms "
          f"({fsyncs:,.0f} a second)")
    print("| publishers | without --durable msgs/s | --durable msgs/s | durable / memory | durable publishes / fsyncs |")
    print("|-----------:|-------------------------:|-----------------:|-----------------:|---------------------------:|")
    by_key = {(r["mode"], r["publishers"]): r for r in rows}
    for publishers in args.publishers:
        memory = by_key[("memory", publishers)]["msgs_per_s"]
        durable = by_key[("durable", publishers)]["msgs_per_s"]
        ratio = durable / args.batch_size / fsyncs
        print(f"| {publishers:>10} | {memory:>24,.0f} | {durable:>16,.0f} | {durable / memory:>16.2f} | {ratio:>26.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
