"""Benchmark pynsqd against nsq 1.3.0's nsqd side by side and print one table of ratios.

Every scenario runs ``--rounds`` times on each broker, alternately (nsqd then pynsqd, then
pynsqd then nsqd, ...), each run on a fresh broker with a temporary data path; the table
gives each broker's median and pynsqd / nsqd. nsqd is nsq's own, found as the tests find
it (``$NSQ_BIN``, or the ``shared/nsq/bin`` script beside the checkout). Both brokers face
the same load generators:

- nsq's own ``bench_writer`` and ``bench_reader`` (``GOMAXPROCS`` sets their connection
  count), for the comparison rows: ``PUB`` of 100 B with 8 connections
  (``--batch-size=1``); ``MPUB`` 200 x 100 B writer alone; ``MPUB`` 200 x 100 B writer and
  reader at once; ``MPUB`` 200 x 1000 B writer and reader at once; ``MPUB`` 200 x 100 B
  writer alone under ``--mem-queue-size=0``;
- ``wrk`` (Debian's ``wrk`` package), for the HTTP rows: ``POST /pub`` with 100 B bodies
  and ``POST /mpub`` with 100 lines of 100 B, 16 keep-alive connections on 2 threads;
- ``python -m broker.bench`` (pynsqd's bench tool) for the matrix (``--matrix``)

    {100, 1000} B  x  {PUB, MPUB 200}  x  {writer, reader, both}  x  {default, --mem-queue-size=0}

  with the roles of nsq's bench.sh. writer: ``bench writer`` alone into a topic with no
  channel (kept in memory up to ``--mem-queue-size``, on disk past it). reader: the topic is
  first filled by ``bench writer`` for the run time (untimed), then ``bench reader`` drains
  it (``--count`` = what was written); its latencies include the time messages waited in
  the backlog. both: one writer and one reader started in step with ``--deadline``; the
  reader subscribes before the writer publishes.

Without ``--matrix`` or ``--only`` the comparison and HTTP rows run; ``--only`` chooses
among all rows. Broker CPU is the broker's CPU seconds over the measured phase in percent
of one core (nsqd's Go runtime uses both cores, pynsqd one thread).

Usage (from the repository root)::

    python -m tests.bench.run_matrix                  # comparison + HTTP rows, 3 rounds x 10 s
    python -m tests.bench.run_matrix --quick          # 2 s per run
    python -m tests.bench.run_matrix --rounds 5 --only http
    python -m tests.bench.run_matrix --matrix --rounds 1 --json > matrix.json
    python -m tests.bench.run_matrix --only 100B --only MPUB --no-nsqd   # pynsqd alone, detailed table
    python -m tests.bench.run_matrix --profile py-spy --profile-dir /tmp/prof --only "MPUB200 both"
    python -m tests.bench.run_matrix --memory         # 10M x 100 B backlog, peak RSS (long)
    python -m tests.bench.run_matrix --broker-cmd "python -m broker --mem-queue-size=20000"

``--profile py-spy`` attaches ``py-spy record`` to pynsqd for the measured phase of each
run and prints the functions with the most samples; ``--profile cprofile`` runs pynsqd
under ``python -m cProfile`` and prints the top of its cumulative-time table once it has
shut down. Rows whose tool is missing (no nsq programs, no ``wrk``) are reported as errors
naming what to install.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import pstats
import re
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from broker.bench.arguments import parse_duration
from broker.bench.connection import BenchConnection
from tests.support.paths import nsq_bin

ROOT = Path(__file__).resolve().parents[2]

SIZES = (100, 1000)
PUBLISH = (("PUB", 1), ("MPUB200", 200))
ROLES = ("writer", "reader", "both")
MEM_QUEUE = (None, 0)  # None: the broker's default
LISTENING = re.compile(rb"(TCP|HTTP): listening on \[?([^\s\]]*)\]?:(\d+)")
START_TIMEOUT = 30.0
STOP_TIMEOUT = 60.0
#: the reader and writer of "both" are started this long before their deadline
STEP_DELAY = 2.0
TOPIC = "sub_bench"
CHANNEL = "ch"
#: wrk's load for the HTTP rows: threads and keep-alive connections
WRK_THREADS = 2
WRK_CONNECTIONS = 16
#: what nsq's bench tools print at the end: "duration: 10.0s - 36.5mb/s - 382990.123ops/s - 2.611us/op"
NSQ_RESULT = re.compile(r"duration: (\S+) - ([\d.]+)mb/s - ([\d.]+)ops/s")
PYNSQD, NSQD = "pynsqd", "nsqd"
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
    """A broker started for one run; owns the process and its data directory."""

    def __init__(self, command: list[str], data_path: Path, extra: list[str], log_path: Path):
        self.command = [*command, "--data-path", str(data_path), "--tcp-address", "127.0.0.1:0",
                        "--http-address", "127.0.0.1:0", *extra]
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.address: tuple[str, int] | None = None
        self.http_address: tuple[str, int] | None = None

    def start(self) -> tuple[str, int]:
        """Start the broker and wait for its TCP and HTTP listeners; raises RuntimeError."""
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                     cwd=ROOT, env=_child_env())
        log.close()
        limit = time.monotonic() + START_TIMEOUT
        while time.monotonic() < limit:
            found = {kind: (host.decode(), int(port)) for kind, host, port in LISTENING.findall(self.log_path.read_bytes())}
            if b"TCP" in found and b"HTTP" in found:
                self.address, self.http_address = found[b"TCP"], found[b"HTTP"]
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
    """One row: what load, from which tool, against a broker with which ``--mem-queue-size``.

    ``tool`` is ``nsq`` (nsq's bench_writer/bench_reader, ``connections`` of them per tool),
    ``wrk`` (HTTP ``path``, ``batch`` lines of ``size`` bytes per request) or ``bench``
    (``python -m broker.bench``).
    """

    tool: str
    size: int
    batch: int
    role: str
    mem_queue_size: int | None = None
    connections: int | None = None
    path: str = ""

    @property
    def publish(self) -> str:
        return "PUB" if self.batch == 1 else f"MPUB{self.batch}"

    @property
    def name(self) -> str:
        mem = "" if self.mem_queue_size is None else f" mem={self.mem_queue_size}"
        if self.tool == "wrk":
            lines = f"{self.batch}x" if self.batch > 1 else ""
            return f"http {self.path} {lines}{self.size}B x{WRK_CONNECTIONS}{mem}"
        if self.tool == "nsq":
            conns = f" x{self.connections}" if self.connections else ""
            return f"nsq {self.publish} {self.size}B{conns} {self.role}{mem}"
        return f"{self.size}B {self.publish} {self.role} {'mem=default' if self.mem_queue_size is None else mem.strip()}"

    def as_dict(self) -> dict:
        return {"tool": self.tool, "size": self.size, "batch_size": self.batch, "role": self.role,
                "mem_queue_size": self.mem_queue_size, "connections": self.connections, "path": self.path}


#: The rows of the side-by-side comparison: nsq's own tools, then HTTP.
COMPARISON = (
    Scenario("nsq", 100, 1, "writer", connections=8),
    Scenario("nsq", 100, 200, "writer"),
    Scenario("nsq", 100, 200, "both"),
    Scenario("nsq", 1000, 200, "both"),
    Scenario("nsq", 100, 200, "writer", mem_queue_size=0),
    Scenario("wrk", 100, 1, "writer", path="/pub"),
    Scenario("wrk", 100, 100, "writer", path="/mpub"),
)


@dataclass(slots=True)
class Outcome:
    """What one run of one scenario on one broker measured."""

    scenario: Scenario
    broker: str = PYNSQD
    round: int = 0
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
        """CPU seconds of the bench tools over their timed runs (when they report it)."""
        return sum(x["cpu"]["user_s"] + x["cpu"]["system_s"] for x in (self.writer, self.reader) if x and "cpu" in x)

    @property
    def other_cpu_s(self) -> float:
        """Busy CPU seconds of everything else on the machine: load that skews the numbers."""
        return max(self.busy_s - self.broker_cpu_s - self.harness_cpu_s, 0.0)

    @property
    def broker_cpu_percent(self) -> float | None:
        return 100 * self.broker_cpu_s / self.measured_s if self.measured_s else None

    @classmethod
    def from_dict(cls, d: dict) -> Outcome:
        """The inverse of as_dict (for ``--render``)."""
        broker = d["broker"]
        runs = [r for r in (d["writer"], d["reader"]) if r]
        scenario = Scenario(d.get("tool", "bench"), d["size"], d["batch_size"], d["role"], d["mem_queue_size"],
                            d.get("connections"), d.get("path", ""))
        return cls(
            scenario, broker=d.get("broker_name", PYNSQD), round=d.get("round", 0),
            writer=d["writer"], reader=d["reader"], prefilled=d["prefilled"], broker_cpu_s=broker["cpu_s"],
            busy_s=broker["cpu_s"] + d["other_cpu_s"], window_s=d["window_s"],
            measured_s=max((r["duration_s"] for r in runs), default=0.0), peak_rss_mb=broker["peak_rss_mb"],
            rss_mb=broker["rss_mb"], profile=d["profile"], error=d["error"])

    def as_dict(self) -> dict:
        s = self.scenario
        return {
            "scenario": s.name,
            **s.as_dict(),
            "publish": s.publish,
            "broker_name": self.broker,
            "round": self.round,
            "writer": self.writer,
            "reader": self.reader,
            "prefilled": self.prefilled,
            "broker": {
                "cpu_s": self.broker_cpu_s,
                "cpu_percent": self.broker_cpu_percent,
                "peak_rss_mb": self.peak_rss_mb,
                "rss_mb": self.rss_mb,
            },
            "tool_cpu_s": self.tool_cpu_s,
            "other_cpu_s": self.other_cpu_s,
            "window_s": self.window_s,
            "profile": self.profile,
            "error": self.error,
        }


def _child_env(**extra: str) -> dict:
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def matrix() -> list[Scenario]:
    """The matrix driven by pynsqd's bench tool."""
    return [Scenario("bench", size, batch, role, mem)
            for mem in MEM_QUEUE for size in SIZES for _, batch in PUBLISH for role in ROLES]


def scenarios(only: list[str], with_matrix: bool) -> list[Scenario]:
    """The rows to run: the comparison rows, the matrix when asked, and with ``only`` every row
    whose name contains all of ``only`` (case-insensitive)."""
    if not only:
        return matrix() if with_matrix else list(COMPARISON)
    return [s for s in (*COMPARISON, *matrix()) if all(o.lower() in s.name.lower() for o in only)]


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


def nsq_tool(tool: str, address: tuple[str, int], s: Scenario, args: list[str]) -> subprocess.Popen:
    """Start nsq's ``bench_writer`` or ``bench_reader`` with ``s.connections`` connections."""
    folder = nsq_bin()
    if folder is None:
        raise RuntimeError("nsq's bench tools are not here (set NSQ_BIN, or put nsq's bin script at ../shared/nsq/bin)")
    env = _child_env(GOMAXPROCS=str(s.connections)) if s.connections else _child_env()
    cmd = [str(folder / tool), f"--nsqd-tcp-address={address[0]}:{address[1]}", f"--topic={TOPIC}",
           f"--size={s.size}", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)


def finish_nsq(proc: subprocess.Popen, s: Scenario, what: str) -> dict:
    """Wait for an nsq bench tool and read its result line; raises RuntimeError on failure."""
    out = proc.communicate()[0].decode(errors="replace")
    found = NSQ_RESULT.search(out)
    if proc.returncode != 0 or found is None:
        raise RuntimeError(f"{what} failed ({proc.returncode}): {out.strip()[-500:]}")
    duration = parse_duration(found.group(1))
    rate = float(found.group(3))
    return {"tool": what, "messages": round(rate * duration), "duration_s": duration, "msgs_per_s": rate,
            "mib_per_s": float(found.group(2))}


def nsq_deadline() -> str:
    """A start time for nsq's tools (whole seconds, UTC, their layout) at least STEP_DELAY away."""
    start = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=STEP_DELAY + 1)
    return start.strftime("%Y-%m-%d %H:%M:%S")


def wrk_script(s: Scenario, work: Path) -> Path:
    """The Lua script that makes wrk POST the scenario's body."""
    path = work / f"wrk-{s.batch}x{s.size}.lua"
    body = "\\n".join(["a" * s.size] * s.batch) if s.batch > 1 else "a" * s.size
    path.write_text(f'wrk.method = "POST"\nwrk.body = "{body}"\n'
                    'wrk.headers["Content-Type"] = "application/octet-stream"\n')
    return path


def run_wrk(s: Scenario, address: tuple[str, int], runfor: float, work: Path) -> dict:
    """``wrk`` against the broker's HTTP listener; every answer must be 200. Raises RuntimeError."""
    if shutil.which("wrk") is None:
        raise RuntimeError("wrk is not installed (Debian: apt-get install wrk)")
    seconds = max(1, round(runfor))
    url = f"http://{address[0]}:{address[1]}{s.path}?topic={TOPIC}"
    cmd = ["wrk", f"-t{WRK_THREADS}", f"-c{WRK_CONNECTIONS}", f"-d{seconds}s", "-s", str(wrk_script(s, work)), url]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    rate = re.search(r"Requests/sec:\s+([\d.]+)", done.stdout)
    total = re.search(r"(\d+) requests in ([\d.]+)(\w+)", done.stdout)
    if done.returncode != 0 or rate is None or total is None:
        raise RuntimeError(f"wrk failed ({done.returncode}): {(done.stdout + done.stderr).strip()[-500:]}")
    for problem in ("Non-2xx or 3xx responses", "Socket errors"):
        if problem in done.stdout:
            raise RuntimeError(f"wrk: {done.stdout.split(problem, 1)[1].splitlines()[0].strip(': ')} {problem.lower()}")
    requests_per_s = float(rate.group(1))
    requests = int(total.group(1))
    return {"tool": "wrk", "requests": requests, "requests_per_s": requests_per_s, "messages": requests * s.batch,
            "msgs_per_s": requests_per_s * s.batch, "duration_s": float(seconds),
            "mib_per_s": requests_per_s * s.batch * s.size / 2**20}


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


def run_scenario(s: Scenario, broker_name: str, command: list[str], opts: argparse.Namespace, work: Path,
                 round_: int = 0) -> Outcome:
    """Start a fresh broker, run one scenario against it, stop it."""
    outcome = Outcome(s, broker_name, round_)
    data = Path(tempfile.mkdtemp(prefix="data-", dir=work))
    extra = [] if s.mem_queue_size is None else [f"--mem-queue-size={s.mem_queue_size}"]
    profiled = broker_name == PYNSQD and opts.profile is not None
    label = f"{s.name} {broker_name} {round_}" if opts.rounds > 1 else f"{s.name} {broker_name}"
    cprofile_out = None
    if profiled and opts.profile == "cprofile":
        cprofile_out = opts.profile_dir / (re.sub(r"[^A-Za-z0-9]+", "_", label) + ".prof")
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
        profiler = Profiler(opts.profile if profiled else None, opts.profile_dir, label, broker.pid,
                            opts.profile_rate)
        cpu0 = broker.cpu_seconds()
        busy0 = machine_busy_seconds()
        harness0 = harness_cpu_seconds()
        window0 = time.monotonic()
        if s.tool == "wrk":
            assert broker.http_address is not None
            outcome.writer = run_wrk(s, broker.http_address, opts.runfor, work)
        elif s.tool == "nsq":
            _run_nsq(s, address, outcome, opts)
        else:
            _run_bench(s, address, outcome, opts)
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


def _run_bench(s: Scenario, address: tuple[str, int], outcome: Outcome, opts: argparse.Namespace) -> None:
    """The measured phase with pynsqd's bench tool (the prefill of "reader" is done)."""
    runfor = f"--runfor={opts.runfor}s"
    conns = opts.connections
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


def _run_nsq(s: Scenario, address: tuple[str, int], outcome: Outcome, opts: argparse.Namespace) -> None:
    """The measured phase with nsq's bench_writer (and bench_reader for "both", in step)."""
    runfor = f"--runfor={opts.runfor}s"
    writer_flags = [f"--batch-size={s.batch}", runfor]
    if s.role == "writer":
        outcome.writer = finish_nsq(nsq_tool("bench_writer", address, s, writer_flags), s, "bench_writer")
        return
    deadline = f"--deadline={nsq_deadline()}"
    reader = nsq_tool("bench_reader", address, s, [f"--channel={CHANNEL}", f"--rdy={opts.rdy}", runfor, deadline])
    writer = nsq_tool("bench_writer", address, s, [*writer_flags, deadline])
    outcome.writer = finish_nsq(writer, s, "bench_writer")
    outcome.reader = finish_nsq(reader, s, "bench_reader")


def run_side_by_side(opts: argparse.Namespace, work: Path, chosen: list[Scenario]) -> list[Outcome]:
    """Every scenario ``opts.rounds`` times on each broker, alternating which goes first."""
    outcomes = []
    for s in chosen:
        for round_ in range(opts.rounds):
            order = opts.brokers if round_ % 2 == 0 else opts.brokers[::-1]
            for name, command in order:
                print(f"# {s.name} [{name}, round {round_ + 1}/{opts.rounds}] ...", file=sys.stderr, flush=True)
                o = run_scenario(s, name, list(command), opts, work, round_)
                outcomes.append(o)
                if o.error:
                    print(f"#   error: {o.error}", file=sys.stderr, flush=True)
                else:
                    rates = ", ".join(f"{role} {r['msgs_per_s']:,.0f} msgs/s"
                                      for role, r in (("writer", o.writer), ("reader", o.reader)) if r)
                    print(f"#   {rates}; broker {o.broker_cpu_s:.1f} CPU s, peak RSS {o.peak_rss_mb:.0f} MB",
                          file=sys.stderr, flush=True)
    return outcomes


def _roles(s: Scenario) -> tuple[str, ...]:
    return ("writer", "reader") if s.role == "both" else (s.role,)


def summarize(outcomes: list[Outcome], brokers: list[str]) -> list[dict]:
    """Per scenario and role: each broker's rates (msgs/s) run by run, their median, the median
    broker CPU, and pynsqd / nsqd of the medians."""
    rows: dict[tuple[str, str], dict] = {}
    for o in outcomes:
        for role in _roles(o.scenario):
            row = rows.setdefault((o.scenario.name, role), {
                "scenario": o.scenario.name, "role": role, "both": o.scenario.role == "both",
                **{b: {"runs": [], "cpu_percent": [], "errors": []} for b in brokers}})
            side = row[o.broker]
            result = getattr(o, role)
            if o.error or result is None:
                side["errors"].append((o.error or "no result").splitlines()[0])
            else:
                side["runs"].append(result["msgs_per_s"])
                side["cpu_percent"].append(o.broker_cpu_percent)
    for row in rows.values():
        for b in brokers:
            side = row[b]
            side["median"] = statistics.median(side["runs"]) if side["runs"] else None
            cpu = [c for c in side["cpu_percent"] if c is not None]
            side["cpu_percent"] = statistics.median(cpu) if cpu else None
        py, ref = row[PYNSQD]["median"], row[NSQD]["median"] if NSQD in row else None
        row["ratio"] = py / ref if py is not None and ref else None
    return list(rows.values())


def comparison_table(summary: list[dict]) -> str:
    """The side-by-side medians and ratios as one Markdown table."""
    head = ["scenario", "nsqd msgs/s", "pynsqd msgs/s", "pynsqd/nsqd", "nsqd CPU", "pynsqd CPU",
            "runs, k msgs/s (nsqd; pynsqd)"]
    rows = []
    for row in summary:
        ref, py = row[NSQD], row[PYNSQD]
        name = row["scenario"] + (f": {row['role']}" if row.get("both") else "")
        rows.append([name, _num(ref["median"]), _num(py["median"]),
                     "-" if row["ratio"] is None else f"{row['ratio']:.2f}",
                     _percent(ref["cpu_percent"]), _percent(py["cpu_percent"]), f"{_runs(ref)}; {_runs(py)}"])
    return _markdown(head, rows)


def _runs(side: dict) -> str:
    text = " ".join(f"{x / 1000:,.1f}" for x in side["runs"])
    return text + (f" ({len(side['errors'])} failed)" if side["errors"] else "")


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _markdown(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    fmt = "| " + " | ".join("{:<%d}" % w if i == 0 else "{:>%d}" % w for i, w in enumerate(widths)) + " |"
    sep = "|" + "|".join("-" * (w + 1) + (":" if i else "-") for i, w in enumerate(widths)) + "|"
    return "\n".join([fmt.format(*head), sep, *(fmt.format(*row) for row in rows)])


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
    """Every run with its details (rates, latencies, CPU, memory, machine load) as one Markdown table."""
    head = ["scenario", "writer msgs/s", "writer MB/s", "reader msgs/s", "reader MB/s", "p50 ms", "p99 ms",
            "p999 ms", "broker CPU", "broker peak RSS MB", "tool CPU", "other load"]
    rows = []
    for o in outcomes:
        name = o.scenario.name + (f" [{o.broker} {o.round + 1}]" if len(set(x.broker for x in outcomes)) > 1
                                  or any(x.round for x in outcomes) else "")
        if o.error:
            rows.append([name, f"error: {o.error.splitlines()[0][:80]}"] + [""] * (len(head) - 2))
            continue
        w, r = o.writer or {}, o.reader or {}
        lat = r.get("latency_ms") or {}
        rows.append([
            name,
            _num(w.get("msgs_per_s")), _num(w.get("mib_per_s"), 1),
            _num(r.get("msgs_per_s")), _num(r.get("mib_per_s"), 1),
            _num(lat.get("p50_ms"), 2), _num(lat.get("p99_ms"), 2), _num(lat.get("p999_ms"), 2),
            _percent(o.broker_cpu_percent),
            _num(o.peak_rss_mb),
            f"{100 * o.tool_cpu_s / o.measured_s:.0f}%" if o.measured_s else "-",
            f"{100 * o.other_cpu_s / o.window_s:.0f}%" if o.window_s else "-",
        ])
    return _markdown(head, rows)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2 s per run instead of 10 s")
    p.add_argument("--runfor", type=parse_duration, default=None, help="time per run (default 10s)")
    p.add_argument("--rounds", type=int, default=3,
                   help="runs per scenario and broker, alternating the brokers (default 3; the table gives medians)")
    p.add_argument("--only", action="append", default=[], metavar="TEXT",
                   help="run the rows whose name contains TEXT (repeatable, all must match), the matrix's included")
    p.add_argument("--matrix", action="store_true",
                   help="run the matrix of pynsqd's bench tool instead of the comparison rows")
    p.add_argument("--connections", type=int, default=2, help="connections per pynsqd bench tool (default 2)")
    p.add_argument("--rdy", type=int, default=2500, help="RDY per reader connection (default 2500)")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    p.add_argument("--broker-cmd", default=f"{shlex.quote(sys.executable)} -m broker",
                   help="command that starts pynsqd (default: python -m broker)")
    p.add_argument("--nsqd-cmd", default=None,
                   help="command that starts the reference nsqd (default: nsq 1.3.0's, as the tests find it)")
    p.add_argument("--no-nsqd", action="store_true",
                   help="run pynsqd alone and print every run's details (rates, latencies, CPU, memory)")
    p.add_argument("--profile", choices=("py-spy", "cprofile"), default=None,
                   help="profile pynsqd during each measured phase")
    p.add_argument("--profile-dir", type=Path, default=None, help="where profiles go (default: a temp dir)")
    p.add_argument("--profile-rate", type=int, default=250, help="py-spy samples per second (default 250)")
    p.add_argument("--memory", action="store_true",
                   help="instead of the rows: a 100 B backlog in a channel nobody reads, pynsqd's peak RSS")
    p.add_argument("--memory-count", type=int, default=10_000_000, help="backlog size (default 10000000)")
    p.add_argument("--memory-drain", action="store_true", help="then drain the backlog with bench reader")
    p.add_argument("--keep-data", action="store_true", help="keep the brokers' data directories")
    p.add_argument("--render", type=Path, default=None, metavar="FILE",
                   help="print the table of a saved --json run instead of running anything")
    opts = p.parse_args(argv)
    opts.runfor = opts.runfor or (2.0 if opts.quick else 10.0)
    opts.command = shlex.split(opts.broker_cmd)
    if opts.rounds < 1:
        p.error("--rounds must be at least 1")
    opts.brokers = [(PYNSQD, opts.command)]
    if not opts.no_nsqd:
        nsqd = shlex.split(opts.nsqd_cmd) if opts.nsqd_cmd else _nsqd_command()
        if nsqd is None:
            p.error("nsq 1.3.0's nsqd is not here (set NSQ_BIN, or put nsq's bin script at ../shared/nsq/bin; "
                    "or run pynsqd alone with --no-nsqd)")
        opts.brokers.insert(0, (NSQD, nsqd))
    return opts


def _nsqd_command() -> list[str] | None:
    folder = nsq_bin()
    return None if folder is None else [str(folder / "nsqd")]


def _header(opts: argparse.Namespace, chosen: list[Scenario]) -> str:
    brokers = "; ".join(f"{name}: {shlex.join(command)}" for name, command in opts.brokers)
    return (f"# {brokers}\n# {opts.runfor:g}s per run, {opts.rounds} round(s) per broker alternating, medians; "
            f"nsq's tools: GOMAXPROCS connections (2 unless given); wrk: {WRK_THREADS} threads, "
            f"{WRK_CONNECTIONS} connections; pynsqd bench: {opts.connections} connections, reader RDY {opts.rdy}")


def render(data: dict | list) -> str:
    """The tables of a saved ``--json`` run."""
    if isinstance(data, list):  # a single-broker run
        return table([Outcome.from_dict(d) for d in data])
    return comparison_table(data["summary"])


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    if opts.render is not None:
        print(render(json.loads(opts.render.read_text())))
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
        chosen = scenarios(opts.only, opts.matrix)
        if not chosen:
            print(f"no row matches {opts.only}", file=sys.stderr)
            return 2
        outcomes = run_side_by_side(opts, work, chosen)
    side_by_side = len(opts.brokers) > 1
    summary = summarize(outcomes, [name for name, _ in opts.brokers]) if side_by_side else []
    if opts.json:
        runs = [o.as_dict() for o in outcomes]
        print(json.dumps({"brokers": {name: command for name, command in opts.brokers}, "runfor_s": opts.runfor,
                          "rounds": opts.rounds, "summary": summary, "runs": runs} if side_by_side else runs,
                         indent=2))
    else:
        print(_header(opts, chosen))
        print(comparison_table(summary) if side_by_side else table(outcomes))
        for o in outcomes:
            if o.profile:
                print(f"\n## profile: {o.scenario.name} round {o.round + 1} "
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
