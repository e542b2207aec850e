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

With ``--baseline DIR`` (another checkout, e.g. ``git worktree add --detach /tmp/old
main``) every durable run is also made with that checkout's broker, alternating with
this one's, and the table compares the two side by side; ``--rounds N`` repeats every
run and reports medians (the fsync probe too).

Usage (from the repository root)::

    python -m tests.bench.bench_durable                 # 5 s per run
    python -m tests.bench.bench_durable --runfor 10s --publishers 1 8 32 64
    python -m tests.bench.bench_durable --batch-size 20 --json
    python -m tests.bench.bench_durable --publishers 1 8 --rounds 3 --baseline /tmp/old
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
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


def _env(root: Path = ROOT) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _fsync_latency_ms(directory: Path, rounds: int = 500, preallocated: bool = False) -> float:
    """Median latency of write + fdatasync of a small record appended to a file in
    ``directory``; ``preallocated``: into a file whose blocks were reserved beforehand (as
    the broker's durable segments are), so that no sync changes its size."""
    path = directory / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    samples = []
    try:
        if preallocated:
            os.posix_fallocate(fd, 0, 256 * rounds)
            os.fsync(fd)
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

    def __init__(self, data_path: Path, flags: list[str], root: Path = ROOT):
        self.data_path = data_path
        self.flags = flags
        self.root = root  # the checkout whose broker runs
        self.proc: subprocess.Popen | None = None
        self.log = data_path.parent / f"{data_path.name}.log"

    def __enter__(self) -> Broker:
        self.data_path.mkdir(parents=True)
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "broker", f"--data-path={self.data_path}",
                 "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", *self.flags],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=self.root, env=_env(self.root))
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
    parser.add_argument("--rounds", type=int, default=1, help="runs of each kind; medians are reported (default 1)")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another checkout whose broker also runs every durable run, alternately with this one's")
    args = parser.parse_args(argv)

    modes: list[tuple[str, list[str], Path]] = [("memory", [], ROOT), ("durable", ["--durable"], ROOT)]
    if args.baseline is not None:
        modes.append(("baseline durable", ["--durable"], args.baseline.resolve()))
    rows = []
    probes = []
    preallocated_probes = []
    with tempfile.TemporaryDirectory(prefix="pynsqd-bench-durable-") as tmp:
        for round_ in range(args.rounds):
            probes.append(_fsync_latency_ms(Path(tmp)))
            preallocated_probes.append(_fsync_latency_ms(Path(tmp), preallocated=True))
            for publishers in args.publishers:
                order = modes if round_ % 2 == 0 else modes[::-1]
                for mode, flags, root in order:
                    data = Path(tmp) / f"{mode.replace(' ', '-')}-{publishers}-{round_}"
                    with Broker(data, flags, root) as broker:
                        broker.create_channel()
                        result = run_writer(broker.tcp, publishers, args.runfor, args.batch_size, args.size)
                    rows.append({"mode": mode, "publishers": publishers, "round": round_,
                                 "msgs_per_s": result["msgs_per_s"], "latency_ms": result.get("latency_ms"),
                                 "messages": result["messages"]})
    fsync_ms = statistics.median(probes)
    preallocated_ms = statistics.median(preallocated_probes)
    if args.json:
        print(json.dumps({"fsync_ms": fsync_ms, "fsync_probes_ms": probes, "preallocated_fsync_ms": preallocated_ms,
                          "batch_size": args.batch_size, "runs": rows}, indent=2))
        return 0
    verb = "PUB" if args.batch_size == 1 else f"MPUB x{args.batch_size}"
    fsyncs = 1000 / fsync_ms
    print(f"# {verb}, {args.size} B bodies, {args.runfor} per run, {args.rounds} round(s), medians; "
          f"median write+fdatasync here: {fsync_ms:.3f} ms ({fsyncs:,.0f} a second), into a preallocated file "
          f"{preallocated_ms:.3f} ms ({1000 / preallocated_ms:,.0f} a second)")
    baseline = args.baseline is not None
    extra = " baseline --durable msgs/s | durable / baseline |" if baseline else ""
    print("| publishers | without --durable msgs/s | --durable msgs/s | durable / memory | durable publishes / fsyncs |"
          + extra)
    print("|-----------:|-------------------------:|-----------------:|-----------------:|---------------------------:|"
          + ("--------------------------:|-------------------:|" if baseline else ""))

    def median(mode: str, publishers: int) -> float:
        return statistics.median(r["msgs_per_s"] for r in rows if r["mode"] == mode and r["publishers"] == publishers)

    for publishers in args.publishers:
        memory = median("memory", publishers)
        durable = median("durable", publishers)
        ratio = durable / args.batch_size / fsyncs
        line = f"| {publishers:>10} | {memory:>24,.0f} | {durable:>16,.0f} | {durable / memory:>16.2f} | {ratio:>26.2f} |"
        if baseline:
            old = median("baseline durable", publishers)
            line += f" {old:>26,.0f} | {durable / old:>18.2f} |"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
