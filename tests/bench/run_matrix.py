"""Run the benchmark matrix against fresh brokers and print one table.

Each scenario starts a new broker on a temporary data path (``python -m broker``,
or any nsqd-compatible command given with ``--broker-cmd``), drives it with
``python -m broker.bench`` in separate processes, and records the tools'
results next to the broker's CPU seconds over the measured phase and its peak
RSS (``VmHWM``). The matrix is

    {100, 1000} B  x  {PUB, MPUB 200}  x  {writer, reader, both}  x  {default, --mem-queue-size=0}

Roles, as nsq's bench.sh runs them:

- writer: ``bench writer`` alone into a topic with no channel (nsqd keeps such
  a topic's messages, in memory up to ``--mem-queue-size`` and on disk past it).
- reader: the topic is first filled by ``bench writer`` for the run time
  (untimed), then ``bench reader`` drains it (``--count`` = what was written).
  The latencies of this role include the time messages waited in the backlog.
- both: one writer process and one reader process started in step with
  ``--deadline``; the reader subscribes before the writer publishes.

Usage (from the repository root)::

    python tests/bench/run_matrix.py                  # 10 s per scenario, ~10 minutes
    python tests/bench/run_matrix.py --quick          # 2 s per scenario
    python tests/bench/run_matrix.py --only 100B --only MPUB --json
    python tests/bench/run_matrix.py --profile py-spy --profile-dir /tmp/prof --only "MPUB200 both"
    python tests/bench/run_matrix.py --memory         # 10M x 100 B backlog, peak RSS (long)
    python tests/bench/run_matrix.py --broker-cmd nsqd   # the same matrix against nsqd

``--profile py-spy`` attaches ``py-spy record`` to the broker for the measured
phase of each scenario and prints the functions with the most samples;
``--profile cprofile`` runs the broker under ``python -m cProfile`` and prints
the top of its cumulative-time table once the broker has shut down.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pstats
import re
import resource
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    # run as a script from a checkout: make broker.bench importable without installing
    sys.path.insert(0, str(ROOT))

from broker.bench.arguments import parse_duration  # noqa: E402
from broker.bench.connection import BenchConnection  # noqa: E402

SIZES = (100, 1000)
PUBLISH = (("PUB", 1), ("MPUB200", 200))
ROLES = ("writer", "reader", "both")
MEM_QUEUE = (None, 0)  # None: the broker's default
LISTENING = re.compile(rb"TCP: listening on \[?([^\s\]]*)\]?:(\d+)")
START_TIMEOUT = 30.0
STOP_TIMEOUT = 60.0
#: the reader and writer of "both" are started this long before their deadline
STEP_DELAY = 2.0
TOPIC = "sub_bench"
CHANNEL = "ch"
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def harness_cpu_seconds() -> float:
    """CPU seconds of this runner and of its finished children (the bench tools it waited for)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def machine_busy_seconds() -> float:
    """CPU seconds all cores of the machine spent busy so far (from /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / _CLOCK_TICKS


class BrokerProcess:
    """A broker started for one scenario; owns the process and its data directory."""

    def __init__(self, command: list[str], data_path: Path, extra: list[str], log_path: Path):
        self.command = [*command, "--data-path", str(data_path), "--tcp-address", "127.0.0.1:0",
                        "--http-address", "127.0.0.1:0", *extra]
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.address: tuple[str, int] | None = None

    def start(self) -> tuple[str, int]:
        """Start the broker and wait for its TCP listener; raises RuntimeError."""
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                     cwd=ROOT, env=_child_env())
        log.close()
        limit = time.monotonic() + START_TIMEOUT
        while time.monotonic() < limit:
            m = LISTENING.search(self.log_path.read_bytes())
            if m:
                self.address = (m.group(1).decode(), int(m.group(2)))
                return self.address
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"broker did not start: {shlex.join(self.command)}\n{self.log_tail()}")

    @property
    def pid(self) -> int:
        """The broker's process id."""
        assert self.proc is not None
        return self.proc.pid

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of the broker so far (all its threads)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS

    def memory_mb(self) -> tuple[float, float]:
        """(peak RSS, current RSS) in MiB, from /proc/<pid>/status."""
        values = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                values[key] = int(rest.split()[0]) / 1024
        return values["VmHWM"], values["VmRSS"]

    def log_tail(self, lines: int = 20) -> str:
        """The last lines the broker logged."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after STOP_TIMEOUT; returns the exit status. Safe to call twice."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


@dataclass(frozen=True, slots=True)
class Scenario:
    """One cell of the matrix."""

    size: int
    publish: str
    batch: int
    role: str
    mem_queue_size: int | None

    @property
    def name(self) -> str:
        mem = "mem=default" if self.mem_queue_size is None else f"mem={self.mem_queue_size}"
        return f"{self.size}B {self.publish} {self.role} {mem}"


@dataclass(slots=True)
class Outcome:
    """What one scenario measured."""

    scenario: Scenario
    writer: dict | None = None
    reader: dict | None = None
    prefilled: int | None = None
    broker_cpu_s: float = 0.0
    busy_s: float = 0.0  # the whole machine's busy CPU seconds over the same window
    harness_cpu_s: float = 0.0  # this runner and the bench processes, start-up included
    window_s: float = 0.0  # wall time over which busy_s, harness_cpu_s and broker_cpu_s were taken
    measured_s: float = 0.0
    peak_rss_mb: float = 0.0
    rss_mb: float = 0.0
    profile: dict = field(default_factory=dict)  # {"samples": N, "top": [...]}
    error: str | None = None

    @property
    def tool_cpu_s(self) -> float:
        """CPU seconds of the bench tools over their timed runs."""
        return sum(x["cpu"]["user_s"] + x["cpu"]["system_s"] for x in (self.writer, self.reader) if x)

    @property
    def other_cpu_s(self) -> float:
        """Busy CPU seconds of everything else on the machine: load that skews the numbers."""
        return max(self.busy_s - self.broker_cpu_s - self.harness_cpu_s, 0.0)

    @classmethod
    def from_dict(cls, d: dict) -> Outcome:
        """The inverse of as_dict (for ``--render``)."""
        broker = d["broker"]
        runs = [r for r in (d["writer"], d["reader"]) if r]
        return cls(
            Scenario(d["size"], d["publish"], d["batch_size"], d["role"], d["mem_queue_size"]),
            writer=d["writer"], reader=d["reader"], prefilled=d["prefilled"], broker_cpu_s=broker["cpu_s"],
            busy_s=broker["cpu_s"] + d["other_cpu_s"], window_s=d["window_s"],
            measured_s=max((r["duration_s"] for r in runs), default=0.0), peak_rss_mb=broker["peak_rss_mb"],
            rss_mb=broker["rss_mb"], profile=d["profile"], error=d["error"])

    def as_dict(self) -> dict:
        s = self.scenario
        return {
            "scenario": s.name,
            "size": s.size,
            "publish": s.publish,
            "batch_size": s.batch,
            "role": s.role,
            "mem_queue_size": s.mem_queue_size,
            "writer": self.writer,
            "reader": self.reader,
            "prefilled": self.prefilled,
            "broker": {
                "cpu_s": self.broker_cpu_s,
                "cpu_percent": 100 * self.broker_cpu_s / self.measured_s if self.measured_s else None,
                "peak_rss_mb": self.peak_rss_mb,
                "rss_mb": self.rss_mb,
            },
            "tool_cpu_s": self.tool_cpu_s,
            "other_cpu_s": self.other_cpu_s,
            "window_s": self.window_s,
            "profile": self.profile,
            "error": self.error,
        }


def _child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def matrix(only: list[str]) -> list[Scenario]:
    """Every scenario whose name contains all of ``only`` (case-insensitive)."""
    cells = [Scenario(size, pub, batch, role, mem)
             for mem in MEM_QUEUE for size in SIZES for pub, batch in PUBLISH for role in ROLES]
    return [s for s in cells if all(o.lower() in s.name.lower() for o in only)]


def bench(tool: str, address: tuple[str, int], args: list[str]) -> subprocess.Popen:
    """Start ``python -m broker.bench TOOL`` with JSON output."""
    cmd = [sys.executable, "-m", "broker.bench", tool, f"--nsqd-tcp-address={address[0]}:{address[1]}",
           "--json", "--progress=0", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=_child_env())


def finish(proc: subprocess.Popen, what: str) -> dict:
    """Wait for a bench process and parse its JSON; raises RuntimeError on failure."""
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed ({proc.returncode}): {err.decode(errors='replace').strip()}")
    return json.loads(out)


def writer_args(s: Scenario, connections: int) -> list[str]:
    return [f"--topic={TOPIC}", f"--size={s.size}", f"--batch-size={s.batch}", f"--connections={connections}"]


def reader_args(connections: int, rdy: int) -> list[str]:
    return [f"--topic={TOPIC}", f"--channel={CHANNEL}", f"--connections={connections}", f"--rdy={rdy}"]


class Profiler:
    """py-spy attached to the broker for the measured phase of a scenario."""

    def __init__(self, kind: str | None, out_dir: Path | None, name: str, pid: int, rate: int):
        self.proc = None
        if kind == "py-spy" and out_dir is not None:
            self.path = out_dir / (re.sub(r"[^A-Za-z0-9]+", "_", name) + ".txt")
            self.proc = subprocess.Popen(
                ["py-spy", "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw",
                 "--output", str(self.path), "--nonblocking"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            time.sleep(0.5)  # let it attach before the load starts

    def stop(self) -> dict:
        """Stop sampling and summarise the collected stacks."""
        if self.proc is None:
            return {}
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if not self.path.exists():
            err = self.proc.stderr.read().decode(errors="replace").strip() if self.proc.stderr else ""
            return {"error": f"py-spy wrote no profile: {err}"}
        return summarize_stacks(self.path.read_text())


def summarize_stacks(collapsed: str, top: int = 15) -> dict:
    """Top functions of py-spy's raw (collapsed) output by own samples, with inclusive share.

    py-spy leaves out idle threads (a broker waiting in epoll), so the shares are
    of the samples in which the broker was busy.
    """
    own: collections.Counter = collections.Counter()
    inclusive: collections.Counter = collections.Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        total += n
        own[frames[-1]] += n
        for f in set(frames):
            inclusive[f] += n
    rows = [{"function": f, "self_pct": round(100 * n / total, 1),
             "inclusive_pct": round(100 * inclusive[f] / total, 1), "samples": n}
            for f, n in own.most_common(top)]
    return {"samples": total, "top": rows}


def summarize_cprofile(path: Path, top: int = 25) -> dict:
    """Top functions of a cProfile dump by own time (over the broker's whole life)."""
    stats = pstats.Stats(str(path))
    total = stats.total_tt or 1.0
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    return {"seconds": total,
            "top": [{"function": f"{func} ({Path(file).name}:{line})", "self_pct": round(100 * tt / total, 1),
                     "inclusive_pct": round(100 * ct / total, 1), "calls": nc}
                    for (file, line, func), (cc, nc, tt, ct, _) in rows]}


def create_channel(address: tuple[str, int], topic: str, channel: str) -> None:
    """Create a topic's channel by subscribing once (it outlives the subscriber)."""
    conn = BenchConnection.open(*address, "bench_matrix", {})
    try:
        conn.subscribe(topic, channel)
    finally:
        conn.close()


def run_scenario(s: Scenario, opts: argparse.Namespace, work: Path) -> Outcome:
    """Start a broker, run one scenario against it, stop it."""
    outcome = Outcome(s)
    data = Path(tempfile.mkdtemp(prefix="data-", dir=work))
    extra = [] if s.mem_queue_size is None else [f"--mem-queue-size={s.mem_queue_size}"]
    command = list(opts.command)
    cprofile_out = None
    if opts.profile == "cprofile":
        cprofile_out = opts.profile_dir / (re.sub(r"[^A-Za-z0-9]+", "_", s.name) + ".prof")
        command = [sys.executable, "-m", "cProfile", "-o", str(cprofile_out), "-m", "broker"]
    broker = BrokerProcess(command, data, extra, data / "broker.log")
    runfor = f"--runfor={opts.runfor}s"
    conns = opts.connections
    profiler = None
    try:
        address = broker.start()
        if s.role == "reader":
            pre = finish(bench("writer", address, [*writer_args(s, conns), runfor]), "prefill writer")
            outcome.prefilled = pre["messages"]
        profiler = Profiler(opts.profile, opts.profile_dir, s.name, broker.pid, opts.profile_rate)
        cpu0 = broker.cpu_seconds()
        busy0 = machine_busy_seconds()
        harness0 = harness_cpu_seconds()
        window0 = time.monotonic()
        if s.role == "writer":
            outcome.writer = finish(bench("writer", address, [*writer_args(s, conns), runfor]), "writer")
        elif s.role == "reader":
            cap = f"--runfor={max(3 * opts.runfor, 30)}s"
            outcome.reader = finish(bench("reader", address, [*reader_args(conns, opts.rdy), cap,
                                                              f"--count={outcome.prefilled}"]), "reader")
        else:
            deadline = f"--deadline={time.time() + STEP_DELAY:.3f}"
            reader = bench("reader", address, [*reader_args(conns, opts.rdy), runfor, deadline])
            writer = bench("writer", address, [*writer_args(s, conns), runfor, deadline])
            outcome.writer = finish(writer, "writer")
            outcome.reader = finish(reader, "reader")
        outcome.broker_cpu_s = broker.cpu_seconds() - cpu0
        outcome.busy_s = machine_busy_seconds() - busy0
        outcome.harness_cpu_s = harness_cpu_seconds() - harness0
        outcome.window_s = time.monotonic() - window0
        outcome.profile, profiler = profiler.stop(), None
        outcome.measured_s = max(r["duration_s"] for r in (outcome.writer, outcome.reader) if r)
        outcome.peak_rss_mb, outcome.rss_mb = broker.memory_mb()
    except (RuntimeError, OSError, ValueError) as exc:
        outcome.error = f"{exc}\n{broker.log_tail(5)}".strip()
    finally:
        if profiler is not None:
            profiler.stop()
        status = broker.stop()
        if status not in (0, None) and outcome.error is None:
            outcome.error = f"broker exited with status {status}: {broker.log_tail(5)}"
    if cprofile_out is not None and cprofile_out.exists():
        outcome.profile = summarize_cprofile(cprofile_out)
    if not opts.keep_data:
        _remove_tree(data)
    return outcome


def run_memory(opts: argparse.Namespace, work: Path) -> dict:
    """Publish a backlog of ``--memory-count`` 100 B messages into a channel nobody reads; report RSS."""
    data = Path(tempfile.mkdtemp(prefix="memory-", dir=work))
    broker = BrokerProcess(list(opts.command), data, [], data / "broker.log")
    address = broker.start()
    try:
        create_channel(address, TOPIC, CHANNEL)
        writer = finish(bench("writer", address, [f"--topic={TOPIC}", "--size=100", "--batch-size=200",
                                                   f"--connections={opts.connections}",
                                                   f"--count={opts.memory_count}", "--progress=0"]),
                        "backlog writer")
        time.sleep(2)  # let the pumps settle the backlog into the channel
        peak, rss = broker.memory_mb()
        result = {"scenario": f"memory {opts.memory_count} x 100B backlog", "writer": writer,
                  "broker": {"peak_rss_mb": peak, "rss_mb": rss,
                             "data_path_mb": sum(f.stat().st_size for f in data.rglob("*") if f.is_file())
                             / 2**20}}
        if opts.memory_drain:
            cap = f"--runfor={max(600, opts.memory_count // 10000)}s"
            result["reader"] = finish(bench("reader", address, [*reader_args(opts.connections, opts.rdy), cap,
                                                                f"--count={opts.memory_count}"]),
                                      "backlog reader")
            result["broker"]["peak_rss_mb_after_drain"] = broker.memory_mb()[0]
        return result
    finally:
        broker.stop()
        if not opts.keep_data:
            _remove_tree(data)


def _remove_tree(path: Path) -> None:
    for p in sorted(path.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    path.rmdir()


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def table(outcomes: list[Outcome]) -> str:
    """The results as one Markdown table."""
    head = ["scenario", "writer msgs/s", "writer MB/s", "reader msgs/s", "reader MB/s", "p50 ms", "p99 ms",
            "p999 ms", "broker CPU", "broker peak RSS MB", "tool CPU", "other load"]
    rows = []
    for o in outcomes:
        if o.error:
            rows.append([o.scenario.name, f"error: {o.error.splitlines()[0][:80]}"] + [""] * (len(head) - 2))
            continue
        w, r = o.writer or {}, o.reader or {}
        lat = r.get("latency_ms") or {}
        rows.append([
            o.scenario.name,
            _num(w.get("msgs_per_s")), _num(w.get("mib_per_s"), 1),
            _num(r.get("msgs_per_s")), _num(r.get("mib_per_s"), 1),
            _num(lat.get("p50_ms"), 2), _num(lat.get("p99_ms"), 2), _num(lat.get("p999_ms"), 2),
            f"{100 * o.broker_cpu_s / o.measured_s:.0f}%" if o.measured_s else "-",
            _num(o.peak_rss_mb),
            f"{100 * o.tool_cpu_s / o.measured_s:.0f}%" if o.measured_s else "-",
            f"{100 * o.other_cpu_s / o.window_s:.0f}%" if o.window_s else "-",
        ])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    fmt = "| " + " | ".join("{:<%d}" % w if i == 0 else "{:>%d}" % w for i, w in enumerate(widths)) + " |"
    sep = "|" + "|".join("-" * (w + 1) + (":" if i else "-") for i, w in enumerate(widths)) + "|"
    return "\n".join([fmt.format(*head), sep, *(fmt.format(*row) for row in rows)])


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2 s per scenario instead of 10 s")
    p.add_argument("--runfor", type=parse_duration, default=None, help="time per scenario (default 10s)")
    p.add_argument("--only", action="append", default=[], metavar="TEXT",
                   help="run the scenarios whose name contains TEXT (repeatable, all must match)")
    p.add_argument("--connections", type=int, default=2, help="connections per bench tool (default 2)")
    p.add_argument("--rdy", type=int, default=2500, help="RDY per reader connection (default 2500)")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    p.add_argument("--broker-cmd", default=f"{shlex.quote(sys.executable)} -m broker",
                   help="command that starts the broker (default: python -m broker); nsqd works too")
    p.add_argument("--profile", choices=("py-spy", "cprofile"), default=None,
                   help="profile the broker during each measured phase")
    p.add_argument("--profile-dir", type=Path, default=None, help="where profiles go (default: a temp dir)")
    p.add_argument("--profile-rate", type=int, default=250, help="py-spy samples per second (default 250)")
    p.add_argument("--memory", action="store_true",
                   help="instead of the matrix: a 100 B backlog in a channel nobody reads, peak RSS")
    p.add_argument("--memory-count", type=int, default=10_000_000, help="backlog size (default 10000000)")
    p.add_argument("--memory-drain", action="store_true", help="then drain the backlog with bench reader")
    p.add_argument("--keep-data", action="store_true", help="keep the brokers' data directories")
    p.add_argument("--render", type=Path, default=None, metavar="FILE",
                   help="print the table of a saved --json run instead of running anything")
    opts = p.parse_args(argv)
    opts.runfor = opts.runfor or (2.0 if opts.quick else 10.0)
    opts.command = shlex.split(opts.broker_cmd)
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    if opts.render is not None:
        outcomes = [Outcome.from_dict(d) for d in json.loads(opts.render.read_text())]
        print(table(outcomes))
        return 0
    with tempfile.TemporaryDirectory(prefix="pynsqd-bench-") as tmp:
        work = Path(tmp)
        if opts.profile and opts.profile_dir is None:
            opts.profile_dir = Path(tempfile.mkdtemp(prefix="pynsqd-profile-"))
        if opts.profile_dir is not None:
            opts.profile_dir.mkdir(parents=True, exist_ok=True)
        if opts.memory:
            result = run_memory(opts, work)
            print(json.dumps(result, indent=2) if opts.json else _memory_text(result))
            return 0
        outcomes = []
        for s in matrix(opts.only):
            print(f"# {s.name} ...", file=sys.stderr, flush=True)
            o = run_scenario(s, opts, work)
            outcomes.append(o)
            if o.error:
                print(f"#   error: {o.error}", file=sys.stderr, flush=True)
            else:
                rates = ", ".join(f"{role} {r['msgs_per_s']:,.0f} msgs/s"
                                  for role, r in (("writer", o.writer), ("reader", o.reader)) if r)
                print(f"#   {rates}; broker {o.broker_cpu_s:.1f} CPU s, peak RSS {o.peak_rss_mb:.0f} MB",
                      file=sys.stderr, flush=True)
    if opts.json:
        print(json.dumps([o.as_dict() for o in outcomes], indent=2))
    else:
        print(f"# broker: {opts.broker_cmd}; {opts.runfor:g}s per scenario; {opts.connections} connections "
              f"per tool; reader RDY {opts.rdy}; MB = 2^20 bytes of message bodies")
        print(table(outcomes))
        for o in outcomes:
            if o.profile:
                print(f"\n## profile: {o.scenario.name} "
                      f"({o.profile.get('samples', o.profile.get('seconds', '?'))} samples/seconds)")
                if "error" in o.profile:
                    print(f"  {o.profile['error']}")
                for row in o.profile.get("top", ()):
                    print(f"  {row['self_pct']:>5}% self {row['inclusive_pct']:>5}% incl  {row['function']}")
        if opts.profile_dir:
            print(f"\n# profiles in {opts.profile_dir}")
    return 1 if any(o.error for o in outcomes) else 0


def _memory_text(result: dict) -> str:
    w, b = result["writer"], result["broker"]
    lines = [f"# {result['scenario']}",
             f"publish: {w['messages']:,} msgs in {w['duration_s']:.1f}s = {w['msgs_per_s']:,.0f} msgs/s",
             f"broker peak RSS {b['peak_rss_mb']:.0f} MB, RSS {b['rss_mb']:.0f} MB, "
             f"data path {b['data_path_mb']:.0f} MB"]
    if "reader" in result:
        r = result["reader"]
        lines.append(f"drain: {r['messages']:,} msgs in {r['duration_s']:.1f}s = {r['msgs_per_s']:,.0f} msgs/s, "
                     f"peak RSS after drain {b['peak_rss_mb_after_drain']:.0f} MB")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
