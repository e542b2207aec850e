"""The load generators: nsq's bench_writer/bench_reader, wrk for HTTP, pynsqd's bench tool;
each started, waited for and parsed."""

from __future__ import annotations

import argparse
import datetime
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

from broker.bench.arguments import parse_duration
from broker.bench.opening import BenchConnection
from tests.bench.matrix.brokers import ROOT, child_env
from tests.bench.matrix.rows import CHANNEL, STEP_DELAY, TOPIC, WRK_CONNECTIONS, WRK_THREADS, Outcome, Scenario
from tests.support.paths import nsq_bin

#: what nsq's bench tools print at the end: "duration: 10.0s - 36.5mb/s - 382990.123ops/s - 2.611us/op"
NSQ_RESULT = re.compile(r"duration: (\S+) - ([\d.]+)mb/s - ([\d.]+)ops/s")


def bench(tool: str, address: tuple[str, int], args: list[str]) -> subprocess.Popen:
    """Start ``python -m broker.bench TOOL`` with JSON output."""
    cmd = [sys.executable, "-m", "broker.bench", tool, f"--nsqd-tcp-address={address[0]}:{address[1]}",
           "--json", "--progress=0", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=child_env())


def finish(proc: subprocess.Popen, what: str) -> dict:
    """Wait for a bench process and parse its JSON; raises RuntimeError on failure."""
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed ({proc.returncode}): {err.decode(errors='replace').strip()}")
    return json.loads(out)


def nsq_tool(tool: str, address: tuple[str, int], s: Scenario, args: list[str],
             connections: int | None = None) -> subprocess.Popen:
    """Start nsq's ``bench_writer`` or ``bench_reader`` with ``connections`` connections (default
    ``s.connections``; neither tool has a flag for it: each opens ``GOMAXPROCS`` of them)."""
    folder = nsq_bin()
    if folder is None:
        raise RuntimeError("nsq's bench tools are not here (set NSQ_BIN, or put nsq's bin script at ../shared/nsq/bin)")
    connections = connections or s.connections
    env = child_env(GOMAXPROCS=str(connections)) if connections else child_env()
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


def channel_names(count: int) -> list[str]:
    """The channels of a fan-out row: ch0, ch1, ..."""
    return [f"{CHANNEL}{i}" for i in range(count)]


def http_post(http_address: tuple[str, int], path: str, **params: str) -> None:
    """``POST path?params`` to a broker's HTTP listener; raises RuntimeError unless it answers 200."""
    url = f"http://{http_address[0]}:{http_address[1]}{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST"), timeout=10) as answer:
            answer.read()
    except OSError as exc:  # urllib's HTTPError and URLError included
        raise RuntimeError(f"POST {path} {params}: {exc}") from None


def create_channels_http(http_address: tuple[str, int], topic: str, channels: list[str]) -> None:
    """``POST /topic/create``, then ``POST /channel/create`` for each channel (nsqd's needs the topic)."""
    http_post(http_address, "/topic/create", topic=topic)
    for name in channels:
        http_post(http_address, "/channel/create", topic=topic, channel=name)


def topic_stats(http_address: tuple[str, int], topic: str) -> dict | None:
    """The topic's entry of ``GET /stats?format=json`` (channels without their clients), or None."""
    query = urllib.parse.urlencode({"format": "json", "topic": topic, "include_clients": "false"})
    url = f"http://{http_address[0]}:{http_address[1]}/stats?{query}"
    with urllib.request.urlopen(url, timeout=10) as answer:
        doc = json.loads(answer.read())
    doc = doc.get("data", doc)  # nsqd answers a V1 client's Accept with a {"data": ...} wrapper
    return next((t for t in doc.get("topics") or () if t["topic_name"] == topic), None)


def create_channel(address: tuple[str, int], topic: str, channel: str) -> None:
    """Create a topic's channel by subscribing once (it outlives the subscriber)."""
    conn = BenchConnection.open(*address, "bench_matrix", {})
    try:
        conn.subscribe(topic, channel)
    finally:
        conn.close()


def run_bench(s: Scenario, address: tuple[str, int], outcome: Outcome, opts: argparse.Namespace) -> None:
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


def run_nsq(s: Scenario, address: tuple[str, int], outcome: Outcome, opts: argparse.Namespace) -> None:
    """The measured phase with nsq's bench_writer (and bench_reader for "both", in step)."""
    runfor = f"--runfor={opts.runfor}s"
    writer_flags = [f"--batch-size={s.batch}", runfor]
    if s.role == "writer":
        outcome.writer = finish_nsq(nsq_tool("bench_writer", address, s, writer_flags), s, "bench_writer")
        return
    deadline = f"--deadline={nsq_deadline()}"
    reader = nsq_tool("bench_reader", address, s, [f"--channel={CHANNEL}", f"--rdy={opts.rdy}", runfor, deadline],
                      s.readers)
    writer = nsq_tool("bench_writer", address, s, [*writer_flags, deadline])
    outcome.writer = finish_nsq(writer, s, "bench_writer")
    outcome.reader = finish_nsq(reader, s, "bench_reader")
