"""Benchmark: TCP publishing, pynsqd against the least a Trio V2 server can do.

``bench writer`` publishes to two servers, alternately, ``--rounds`` times each
(the best of each is compared, which discounts load from elsewhere on the machine):

1. pynsqd (``python -m broker``) on a fresh data directory;
2. the ceilings: a raw Trio server that reads each connection's bytes, finds the
   ``PUB``/``MPUB``/``IDENTIFY`` commands in them and answers every one with an
   ``OK`` frame (one write per chunk read), storing nothing; once through Trio's
   ``SocketStream`` ("stream"), once on the raw socket ("socket": ``os.read`` until
   it would block, then ``trio.lowlevel.wait_readable``; ``os.write``), the way
   pynsqd reads plain connections.

The ratio says how much of a ceiling pynsqd reaches; what is left is the cost
of being a broker (parsing, validating, message ids, queues, counters).

Usage (from the repository root)::

    python -m tests.bench.bench_tcp_baseline                       # PUB and MPUB 200, 100 B, 3 x 3 s
    python -m tests.bench.bench_tcp_baseline --size 1000 --runfor 5s --rounds 5 --json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support.processes import stop_process

ROOT = Path(__file__).resolve().parents[2]
CEILINGS = ("stream", "socket")
_LISTEN = re.compile(r"TCP: listening on (\S+):(\d+)")


OK = struct.pack(">ii", 6, 0) + b"OK"


def _answers(buf: bytearray) -> tuple[int, int]:
    """How many ``OK`` the complete commands at the start of ``buf`` get, and where they end."""
    answers = 0
    pos = 0
    while True:
        end = buf.find(b"\n", pos)
        if end < 0:
            break
        verb = bytes(buf[pos:end].split(b" ", 1)[0])
        if verb in (b"PUB", b"MPUB", b"IDENTIFY"):
            if len(buf) < end + 5:
                break
            (size,) = struct.unpack_from(">I", buf, end + 1)
            if len(buf) < end + 5 + size:
                break
            pos = end + 5 + size
            answers += 1
        else:  # NOP and anything else: no answer
            pos = end + 1
    return answers, pos


def serve_ceiling(mode: str) -> None:
    """Run a ceiling server ("stream" or "socket") on 127.0.0.1:0; prints its port like pynsqd's log line."""
    import trio

    async def handle_stream(stream: trio.SocketStream) -> None:
        commands = _Commands()
        while True:
            try:
                data = await stream.receive_some(256 * 1024)
            except trio.BrokenResourceError:
                return
            if not data:
                return
            answers = commands.feed(data)
            if answers:
                await stream.send_all(OK * answers)

    async def handle_socket(stream: trio.SocketStream) -> None:
        fd = stream.socket.fileno()
        commands = _Commands()
        while True:
            try:
                data = os.read(fd, 256 * 1024)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(fd)
                continue
            except OSError:
                return
            if not data:
                return
            out = memoryview(OK * commands.feed(data))
            while out:
                try:
                    out = out[os.write(fd, out):]
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(fd)
            await trio.lowlevel.checkpoint()

    async def main() -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        print(f"TCP: listening on 127.0.0.1:{port}", flush=True)
        await trio.serve_listeners(handle_socket if mode == "socket" else handle_stream, listeners)

    trio.run(main)


class _Commands:
    """One connection's input: the magic, then commands; :meth:`feed` counts the answers."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.magic = False

    def feed(self, data: bytes) -> int:
        buf = self.buf
        buf += data
        if not self.magic:
            if len(buf) < 4:
                return 0
            del buf[:4]
            self.magic = True
        answers, pos = _answers(buf)
        del buf[:pos]
        return answers


def start(cmd: list[str]) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        match = _LISTEN.search(line)
        if match:
            return proc, f"{match.group(1)}:{match.group(2)}"
    proc.kill()
    raise RuntimeError(f"{cmd} did not start")


def writer(address: str, args: argparse.Namespace, batch: int) -> float:
    cmd = [sys.executable, "-m", "broker", "bench", "writer", f"--nsqd-tcp-address={address}",
           f"--runfor={args.runfor}", f"--size={args.size}", f"--connections={args.connections}",
           "--progress=0", "--json", "--topic=bench"]
    cmd += ["--mpub", f"--batch-size={batch}"] if batch > 1 else ["--batch-size=1"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    return json.loads(out)["msgs_per_s"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--runfor", default="3s")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--serve-ceiling", choices=CEILINGS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_ceiling:
        serve_ceiling(args.serve_ceiling)
        return 0
    names = ["pynsqd", *CEILINGS]
    results = []
    for label, batch in (("PUB", 1), ("MPUB 200", 200)):
        best = dict.fromkeys(names, 0.0)
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory() as data:
                for name in names:
                    cmd = ([sys.executable, "-m", "broker", f"--data-path={data}", "--tcp-address=127.0.0.1:0",
                            "--http-address=127.0.0.1:0"] if name == "pynsqd"
                           else [sys.executable, "-m", "tests.bench.bench_tcp_baseline", f"--serve-ceiling={name}"])
                    proc, address = start(cmd)
                    try:
                        best[name] = max(best[name], writer(address, args, batch))
                    finally:
                        stop_process(proc, 30)
        result = {"command": label, "size": args.size, "pynsqd_msgs_per_sec": round(best["pynsqd"])}
        for ceiling in CEILINGS:
            result[f"{ceiling}_ceiling_msgs_per_sec"] = round(best[ceiling])
            result[f"ratio_to_{ceiling}"] = round(best["pynsqd"] / best[ceiling], 2)
        results.append(result)
    if args.json:
        print(json.dumps(results))
    else:
        print("| command | size | pynsqd msgs/s | Trio SocketStream ceiling | ratio | raw socket ceiling | ratio |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for r in results:
            print(f"| {r['command']} | {r['size']} B | {r['pynsqd_msgs_per_sec']:,} | "
                  f"{r['stream_ceiling_msgs_per_sec']:,} | {r['ratio_to_stream']:.2f} | "
                  f"{r['socket_ceiling_msgs_per_sec']:,} | {r['ratio_to_socket']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
