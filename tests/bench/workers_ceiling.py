"""The most worker processes could give on this machine: N independent pynsqd processes behind
the same TCP and HTTP ports (``SO_REUSEPORT``: the kernel spreads the connections), each owning
every topic it is sent, with no hop between them and no shared state. A ``--workers=N`` broker
does at least that much work per message (it adds the hops), so its rates can only be lower.

It is a broker command for the side-by-side runner; run against one pynsqd as the reference:

    PYTHONPATH=. python -m tests.bench.run_matrix --only "PUB 100B x8" --only "" \\
        --broker-cmd "python -m tests.bench.workers_ceiling 2" --nsqd-cmd "python -m broker"

(the "nsqd" column is then one pynsqd process, the "pynsqd" column N of them). It takes the
runner's ``--data-path``, ``--tcp-address`` and ``--http-address`` (port 0), gives each process
a data directory ``w<n>`` of its own under that path, prints the ports where the runner looks
for them, and stops the processes on SIGTERM. The runner's CPU figure for it is its own (near
0): the processes' CPU is not summed. Not a feature: ``SO_REUSEPORT`` splits the topics between
the processes, so a consumer sees only the messages of the process it reached.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

#: Started with ``python -c`` for each process: pynsqd with its listeners opened with SO_REUSEPORT.
_PROCESS = r"""
import socket, sys, trio

async def open_tcp_listeners(port, *, host=None, backlog=None):
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    await sock.bind((host or "0.0.0.0", port))
    sock.listen(backlog or 4096)
    return [trio.SocketListener(sock)]

trio.open_tcp_listeners = open_tcp_listeners
from broker.cli import main
sys.exit(main(sys.argv[1:]))
"""
_OWN_FLAGS = ("--data-path", "--tcp-address", "--http-address")
START_TIMEOUT = 30.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _split(args: list[str]) -> tuple[Path, list[str]]:
    """The runner's data path, and its other flags (those this tool sets itself left out)."""
    data, rest, index = None, [], 0
    while index < len(args):
        flag, _, value = args[index].partition("=")
        if flag in _OWN_FLAGS:
            if not value:
                index += 1
                value = args[index]
            if flag == "--data-path":
                data = Path(value)
        else:
            rest.append(args[index])
        index += 1
    if data is None:
        raise SystemExit("workers_ceiling: --data-path is required")
    return data, rest


def main(argv: list[str]) -> int:
    count, (data, rest) = int(argv[0]), _split(argv[1:])
    tcp, http = _free_port(), _free_port()
    processes, logs = [], []
    for n in range(count):
        path = data / f"w{n}"
        path.mkdir(parents=True, exist_ok=True)
        logs.append(data / f"w{n}.log")
        with open(logs[-1], "wb") as log:
            processes.append(subprocess.Popen(
                [sys.executable, "-c", _PROCESS, "--data-path", str(path), "--tcp-address", f"127.0.0.1:{tcp}",
                 "--http-address", f"127.0.0.1:{http}", *rest], stdout=log, stderr=log, stdin=subprocess.DEVNULL))

    def stop(*_: object) -> None:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            process.wait()
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    limit = time.monotonic() + START_TIMEOUT
    while not all(b"HTTP: listening" in path.read_bytes() for path in logs):
        if time.monotonic() > limit or any(process.poll() is not None for process in processes):
            print("workers_ceiling: a process did not start; see " + ", ".join(map(str, logs)), flush=True)
            stop()
        time.sleep(0.05)
    print(f"TCP: listening on 127.0.0.1:{tcp}", flush=True)
    print(f"HTTP: listening on 127.0.0.1:{http}", flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
