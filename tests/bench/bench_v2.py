"""Benchmark: nsq's own ``bench_writer`` and ``bench_reader`` against nsqd 1.3.0 and pynsqd, side by side.

Every run starts a fresh broker on a temporary data path, drives it with nsq 1.3.0's load
generators (``GOMAXPROCS=N`` sets their connection count) and stops it. Each round runs every
scenario on every broker, alternating (the order rotates from round to round), so all of them
see the same machine load; the table gives each broker's median and its ratio to nsqd.
``--checkout NAME=PATH`` adds another pynsqd checkout (say, main) to compare a branch with.

Scenarios (100 B bodies unless named otherwise):

- ``pub1``: ``bench_writer --batch-size=1``, 8 connections: one message in flight per connection,
  so every message pays the whole request path (wake-up, parse, publish, reply);
- ``mpub``: MPUB 200, 2 connections, writer alone (a topic with no channel keeps the messages);
- ``both``: MPUB 200 writer and ``bench_reader`` (RDY 2500, FIN per message) at once, 2 connections
  each, on a topic whose channel exists beforehand; the rate is the reader's;
- ``both1000``: the same with 1000 B bodies;
- ``mem0``: ``both`` with ``--mem-queue-size=0`` (every message through the disk queues);
- ``mem0-writer``: ``mpub`` with ``--mem-queue-size=0``.

Usage (from the repository root)::

    python tests/bench/bench_v2.py                                  # every scenario, 3 rounds of 5 s
    python tests/bench/bench_v2.py --only pub1 --rounds 5
    python tests/bench/bench_v2.py --checkout main=/tmp/main-checkout --only pub1 --only both
    python tests/bench/bench_v2.py --only pub1 --profile /tmp/prof  # py-spy on each pynsqd, first round
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.bench.run_matrix import Profiler  # noqa: E402
from tests.support.paths import nsq_bin  # noqa: E402
from tests.support.processes import BrokerProcess  # noqa: E402

TOPIC = "sub_bench"
CHANNEL = "ch"
#: the tools are started this long before their common ``--deadline``
STEP_DELAY = 2
_RATE = re.compile(r"duration: \S+ - [\d.]+mb/s - ([\d.]+)ops/s")
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Scenario:
    """One load: a writer, and a reader when ``reader_connections``; the rate is the reader's then."""

    name: str
    batch: int
    size: int = 100
    writer_connections: int = 2
    reader_connections: int = 0
    rdy: int = 2500
    broker_flags: tuple[str, ...] = ()


SCENARIOS = {s.name: s for s in (
    Scenario("pub1", batch=1, writer_connections=8),
    Scenario("mpub", batch=200),
    Scenario("both", batch=200, reader_connections=2),
    Scenario("both1000", batch=200, size=1000, reader_connections=2),
    Scenario("mem0", batch=200, reader_connections=2, broker_flags=("--mem-queue-size=0",)),
    Scenario("mem0-writer", batch=200, broker_flags=("--mem-queue-size=0",)),
)}


@dataclass
class Broker:
    """A broker under test: nsqd, or ``python -m broker`` run in a checkout."""

    name: str
    program: list[str]
    cwd: Path | None = None
    results: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)

    @property
    def is_python(self) -> bool:
        return self.cwd is not None


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of a process so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _tool(nsq: Path, name: str, connections: int, address: str, args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "GOMAXPROCS": str(connections)}
    return subprocess.Popen([str(nsq / name), f"--nsqd-tcp-address={address}", f"--topic={TOPIC}", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _rate(proc: subprocess.Popen, what: str, timeout: float) -> float:
    out, _ = proc.communicate(timeout=timeout)
    found = _RATE.findall(out)
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"{what} failed ({proc.returncode}):\n{out}")
    return float(found[-1])


def _post(http: tuple[str, int], path: str) -> None:
    request = urllib.request.Request(f"http://{http[0]}:{http[1]}{path}", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        answer.read()


def run_once(s: Scenario, broker: Broker, nsq: Path, runfor: float, work: Path,
             profile_dir: Path | None) -> tuple[float, float]:
    """One run of a scenario on a fresh broker: (msgs/s, broker CPU seconds per million messages)."""
    data = Path(tempfile.mkdtemp(prefix=f"{broker.name}-", dir=work))
    proc = BrokerProcess(data, *s.broker_flags, program=broker.program, cwd=broker.cwd,
                         log_path=data / "broker.log").start()
    try:
        address = f"{proc.tcp[0]}:{proc.tcp[1]}"
        if s.reader_connections:
            _post(proc.http, f"/topic/create?topic={TOPIC}")
            _post(proc.http, f"/channel/create?topic={TOPIC}&channel={CHANNEL}")
        profiler = Profiler("py-spy" if profile_dir and broker.is_python else None, profile_dir,
                            f"{s.name}-{broker.name}", proc.proc.pid, 250)
        # the tools parse the deadline as UTC, to the second
        start = datetime.datetime.now(datetime.UTC).replace(microsecond=0) + datetime.timedelta(seconds=STEP_DELAY)
        timing = [f"--runfor={runfor}s", f"--deadline={start:%Y-%m-%d %H:%M:%S}"]
        cpu_before = None
        tools = []
        if s.reader_connections:
            tools.append(("bench_reader", _tool(nsq, "bench_reader", s.reader_connections, address,
                                                [f"--channel={CHANNEL}", f"--rdy={s.rdy}", f"--size={s.size}",
                                                 *timing])))
        tools.append(("bench_writer", _tool(nsq, "bench_writer", s.writer_connections, address,
                                            [f"--batch-size={s.batch}", f"--size={s.size}", *timing])))
        wait = (start - datetime.datetime.now(datetime.UTC)).total_seconds()
        if wait > 0:
            time.sleep(wait)
        cpu_before = cpu_seconds(proc.proc.pid)
        rates = {name: _rate(tool, name, runfor + STEP_DELAY + 60) for name, tool in tools}
        cpu = cpu_seconds(proc.proc.pid) - cpu_before
        summary = profiler.stop()
        if summary.get("top"):
            print(f"  py-spy {s.name} {broker.name}: {summary['samples']} samples", file=sys.stderr)
            for row in summary["top"][:12]:
                print(f"    {row['self_pct']:5.1f}% self {row['inclusive_pct']:5.1f}% incl  {row['function']}",
                      file=sys.stderr)
        rate = rates["bench_reader" if s.reader_connections else "bench_writer"]
        return rate, cpu / max(rate * runfor, 1) * 1e6
    finally:
        proc.terminate(60)


def _cell(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:.2f}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", action="append", choices=sorted(SCENARIOS), help="scenario to run (repeatable)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runfor", type=float, default=5.0, help="seconds per run (default 5)")
    p.add_argument("--checkout", action="append", default=[], metavar="NAME=PATH",
                   help="another pynsqd checkout to run as well (repeatable)")
    p.add_argument("--no-nsqd", action="store_true", help="compare pynsqd checkouts only")
    p.add_argument("--profile", type=Path, metavar="DIR",
                   help="attach py-spy to every pynsqd in the first round; stacks go to DIR")
    p.add_argument("--json", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    nsq = nsq_bin()
    if nsq is None:
        print("nsq 1.3.0's programs are needed (NSQ_BIN, or ../shared/nsq/bin)", file=sys.stderr)
        return 2
    python = [sys.executable, "-m", "broker"]
    brokers = [] if args.no_nsqd else [Broker("nsqd", [str(nsq / "nsqd")])]
    brokers.append(Broker("pynsqd", python, ROOT))
    for spec in args.checkout:
        name, _, path = spec.partition("=")
        brokers.append(Broker(name, python, Path(path).resolve()))
    scenarios = [SCENARIOS[n] for n in (args.only or SCENARIOS)]
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench_v2-") as tmp:
        for round_no in range(args.rounds):
            for s in scenarios:
                shift = round_no % len(brokers)
                for broker in brokers[shift:] + brokers[:shift]:
                    rate, cpu = run_once(s, broker, nsq, args.runfor, Path(tmp),
                                         args.profile if round_no == 0 else None)
                    broker.results.setdefault(s.name, []).append(rate)
                    broker.cpu.setdefault(s.name, []).append(cpu)
                    print(f"round {round_no + 1} {s.name:12} {broker.name:8} {rate:12,.0f} msgs/s "
                          f"{cpu:6.2f} CPU s per M", file=sys.stderr)
    base = brokers[0]
    rows = []
    for s in scenarios:
        row = {"scenario": s.name}
        for b in brokers:
            row[b.name] = round(statistics.median(b.results[s.name]))
            row[f"{b.name}_cpu_s_per_M"] = round(statistics.median(b.cpu[s.name]), 2)
            row[f"{b.name}_runs"] = [round(r) for r in b.results[s.name]]
        for b in brokers[1:]:
            row[f"{b.name}/{base.name}"] = round(row[b.name] / row[base.name], 2)
        rows.append(row)
    if args.json:
        print(json.dumps(rows))
        return 0
    columns = [b.name for b in brokers] + [f"{b.name}/{base.name}" for b in brokers[1:]]
    columns += [f"{b.name}_cpu_s_per_M" for b in brokers]
    print(f"medians of {args.rounds} alternating runs of {args.runfor:g} s: msgs/s, ratios, "
          "broker CPU seconds per million messages")
    print("| scenario | " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for row in rows:
        print(f"| {row['scenario']} | " + " | ".join(_cell(row[c]) for c in columns) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
