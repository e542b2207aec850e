"""The cost of replication: publishes a second with ``--replicas=2`` (or more) against the
same cluster shape with ``--replicas=1``, side by side in one run.

Each run starts nsq's own nsqlookupd and three pynsqd nodes registered with it (fresh data
directories), creates the topic with one channel nobody reads on the first node, waits
until that node is linked to its peers, then drives it with ``python -m broker.bench
writer``. Two workloads: MPUB of 200 x 100 B bodies (two connections), and one PUB in
flight on one connection (its round trip includes the copy's). With ``--keyed`` the same two
again from another client (tests/bench/bench_keys.py's), a fixed number of messages each,
with and without a new publish key on every message (a keyed publish also asks every peer
whether it knows its keys). Runs alternate between the
replica counts, round after round; the table reports medians and the ratio to
``--replicas=1``.

Usage (from the repository root)::

    python -m tests.bench.bench_replication                       # 3 rounds of 5 s
    python -m tests.bench.bench_replication --rounds 5 --runfor 10s --durable
    python -m tests.bench.bench_replication --replicas 1 2 3 --json
    python -m tests.bench.bench_replication --keyed --durable
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

from tests.bench import bench_keys
from tests.bench.bench_durable import TOPIC, run_writer
from tests.support.nsq_programs import NsqProgram, nsq_bin_missing
from tests.support.processes import BrokerProcess

NODES = 3
WORKLOADS = {
    "MPUB 200 x 100 B": {"connections": 2, "batch_size": 200, "size": 100},
    "PUB 1 in flight": {"connections": 1, "batch_size": 1, "size": 100},
}
#: With --keyed: the same with a key on every message, and without, from the same client
#: (tests/bench/bench_keys.py's), this many messages a run.
KEYED = {
    f"{kind} MPUB 200 x 100 B": {"connections": 2, "batch_size": 200, "messages": 200_000, "keyed": kind == "keyed"}
    for kind in ("unkeyed", "keyed")
} | {
    f"{kind} PUB 1 in flight": {"connections": 1, "batch_size": 1, "messages": 3_000, "keyed": kind == "keyed"}
    for kind in ("unkeyed", "keyed")
}


def _keyed_run(node: BrokerProcess, workload: dict) -> dict:
    connections, batch, keyed = workload["connections"], workload["batch_size"], workload["keyed"]
    per = workload["messages"] // connections
    payloads = [bench_keys._payloads(per, keyed, c, batch, TOPIC) for c in range(connections)]
    socks = [bench_keys._connect(node.tcp, keyed) for _ in range(connections)]
    elapsed = bench_keys.publish_all(socks, payloads, 1)
    return {"msgs_per_s": per * connections / elapsed}


def _http(node: BrokerProcess, method: str, path: str) -> dict:
    host, port = node.http
    with urllib.request.urlopen(urllib.request.Request(f"http://{host}:{port}{path}", method=method),
                                timeout=10) as reply:
        body = reply.read()
    return json.loads(body) if body.startswith(b"{") else {}


def _wait_linked(node: BrokerProcess, peers: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        replication = _http(node, "GET", "/stats?format=json").get("replication", {})
        if sum(peer["connected"] for peer in replication.get("peers", ())) >= peers:
            return
        time.sleep(0.1)  # another process's state: poll it
    raise RuntimeError(f"the node did not link to {peers} peers within {timeout}s")


def run_once(root: Path, replicas: int, durable: bool, workload: dict, runfor: str) -> dict:
    lookupd = NsqProgram("nsqlookupd", root / "lookupd.log", "--tcp-address=127.0.0.1:0",
                         "--http-address=127.0.0.1:0", "--broadcast-address=127.0.0.1").start()
    nodes: list[BrokerProcess] = []
    try:
        flags = [f"--lookupd-tcp-address={lookupd.address('TCP')}", "--broadcast-address=127.0.0.1",
                 f"--replicas={replicas}", *(["--durable"] if durable else [])]
        for n in range(NODES):
            nodes.append(BrokerProcess(root / f"node{n}", *flags, log_path=root / f"node{n}.log").start())
        first = nodes[0]
        _http(first, "POST", f"/topic/create?topic={TOPIC}")
        _http(first, "POST", f"/channel/create?topic={TOPIC}&channel=idle")
        if replicas > 1:
            _wait_linked(first, NODES - 1)
        if "messages" in workload:
            return _keyed_run(first, workload)
        return run_writer(first.tcp, workload["connections"], runfor, workload["batch_size"], workload["size"])
    finally:
        for node in nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.terminate(60)
        lookupd.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runfor", default="5s", help="duration of each run (default 5s)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each kind; medians are reported (default 3)")
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2], help="replica counts (default 1 2)")
    parser.add_argument("--durable", action="store_true", help="run every node with --durable")
    parser.add_argument("--only", default="", help="run only the workloads whose name contains this")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--keyed", action="store_true", help="also run both workloads with a key on every message")
    args = parser.parse_args(argv)
    workloads = {**WORKLOADS, **(KEYED if args.keyed else {})}
    missing = nsq_bin_missing()
    if missing:
        parser.error(missing)
    rows = []
    with tempfile.TemporaryDirectory(prefix="pynsqd-bench-replication-") as tmp:
        for round_ in range(args.rounds):
            for name, workload in workloads.items():
                if args.only not in name:
                    continue
                order = args.replicas if round_ % 2 == 0 else args.replicas[::-1]
                for replicas in order:
                    root = Path(tmp) / f"{round_}-{'-'.join(name.split()[:2])}-{replicas}"  # fresh data each run
                    result = run_once(root, replicas, args.durable, workload, args.runfor)
                    rows.append({"workload": name, "replicas": replicas, "round": round_,
                                 "msgs_per_s": result["msgs_per_s"]})
                    print(f"round {round_}: {name}, replicas={replicas}: {result['msgs_per_s']:,.0f} msgs/s",
                          flush=True)
    if args.json:
        print(json.dumps({"durable": args.durable, "runs": rows}, indent=2))
        return 0
    print(f"\n# {NODES} nodes, {'--durable, ' if args.durable else ''}{args.runfor} per run, "
          f"{args.rounds} round(s), medians")
    print("| workload | " + " | ".join(f"replicas={r}" for r in args.replicas) + " | ratio to replicas=1 |")
    print("|---|" + "---:|" * (len(args.replicas) + 1))
    for name in workloads:
        medians = {r: statistics.median([row["msgs_per_s"] for row in rows
                                         if row["workload"] == name and row["replicas"] == r] or [0])
                   for r in args.replicas}
        if not any(medians.values()):
            continue
        base = medians.get(1) or 0
        ratios = " / ".join(f"{medians[r] / base:.2f}" for r in args.replicas if r != 1) if base else "-"
        print(f"| {name} | " + " | ".join(f"{medians[r]:,.0f}" for r in args.replicas) + f" | {ratios} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
