"""The broker's memory while a topic with many channels builds a backlog nobody reads.

Starts a fresh broker (``python -m broker`` from this checkout, ``--durable`` unless
``--no-durable``) on a temporary data path, creates a topic with ``--channels`` channels
over HTTP, and publishes ``--count`` messages of ``--size`` bytes (``python -m broker.bench
writer``: MPUB batches of 200 on two pipelined connections) while nobody reads. At every
tenth of the backlog it prints what ``/stats`` says (the topic's ``message_count``, the
first and last channel's depth) and the broker's resident memory (``VmRSS``) and its peak
(``VmHWM``) from ``/proc``, so whether memory grows with the backlog shows row by row.
The disk must hold the backlog: durable, one copy per channel (about 135 B a message).

Usage (from the repository root)::

    python -m tests.bench.bench_backlog_memory                          # 30 channels, 1 M, durable
    python -m tests.bench.bench_backlog_memory --count 10000000         # the 10 M backlog
    python -m tests.bench.bench_backlog_memory --no-durable --channels 10
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tests.bench.bench_durable import ROOT, Broker, _env
from tests.bench.matrix.brokers import process_memory_mb

TOPIC = "backlog"


def _http(address: str, method: str, target: str) -> bytes:
    with urllib.request.urlopen(urllib.request.Request(f"http://{address}{target}", method=method),
                                timeout=30) as reply:
        return reply.read()


def _topic_stats(address: str) -> dict:
    doc = json.loads(_http(address, "GET", f"/stats?format=json&topic={TOPIC}&include_clients=false"))
    return doc["topics"][0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--channels", type=int, default=30, help="channels of the topic (default 30)")
    parser.add_argument("--count", type=int, default=1_000_000, help="messages to publish (default 1,000,000)")
    parser.add_argument("--size", type=int, default=100, help="message body bytes (default 100)")
    parser.add_argument("--no-durable", action="store_true", help="run without --durable")
    parser.add_argument("--data-path", help="where the broker's data goes (default: a temporary directory)")
    opts = parser.parse_args()
    flags = [] if opts.no_durable else ["--durable"]
    with tempfile.TemporaryDirectory(prefix="backlog-", dir=opts.data_path) as tmp, \
            Broker(Path(tmp) / "data", flags) as broker:
        assert broker.proc is not None
        pid = broker.proc.pid
        http = f"{broker.http[0]}:{broker.http[1]}"
        _http(http, "POST", f"/topic/create?topic={TOPIC}")
        names = [f"c{i:02d}" for i in range(opts.channels)]
        for name in names:
            _http(http, "POST", f"/channel/create?topic={TOPIC}&channel={name}")
        writer = subprocess.Popen(
            [sys.executable, "-m", "broker.bench", "writer", f"--nsqd-tcp-address={broker.tcp[0]}:{broker.tcp[1]}",
             f"--topic={TOPIC}", f"--size={opts.size}", "--batch-size=200", "--connections=2", "--pipeline=2",
             f"--count={opts.count}", "--runfor=24h", "--progress=0", "--json"],
            cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        mode = "durable" if flags else "default"
        print(f"# {opts.channels} channels, {opts.count:,} x {opts.size} B, {mode}")
        print("| published | first channel depth | last channel depth | RSS MB | peak RSS MB | s |")
        print("|---:|---:|---:|---:|---:|---:|")
        start = time.monotonic()
        step = max(1, opts.count // 10)
        mark = step
        while True:
            done = writer.poll() is not None
            stats = _topic_stats(http)
            if stats["message_count"] >= mark or done:
                depths = {c["channel_name"]: c["depth"] for c in stats["channels"]}
                peak, rss = process_memory_mb(pid)
                print(f"| {stats['message_count']:,} | {depths[names[0]]:,} | {depths[names[-1]]:,} | "
                      f"{rss:.0f} | {peak:.0f} | {time.monotonic() - start:.0f} |", flush=True)
                mark = stats["message_count"] // step * step + step
            if done:
                break
            time.sleep(0.5)
        if writer.returncode:
            print(f"writer exited with status {writer.returncode}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
