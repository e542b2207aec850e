"""What replication costs a consumer: messages finished a second from a backlog on a replicated
topic, with every message finished at once, or requeued once (``REQ`` without delay) and
finished at its second delivery. Each delivery, requeue and FIN of a replicated topic is told
to the holders in batches (FINs, and the attempts and due times of what was delivered or
requeued and not finished within the batch's 0.1 s).

Each run starts nsq's own nsqlookupd and three pynsqd nodes with ``--replicas=2`` (fresh data
directories), publishes ``--messages`` 100 B bodies to the first node (``python -m
broker.bench writer``, MPUB of 200), then one consumer on that node (RDY 2500, blocking
sockets, one process) reads them all. Besides messages a second (which a busy machine
disturbs), the table gives the CPU time the nodes spent a message, from the publish's end
until every holder dropped its copies: the origin's, and its peers' together. With ``--baseline DIR`` (another checkout, e.g.
``git archive main | tar -x -C /tmp/old``) every run is also made with that checkout's
nodes, alternating with this one's; ``--rounds N`` reports medians.

Usage (from the repository root)::

    python -m tests.bench.bench_replication_requeue --messages 50000 --rounds 3
    python -m tests.bench.bench_replication_requeue --rounds 3 --baseline /tmp/old
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from broker.protocol import (
    FRAME_TYPE_MESSAGE,
    MAGIC_V2,
    FrameDecoder,
    decode_message,
    encode_fin,
    encode_rdy,
    encode_req,
    encode_sub,
)
from tests.bench.bench_replication import NODES, _http, _wait_linked
from tests.support.nsq_programs import NsqProgram, nsq_bin_missing
from tests.support.processes import BrokerProcess

ROOT = Path(__file__).resolve().parents[2]
TOPIC, CHANNEL = "bench_requeue", "work"
RDY = 2500
WORKLOADS = {"FIN": False, "REQ once, then FIN": True}


def publish(address: tuple[str, int], count: int) -> None:
    command = [sys.executable, "-m", "broker.bench", "writer", f"--nsqd-tcp-address={address[0]}:{address[1]}",
               f"--topic={TOPIC}", "--connections=2", f"--count={count}", "--batch-size=200", "--size=100",
               "--progress=0", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"bench writer failed ({done.returncode}):\n{done.stderr[-2000:]}")


def consume(address: tuple[str, int], count: int, requeue: bool) -> float:
    """Read ``count`` messages (each requeued once first, with ``requeue``); messages finished a second."""
    sock = socket.create_connection(address, timeout=60)
    decoder = FrameDecoder()
    seen: set[bytes] = set()
    finished = 0
    try:
        sock.sendall(MAGIC_V2 + encode_sub(TOPIC, CHANNEL) + encode_rdy(RDY))
        started = time.perf_counter()
        while finished < count:
            data = sock.recv(1 << 20)
            if not data:
                raise RuntimeError("the node closed the connection")
            out = []
            for frame in decoder.feed(data):
                if frame.frame_type != FRAME_TYPE_MESSAGE:
                    continue
                msg = decode_message(frame.data)
                if requeue and msg.id not in seen:
                    seen.add(msg.id)
                    out.append(encode_req(msg.id, 0))
                else:
                    out.append(encode_fin(msg.id))
                    finished += 1
            if out:
                sock.sendall(b"".join(out))
        return count / (time.perf_counter() - started)
    finally:
        sock.close()


def cpu_seconds(node: BrokerProcess) -> float:
    """The CPU time (user and system) the node's process has used."""
    assert node.proc is not None
    fields = Path(f"/proc/{node.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_dropped(nodes: list[BrokerProcess], timeout: float = 120.0) -> None:
    """Return once no node holds a copy for another (every FIN reached the holders)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(_http(node, "GET", "/stats?format=json")["replication"]["copies_held"] == 0 for node in nodes):
            return
        time.sleep(0.05)  # another process's state: poll it
    raise RuntimeError(f"copies still held after {timeout}s")


def run_once(root: Path, code: Path, messages: int, requeue: bool) -> dict:
    lookupd = NsqProgram("nsqlookupd", root / "lookupd.log", "--tcp-address=127.0.0.1:0",
                         "--http-address=127.0.0.1:0", "--broadcast-address=127.0.0.1").start()
    nodes: list[BrokerProcess] = []
    try:
        flags = [f"--lookupd-tcp-address={lookupd.address('TCP')}", "--broadcast-address=127.0.0.1", "--replicas=2"]
        for n in range(NODES):
            nodes.append(BrokerProcess(root / f"node{n}", *flags, log_path=root / f"node{n}.log", cwd=code).start())
        first = nodes[0]
        _http(first, "POST", f"/topic/create?topic={TOPIC}")
        _http(first, "POST", f"/channel/create?topic={TOPIC}&channel={CHANNEL}")
        _wait_linked(first, NODES - 1)
        assert first.tcp is not None
        publish(first.tcp, messages)
        before = [cpu_seconds(node) for node in nodes]
        rate = consume(first.tcp, messages, requeue)
        wait_dropped(nodes)
        used = [cpu_seconds(node) - start for node, start in zip(nodes, before)]
        return {"msgs_per_s": rate, "origin_us": used[0] / messages * 1e6, "peers_us": sum(used[1:]) / messages * 1e6}
    finally:
        for node in nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.terminate(60)
        lookupd.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000, help="backlog per run (default 50000)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each kind; medians are reported (default 3)")
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout, run alternately with this one")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    missing = nsq_bin_missing()
    if missing:
        parser.error(missing)
    checkouts = {"this": ROOT, **({"baseline": args.baseline.resolve()} if args.baseline is not None else {})}
    rows = []
    with tempfile.TemporaryDirectory(prefix="pynsqd-bench-requeue-") as tmp:
        for round_ in range(args.rounds):
            for name, requeue in WORKLOADS.items():
                order = list(checkouts.items()) if round_ % 2 == 0 else list(checkouts.items())[::-1]
                for label, code in order:
                    root = Path(tmp) / f"{round_}-{int(requeue)}-{label}"
                    result = run_once(root, code, args.messages, requeue)
                    rows.append({"workload": name, "checkout": label, "round": round_, **result})
                    print(f"round {round_}: {name}, {label}: {result['msgs_per_s']:,.0f} msgs/s, CPU a message "
                          f"{result['origin_us']:.1f} us origin, {result['peers_us']:.1f} us peers", flush=True)
    if args.json:
        print(json.dumps({"messages": args.messages, "runs": rows}, indent=2))
        return 0
    print(f"\n# {NODES} nodes, --replicas=2, {args.messages} messages, {args.rounds} round(s), medians")
    columns = [(key, label) for key in ("msgs_per_s", "origin_us", "peers_us") for label in checkouts]
    titles = {"msgs_per_s": "msgs/s", "origin_us": "origin CPU us/msg", "peers_us": "peers CPU us/msg"}
    print("| workload | " + " | ".join(f"{titles[key]} ({label})" for key, label in columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for name in WORKLOADS:
        medians = [statistics.median([row[key] for row in rows
                                      if row["workload"] == name and row["checkout"] == label] or [0])
                   for key, label in columns]
        print(f"| {name} | " + " | ".join(f"{m:,.0f}" if m >= 100 else f"{m:.1f}" for m in medians) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
