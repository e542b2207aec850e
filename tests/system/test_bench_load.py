"""CI-sized runs of ``tests/bench/bench_load.py`` against real ``pynsqd`` processes.

The full sizes (10,000 idle connections, 1,000 consumers, a bigger backlog) are
the script's defaults, documented in its docstring and in deploy/README.md; here each
scenario runs small enough to take seconds, and what its JSON reports is checked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the broker's RSS from /proc")

REPO = Path(__file__).resolve().parents[2]
MODULE = "tests.bench.bench_load"  # run from the repository root
OUTPUT_BUFFER_SIZE = 16 * 1024
FRAME_OVERHEAD = 34


def _run(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", MODULE, *args, "--json"], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _socket_buffers_max() -> int:
    """The most a TCP connection's send and receive buffers can hold together (Linux autotuning limits)."""
    total = 0
    for name in ("tcp_wmem", "tcp_rmem"):
        total += int(Path(f"/proc/sys/net/ipv4/{name}").read_text().split()[2])
    return total


def test_idle_connections_are_held_across_heartbeats():
    result = _run("idle", "--connections=500", "--heartbeat-ms=1000", "--hold=2")
    assert result["connections"] == 500
    assert result["closed_by_server"] == 0
    assert result["min_heartbeats"] >= 2


def test_many_consumers_on_one_channel_get_each_message_once():
    result = _run("consumers", "--consumers=200", "--messages=4000", "--rdy=1")
    assert (result["received"], result["distinct"], result["duplicates"]) == (4000, 4000, 0)
    assert result["consumers_served"] == 200


def test_a_stuck_consumer_gets_no_more_than_its_buffers_and_the_others_get_everything():
    size = 20_000
    result = _run("stuck", "--healthy=2", "--messages=4000", f"--size={size}")
    for run in ("alone", "beside_stuck"):
        assert (result[f"{run}_received"], result[f"{run}_distinct"]) == (4000, 4000)
    frame = FRAME_OVERHEAD + size
    # what the kernel's buffers and the client's output buffer hold, and the frame that overflows it
    most = (_socket_buffers_max() + OUTPUT_BUFFER_SIZE) // frame + 1
    assert 0 < result["beside_stuck_stuck_was_sent"] <= most
