"""The ceiling tool of worker processes (``tests/bench/workers_ceiling.py``): N pynsqd processes
answer on one TCP port, each with its own data directory, and SIGTERM stops them all."""

from __future__ import annotations

import re
import signal
import socket
import struct
import subprocess
import sys
import time

from tests.support.paths import REPO

LISTENING = re.compile(rb"TCP: listening on 127\.0\.0\.1:(\d+)")


def _pub(port: int, topic: str, body: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"  V2" + f"PUB {topic}\n".encode() + struct.pack(">I", len(body)) + body)
        header = b""
        while len(header) < 8:
            header += sock.recv(8 - len(header))
        size, _kind = struct.unpack(">II", header)
        data = b""
        while len(data) < size - 4:
            data += sock.recv(size - 4 - len(data))
        return data


def test_two_processes_answer_on_one_port_and_stop_together(tmp_path):
    log = tmp_path / "ceiling.log"
    with open(log, "wb") as out:
        tool = subprocess.Popen([sys.executable, "-m", "tests.bench.workers_ceiling", "2", "--data-path",
                                 str(tmp_path / "data"), "--tcp-address", "127.0.0.1:0", "--http-address",
                                 "127.0.0.1:0"], cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    try:
        limit = time.monotonic() + 60
        while not (found := LISTENING.search(log.read_bytes())):
            assert tool.poll() is None and time.monotonic() < limit, log.read_text()
            time.sleep(0.05)
        port = int(found.group(1))
        logs = [tmp_path / "data" / f"w{n}.log" for n in range(2)]
        # the kernel spreads connections between the processes: publish until each took one
        for n in range(200):
            assert _pub(port, f"t{n}", b"hello") == b"OK"
            if all(b"TCP: new client" in path.read_bytes() for path in logs):
                break
        else:
            raise AssertionError("200 connections all reached one process")
        for n in range(2):
            assert (tmp_path / "data" / f"w{n}" / "nsqd.dat").exists()  # a data directory each
    finally:
        tool.send_signal(signal.SIGTERM)
        assert tool.wait(60) == 0
    for path in logs:
        assert path.read_bytes().rstrip().endswith(b"bye")  # each stopped as on its own SIGTERM
