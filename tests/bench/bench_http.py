"""Benchmark: ``POST /pub`` requests per second over keep-alive connections.

Two servers are measured with the same load, alternately, ``--rounds`` times each
(the best of each is compared, which discounts load from elsewhere on the machine):

1. pynsqd (``python -m broker``) on a fresh data directory, publishing every request;
2. the ceiling: the same HTTP stack (Trio and :class:`broker.http.server.HTTP1Server`)
   with a handler that answers nsqd's ``200 OK`` without doing anything.

The load comes from a separate process: ``--connections`` threads, each sending
requests back to back on its own keep-alive connection and reading each response
before the next (no pipelining). Both servers run in their own processes, so the
client does not share a core's time with them beyond what the machine imposes.

Usage (from the repository root)::

    python -m tests.bench.bench_http                      # 3 x 5 s per server, 4 connections, 100 B
    python -m tests.bench.bench_http --duration 10 --connections 8 --size 1000
    python -m tests.bench.bench_http --broker-arg=--mem-queue-size=1000000 --json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tests.support.processes import stop_process

ROOT = Path(__file__).resolve().parents[2]
PYNSQD = "pynsqd /pub"
CEILING = "trivial HTTP server"
_LISTEN = re.compile(rb"HTTP: listening on (\S+):(\d+)")


# --------------------------------------------------------------------------- the trivial server


def serve_trivial() -> None:
    """Run the ceiling server: HTTP1Server answering every request like nsqd's /pub does."""
    import trio

    from broker.http.server import HTTP1Server, Request, RequestBody, Response

    ok = Response(200, b"OK", ((b"X-Nsq-Content-Type", b"nsq; version=1.0"),))

    async def handler(request: Request, body: RequestBody) -> Response:
        await body.read(1 << 20)
        return ok

    async def main() -> None:
        server = HTTP1Server(handler)
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        host, port = listeners[0].socket.getsockname()[:2]
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve, listeners)
            print(f"HTTP: listening on {host}:{port}", file=sys.stderr, flush=True)

    trio.run(main)


# --------------------------------------------------------------------------- the load


def _one_connection(address, request: bytes, deadline: float, counts: list, index: int) -> None:
    sock = socket.create_connection(address)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    done = 0
    buf = b""
    try:
        while time.perf_counter() < deadline:
            sock.sendall(request)
            while True:
                head_end = buf.find(b"\r\n\r\n")
                if head_end != -1:
                    head = buf[:head_end]
                    match = re.search(rb"\r\nContent-Length: (\d+)", head, re.IGNORECASE)
                    total = head_end + 4 + int(match.group(1))
                    if len(buf) >= total:
                        if not head.startswith(b"HTTP/1.1 200 "):
                            raise RuntimeError(f"unexpected response: {buf[:total]!r}")
                        buf = buf[total:]
                        break
                chunk = sock.recv(65536)
                if not chunk:
                    raise RuntimeError("server closed the connection")
                buf += chunk
            done += 1
    finally:
        sock.close()
        counts[index] = done


def _load(address, connections: int, duration: float, size: int, queue) -> None:
    body = b"x" * size
    request = (b"POST /pub?topic=bench HTTP/1.1\r\nHost: bench\r\nContent-Length: %d\r\n\r\n" % size) + body
    counts = [0] * connections
    deadline = time.perf_counter() + duration
    threads = [threading.Thread(target=_one_connection, args=(address, request, deadline, counts, i))
               for i in range(connections)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    queue.put((sum(counts), time.perf_counter() - started))


def run_load(address, connections: int, duration: float, size: int) -> float:
    """Requests per second answered ``200`` by the server at ``address``."""
    queue = multiprocessing.Queue()
    proc = multiprocessing.Process(target=_load, args=(address, connections, duration, size, queue))
    proc.start()
    total, elapsed = queue.get(timeout=duration + 60)
    proc.join()
    return total / elapsed


# --------------------------------------------------------------------------- servers


def start_server(cmd: list[str], log_path: Path) -> tuple[subprocess.Popen, tuple[str, int]]:
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL, cwd=ROOT)
    log.close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        found = _LISTEN.search(log_path.read_bytes())
        if found:
            return proc, (found.group(1).decode(), int(found.group(2)))
        if proc.poll() is not None:
            raise RuntimeError(log_path.read_text())
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"server did not start:\n{log_path.read_text()}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of load per server")
    parser.add_argument("--connections", type=int, default=4, help="keep-alive connections")
    parser.add_argument("--size", type=int, default=100, help="message body bytes")
    parser.add_argument("--rounds", type=int, default=3, help="measurements per server, alternating")
    parser.add_argument("--broker-arg", action="append", default=[], help="extra pynsqd flag (repeatable)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--trivial-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.trivial_server:
        serve_trivial()
        return 0

    samples: dict[str, list[float]] = {PYNSQD: [], CEILING: []}
    with tempfile.TemporaryDirectory(prefix="bench-http-") as tmp:
        tmp_path = Path(tmp)
        (tmp_path / "data").mkdir()
        broker_cmd = [sys.executable, "-m", "broker", f"--data-path={tmp_path / 'data'}",
                      "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", *args.broker_arg]
        servers = {}
        try:
            servers[PYNSQD] = start_server(broker_cmd, tmp_path / "pynsqd.log")
            servers[CEILING] = start_server([sys.executable, "-m", "tests.bench.bench_http", "--trivial-server"], tmp_path / "ceiling.log")
            for _name, (_, address) in servers.items():  # warm-up
                run_load(address, args.connections, min(1.0, args.duration), args.size)
            # alternate the two, so that load from elsewhere on the machine hits both alike
            for _ in range(args.rounds):
                for name, (_, address) in servers.items():
                    samples[name].append(run_load(address, args.connections, args.duration, args.size))
        finally:
            for proc, _ in servers.values():
                stop_process(proc, 30)
    best = {name: max(rates) for name, rates in samples.items()}
    ratio = best[PYNSQD] / best[CEILING]
    if args.json:
        print(json.dumps({"best_requests_per_second": best, "samples": samples, "ratio": ratio,
                          "connections": args.connections, "size": args.size, "duration": args.duration,
                          "rounds": args.rounds, "cpus": os.cpu_count()}))
    else:
        print(f"POST /pub, {args.size} B bodies, {args.connections} keep-alive connections, "
              f"{args.rounds} x {args.duration:g} s per server, {os.cpu_count()} CPUs")
        for name, rates in samples.items():
            shown = ", ".join(f"{rate:,.0f}" for rate in rates)
            print(f"  {name:<20} best {best[name]:>8,.0f} req/s   ({shown})")
        print(f"  pynsqd / ceiling     {ratio:>8.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
