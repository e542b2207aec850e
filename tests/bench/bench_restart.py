"""Restart time with many topics: pynsqd against nsq 1.3.0's nsqd, side by side.

For each broker: write ``nsqd.dat`` (nsqd's format, which both read) naming ``--topics``
topics (``bench_restart_00000`` ...) with one channel each into a fresh temporary data
path, start the broker on it (it creates the topics, channels and their files), publish
``--messages`` messages of 100 B to every topic over HTTP (0: the queues stay empty), and
stop it with SIGTERM. (Creating them over ``/topic/create`` instead rewrites ``nsqd.dat``
for each one, in both brokers: quadratic in the count, minutes for 10,000.) Then restart each broker ``--rounds`` times on its directory,
alternately (nsqd first, then pynsqd first, ...), and time from ``exec`` to

- ``/ping``: the first ``200 OK`` of ``GET /ping`` (polled every few milliseconds);
- ``loaded``: the first ``GET /stats?format=json`` that shows every topic with its
  channel, and every channel's depth equal to ``--messages``.

With ``--from-nsqd`` pynsqd is not restarted on its own directory: the topics are created
and the messages published by nsqd alone, and each round starts pynsqd on a fresh copy of
the directory nsqd left, so every round is a first start that imports nsqd's queues (see
"Moving from nsqd" in deploy/README.md); ``import`` is the duration the import logs. nsqd, if
run, restarts on its own copy as before, for comparison.

Then, loaded and with no client connected, each broker's idle CPU: its user + system
time (``/proc/PID/stat``) over ``--idle`` seconds (default 10; 0 skips it), in percent of
one core. The brokers run with their default options but for the addresses and data path
(``--broker-cmd`` and ``--nsqd-cmd`` add any). Shutdown time (SIGTERM to exit) is
reported too. nsqd is nsq's own, found as the tests find it (``$NSQ_BIN``, or the
``shared/nsq/bin`` script beside the checkout).

The checkout's modules are compiled to bytecode first (``compileall``), as an installed
package's are (pip compiles them at install; Python caches them at a first import unless
``PYTHONDONTWRITEBYTECODE`` is set): otherwise every start would compile pynsqd's source
again, which no installed broker does. A ``--broker-cmd`` running another checkout
should have its modules compiled the same way (``python -m compileall -q broker diskqueue``).

Usage (from the repository root)::

    python -m tests.bench.bench_restart --topics 10000
    python -m tests.bench.bench_restart --topics 1000 5000 10000 --messages 0 1 --rounds 3
    python -m tests.bench.bench_restart --topics 2000 --no-nsqd --json
    python -m tests.bench.bench_restart --topics 10000 --messages 1 --from-nsqd --rounds 1 --idle 0
"""

from __future__ import annotations

import argparse
import compileall
import http.client
import json
import os
import re
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.paths import nsq_bin
from tests.support.processes import stop_process

ROOT = Path(__file__).resolve().parents[2]

PYNSQD, NSQD = "pynsqd", "nsqd"
TOPIC_PREFIX = "bench_restart_"
CHANNEL = "ch"
BODY = b"x" * 100
#: seconds a broker may take to answer /ping, or to exit after SIGTERM
START_TIMEOUT = 300.0
STOP_TIMEOUT = 300.0
#: seconds between polls of /ping and /stats while a broker starts
POLL_INTERVAL = 0.005
#: the line pynsqd logs when it has imported nsqd's queues
IMPORTED = re.compile(r"nsqd import: imported \d+ message\(s\) of \d+ nsqd queue\(s\) in ([\d.]+) s")


def free_port() -> int:
    """A TCP port nothing listens on now (the broker binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def topic_name(i: int) -> str:
    return f"{TOPIC_PREFIX}{i:05d}"


class Broker:
    """One broker's command and data directory; started and stopped once per run."""

    def __init__(self, name: str, command: list[str], data_path: Path, log_path: Path,
                 start_timeout: float = START_TIMEOUT):
        self.name = name
        self.start_timeout = start_timeout
        self.command = command
        self.data_path = data_path
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.http_port = 0

    def start(self) -> float:
        """Exec the broker on fresh ports; returns the monotonic time of the exec."""
        self.http_port = free_port()
        tcp_port = free_port()
        argv = [*self.command, f"--data-path={self.data_path}", f"--http-address=127.0.0.1:{self.http_port}",
                f"--tcp-address=127.0.0.1:{tcp_port}"]
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        with open(self.log_path, "ab") as log:
            started = time.monotonic()
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=ROOT, env=env)
        return started

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=self.start_timeout)

    def wait_ping(self) -> float:
        """Poll ``/ping`` until it answers 200; returns the monotonic time it did."""
        limit = time.monotonic() + self.start_timeout
        while time.monotonic() < limit:
            self._check_alive()
            try:
                conn = self.connection()
                conn.request("GET", "/ping")
                status = conn.getresponse().status
                conn.close()
                if status == 200:
                    return time.monotonic()
            except OSError:
                pass
            time.sleep(POLL_INTERVAL)
        raise RuntimeError(f"{self.name} did not answer /ping within {self.start_timeout:g}s")

    def wait_loaded(self, topics: int, depth: int) -> float:
        """Poll ``/stats`` until it shows ``topics`` topics, each with its channel holding
        ``depth`` messages; returns the monotonic time it did."""
        limit = time.monotonic() + self.start_timeout
        conn = self.connection()
        try:
            while time.monotonic() < limit:
                self._check_alive()
                conn.request("GET", "/stats?format=json")
                response = conn.getresponse()
                body = response.read()
                if response.status == 200 and _loaded(json.loads(body), topics, depth):
                    return time.monotonic()
                time.sleep(POLL_INTERVAL)
        finally:
            conn.close()
        raise RuntimeError(f"{self.name} did not show {topics} topics in /stats within {self.start_timeout:g}s")

    def stop(self) -> float:
        """SIGTERM and wait for the exit; returns the seconds it took. Raises on a failed exit."""
        assert self.proc is not None
        started = time.monotonic()
        status = stop_process(self.proc, STOP_TIMEOUT)
        if status is None:
            raise RuntimeError(f"{self.name} did not exit within {STOP_TIMEOUT:g}s of SIGTERM")
        if status != 0:
            raise RuntimeError(f"{self.name} exited with status {status}; see {self.log_path}")
        return time.monotonic() - started

    def idle_cpu(self, seconds: float) -> float:
        """The broker's CPU time (user + system) over the next ``seconds``, in percent of one core."""
        assert self.proc is not None
        before, started = _cpu_seconds(self.proc.pid), time.monotonic()
        time.sleep(seconds)
        return 100 * (_cpu_seconds(self.proc.pid) - before) / (time.monotonic() - started)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def _check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace").splitlines()[-10:]
            raise RuntimeError(f"{self.name} exited with status {self.proc.returncode}:\n" + "\n".join(tail))


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def _loaded(stats: dict, topics: int, depth: int) -> bool:
    """Whether ``/stats`` (nsqd's shape; pynsqd's is the same) shows every topic, channel and message."""
    stats = stats.get("data", stats)  # nsqd 0.x wrapped it in "data"
    found = stats.get("topics") or []
    if len(found) != topics:
        return False
    for topic in found:
        channels = topic.get("channels") or []
        if len(channels) != 1 or channels[0].get("depth") != depth:
            return False
    return True


def write_metadata(data_path: Path, topics: int) -> None:
    """``nsqd.dat`` naming the topics, each with its channel, as nsqd 1.3.0 writes it."""
    entries = [{"channels": [{"name": CHANNEL, "paused": False}], "name": topic_name(i), "paused": False}
               for i in range(topics)]
    (data_path / "nsqd.dat").write_text(json.dumps({"topics": entries, "version": "1.3.0"}))


def populate(broker: Broker, topics: int, messages: int) -> None:
    """Publish ``messages`` to each topic over HTTP."""
    if not messages:
        return
    conn = broker.connection()
    try:
        for i in range(topics):
            _post(conn, f"/mpub?topic={topic_name(i)}", b"\n".join([BODY] * messages))
    finally:
        conn.close()


def _post(conn: http.client.HTTPConnection, path: str, body: bytes = b"") -> None:
    conn.request("POST", path, body=body)
    response = conn.getresponse()
    answer = response.read()
    if response.status != 200:
        raise RuntimeError(f"POST {path}: {response.status} {answer[:200]!r}")


@dataclass
class Runs:
    """One broker's timings at one size, in seconds."""

    ping: list[float] = field(default_factory=list)
    loaded: list[float] = field(default_factory=list)
    stop: list[float] = field(default_factory=list)
    idle_cpu: list[float] = field(default_factory=list)
    imports: list[float] = field(default_factory=list)  # --from-nsqd: what the import logged it took
    populate_s: float = 0.0

    def as_dict(self) -> dict:
        return {"ping_s": self.ping, "loaded_s": self.loaded, "stop_s": self.stop, "populate_s": self.populate_s,
                "ping_median_s": statistics.median(self.ping), "loaded_median_s": statistics.median(self.loaded),
                "stop_median_s": statistics.median(self.stop), "idle_cpu_percent": self.idle_cpu,
                "idle_cpu_median_percent": statistics.median(self.idle_cpu) if self.idle_cpu else None,
                "import_s": self.imports, "import_median_s": statistics.median(self.imports) if self.imports else None}


def run_size(brokers: list[tuple[str, list[str]]], topics: int, messages: int, rounds: int,
             work: Path, idle: float = 0.0, from_nsqd: bool = False, nsqd_rounds: bool = True,
             start_timeout: float = START_TIMEOUT) -> dict[str, Runs]:
    """Populate each broker, then restart them alternately ``rounds`` times each; with
    ``from_nsqd``, nsqd populates one directory and pynsqd starts on a fresh copy of it each
    round (nsqd restarts only with ``nsqd_rounds``)."""
    each: dict[str, Broker] = {}
    results: dict[str, Runs] = {}
    template = work / f"nsqd-{topics}-{messages}-as-left"
    for name, command in brokers:
        data = work / f"{name}-{topics}-{messages}"
        if from_nsqd and name == PYNSQD:
            each[name] = Broker(name, command, data, work / f"{name}-{topics}-{messages}.log", start_timeout)
            continue
        data.mkdir()
        broker = Broker(name, command, data, work / f"{name}-{topics}-{messages}.log", start_timeout)
        each[name] = broker
        print(f"# {name}: creating {topics} topics with a channel, {messages} message(s) each", file=sys.stderr)
        try:
            started = time.monotonic()
            write_metadata(data, topics)
            broker.start()
            broker.wait_ping()
            broker.wait_loaded(topics, 0)
            populate(broker, topics, messages)
            results[name] = Runs(populate_s=time.monotonic() - started)
            broker.stop()
        finally:
            broker.kill()
        if from_nsqd:
            shutil.copytree(data, template, symlinks=True)
    if from_nsqd:
        results[PYNSQD] = Runs()
        if not nsqd_rounds:
            del results[NSQD]
    order = [name for name, _ in brokers if name in results]
    for r in range(rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            broker = each[name]
            if from_nsqd and name == PYNSQD:  # a first start on what nsqd left, every round
                shutil.rmtree(broker.data_path, ignore_errors=True)
                shutil.copytree(template, broker.data_path, symlinks=True)
                broker.log_path.unlink(missing_ok=True)
            try:
                execed = broker.start()
                pinged = broker.wait_ping()
                loaded = broker.wait_loaded(topics, messages)
                runs = results[name]
                runs.ping.append(pinged - execed)
                runs.loaded.append(loaded - execed)
                if idle > 0:
                    runs.idle_cpu.append(broker.idle_cpu(idle))
                runs.stop.append(broker.stop())
            finally:
                broker.kill()
            if from_nsqd and name == PYNSQD:
                imported = IMPORTED.search(broker.log_path.read_text(errors="replace"))
                if imported is not None:
                    runs.imports.append(float(imported.group(1)))
            idle_text = f", idle CPU {runs.idle_cpu[-1]:.1f}%" if runs.idle_cpu else ""
            import_text = f", import {runs.imports[-1]:.2f}s" if runs.imports and name == PYNSQD and from_nsqd else ""
            print(f"# {name} {topics} topics, {messages} msg(s): round {r + 1}: /ping {runs.ping[-1]:.2f}s, "
                  f"loaded {runs.loaded[-1]:.2f}s{import_text}{idle_text}, stop {runs.stop[-1]:.2f}s", file=sys.stderr)
    return results


def table(results: list[dict], names: list[str]) -> str:
    head = ["topics + 1 channel each", "msgs per topic"]
    imports = [name for name in names if any(r["brokers"][name]["import_s"] for r in results)]
    for name in names:
        head += [f"{name} exec→/ping s", f"{name} exec→loaded s", f"{name} stop s", f"{name} idle CPU"]
        if name in imports:
            head.append(f"{name} import s")
    if len(names) == 2:
        head.append(f"{names[1]} / {names[0]} loaded")
    rows = []
    for result in results:
        row = [f"{result['topics']:,}", str(result["messages"])]
        for name in names:
            r = result["brokers"][name]
            idle = r["idle_cpu_median_percent"]
            row += [f"{r['ping_median_s']:.2f}", f"{r['loaded_median_s']:.2f}", f"{r['stop_median_s']:.2f}",
                    "-" if idle is None else f"{idle:.1f}%"]
            if name in imports:
                row.append("-" if r["import_median_s"] is None else f"{r['import_median_s']:.2f}")
        if len(names) == 2:
            a, b = (result["brokers"][n]["loaded_median_s"] for n in names)
            row.append(f"{b / a:.1f}")
        rows.append(row)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--topics", type=int, nargs="+", default=[10_000], help="topic counts to run (default 10000)")
    p.add_argument("--messages", type=int, nargs="+", default=[0],
                   help="messages of 100 B published to every topic before the stop (default 0)")
    p.add_argument("--rounds", type=int, default=3, help="restarts per broker, alternating (default 3; medians)")
    p.add_argument("--broker-cmd", default=f"{shlex.quote(sys.executable)} -m broker",
                   help="command that starts pynsqd (default: python -m broker)")
    p.add_argument("--nsqd-cmd", default=None, help="command that starts nsqd (default: nsq 1.3.0's)")
    p.add_argument("--no-nsqd", action="store_true", help="run pynsqd alone")
    p.add_argument("--from-nsqd", action="store_true",
                   help="start pynsqd on a fresh copy of the directory nsqd populated, every round (the import); "
                        "needs nsqd, which restarts on its own copy unless --no-nsqd")
    p.add_argument("--start-timeout", type=float, default=START_TIMEOUT, metavar="SECONDS",
                   help=f"seconds a start may take to /ping and to loaded (default {START_TIMEOUT:g})")
    p.add_argument("--idle", type=float, default=10.0, metavar="SECONDS",
                   help="measure each loaded broker's idle CPU over this long (default 10; 0: skip)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--keep-data", type=Path, default=None, metavar="DIR",
                   help="create the data directories and logs in DIR (new or empty) and keep them")
    opts = p.parse_args(argv)
    if opts.rounds < 1:
        p.error("--rounds must be at least 1")
    opts.brokers = [(PYNSQD, shlex.split(opts.broker_cmd))]
    if not opts.no_nsqd or opts.from_nsqd:
        if opts.nsqd_cmd:
            nsqd = shlex.split(opts.nsqd_cmd)
        else:
            folder = nsq_bin()
            if folder is None:
                p.error("nsq 1.3.0's nsqd is not here (set NSQ_BIN, or put nsq's bin script at ../shared/nsq/bin; "
                        "or run pynsqd alone with --no-nsqd)")
            nsqd = [str(folder / "nsqd")]
        opts.brokers.insert(0, (NSQD, nsqd))
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    for package in ("broker", "diskqueue"):
        compileall.compile_dir(ROOT / package, quiet=1)
    results = []
    with tempfile.TemporaryDirectory(prefix="pynsqd-restart-") as tmp:
        work = Path(tmp)
        if opts.keep_data is not None:
            work = opts.keep_data
            work.mkdir(parents=True, exist_ok=True)
        for topics in opts.topics:
            for messages in opts.messages:
                runs = run_size(opts.brokers, topics, messages, opts.rounds, work, opts.idle, opts.from_nsqd,
                                nsqd_rounds=not opts.no_nsqd, start_timeout=opts.start_timeout)
                results.append({"topics": topics, "messages": messages,
                                "brokers": {name: r.as_dict() for name, r in runs.items()}})
    names = [name for name, _ in opts.brokers if not results or name in results[0]["brokers"]]
    if opts.json:
        print(json.dumps({"brokers": dict(opts.brokers), "rounds": opts.rounds, "results": results}, indent=2))
    else:
        print("# " + "; ".join(f"{name}: {shlex.join(cmd)}" for name, cmd in opts.brokers)
              + f"; {opts.rounds} restart(s) each, alternating, medians")
        print(table(results, names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
