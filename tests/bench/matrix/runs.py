"""Running the rows: one scenario on one broker, every row side by side, the memory run."""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

from tests.bench.matrix.brokers import BrokerProcess, harness_cpu_seconds, machine_busy_seconds
from tests.bench.matrix.disk import DiskMeter
from tests.bench.matrix.loads import (
    bench,
    channel_names,
    create_channel,
    create_channels_http,
    finish,
    http_post,
    reader_args,
    run_bench,
    run_nsq,
    run_wrk,
    topic_stats,
    writer_args,
)
from tests.bench.matrix.profiling import Profiler, summarize_cprofile
from tests.bench.matrix.rows import CHANNEL, PYNSQD, TOPIC, Outcome, Scenario


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
    disk = None
    try:
        address = broker.start()
        if s.channels:
            http = broker.http_address
            assert http is not None
            create_channels_http(http, TOPIC, channel_names(s.channels))
            disk = DiskMeter(data, broker.pid, s.channels, lambda: topic_stats(http, TOPIC))
            disk.start()
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
            run_nsq(s, address, outcome, opts)
        else:
            run_bench(s, address, outcome, opts)
        outcome.broker_cpu_s = broker.cpu_seconds() - cpu0
        outcome.busy_s = machine_busy_seconds() - busy0
        outcome.harness_cpu_s = harness_cpu_seconds() - harness0
        outcome.window_s = time.monotonic() - window0
        outcome.profile, profiler = profiler.stop(), None
        outcome.measured_s = max(r["duration_s"] for r in (outcome.writer, outcome.reader) if r)
        outcome.peak_rss_mb, outcome.rss_mb = broker.memory_mb()
        if disk is not None:
            outcome.disk = disk.finish()
            # measured: empty the channels, or stopping would first write out every message held
            # in memory (nsqd needs minutes for 30 channels x 2,000,000)
            assert broker.http_address is not None
            for name in channel_names(s.channels or 0):
                http_post(broker.http_address, "/channel/empty", topic=TOPIC, channel=name)
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
