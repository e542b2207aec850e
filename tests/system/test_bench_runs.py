"""The benchmark tools' short real runs: ``pynsqd bench`` against a ``pynsqd`` process, and the
side-by-side matrix (``tests/bench/run_matrix.py``) against pynsqd and nsqd."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from broker.bench import main
from tests.support.nsq_programs import nsq_bin_missing
from tests.support.paths import REPO


@pytest.fixture
def bench_broker(broker_process) -> str:
    """A real broker's TCP address as the tool takes it: ``host:port``."""
    host, port = broker_process().tcp
    return f"{host}:{port}"


def test_writer_then_reader_against_the_broker(bench_broker, capsys):
    common = [f"--nsqd-tcp-address={bench_broker}", "--json", "--progress=0", "--topic=bench_test"]
    assert main(["writer", *common, "--runfor=1s", "--size=100", "--batch-size=50", "--connections=2"]) == 0
    written = json.loads(capsys.readouterr().out)
    assert written["tool"] == "writer"
    assert written["messages"] > 0 and written["messages"] % 50 == 0
    assert written["body_bytes"] == 100 * written["messages"]

    assert main(["reader", *common, f"--count={written['messages']}", "--runfor=20s", "--connections=2"]) == 0
    read = json.loads(capsys.readouterr().out)
    assert read["messages"] == written["messages"]
    assert read["body_bytes"] == written["body_bytes"]
    assert read["latency_ms"]["count"] == read["messages"]
    assert read["latency_ms"]["p50_ms"] > 0
    assert read["error_count"] == 0 and read["closed_by_server"] == 0


def test_channels_against_the_broker(bench_broker, capsys):
    assert main(["channels", f"--nsqd-tcp-address={bench_broker}", "--num=5", "--runfor=0.5s", "--json",
                 "--progress=0", "--topic=bench_channels_test"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["subscribe_ms"]["count"] == 5
    assert result["closed_by_server"] == 0
    assert result["duration_s"] >= 0.5


@pytest.mark.skipif(nsq_bin_missing() is not None, reason=str(nsq_bin_missing()))
@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (Debian: apt-get install wrk)")
def test_run_matrix_compares_pynsqd_with_nsqd_side_by_side():
    # the two PUB rows: nsq's bench_writer over TCP and wrk over HTTP, one short round each
    done = subprocess.run([sys.executable, "-m", "tests.bench.run_matrix", "--rounds=1", "--runfor=1s",
                           "--only=PUB 100B", "--json"], capture_output=True, text=True, timeout=180, cwd=REPO)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert [(row["scenario"], row["role"]) for row in result["summary"]] == [
        ("nsq PUB 100B x8 writer", "writer"), ("http /pub 100B x16", "writer")]
    for row in result["summary"]:
        assert row["nsqd"]["median"] > 0 and row["pynsqd"]["median"] > 0
        assert row["ratio"] == pytest.approx(row["pynsqd"]["median"] / row["nsqd"]["median"])
    runs = result["runs"]
    assert sorted(run["broker_name"] for run in runs) == ["nsqd", "nsqd", "pynsqd", "pynsqd"]
    # every run published what the tool reported, to a broker of its own
    assert all(run["error"] is None and run["writer"]["messages"] > 0 for run in runs)


@pytest.mark.skipif(nsq_bin_missing() is not None, reason=str(nsq_bin_missing()))
def test_run_matrix_fan_out_row_measures_disk_bytes_per_message():
    # one fan-out row: bench_writer into 3 channels made over HTTP beforehand, one short round each
    done = subprocess.run([sys.executable, "-m", "tests.bench.run_matrix", "--rounds=1", "--runfor=1s",
                           "--only=3 channels", "--json"], capture_output=True, text=True, timeout=180, cwd=REPO)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert [row["scenario"] for row in result["summary"]] == ["nsq MPUB200 100B writer 3 channels"]
    (disk,) = result["disk"]
    for broker in ("nsqd", "pynsqd"):
        (run,) = disk[broker]["runs"]
        # every channel held every message; past the default --mem-queue-size each wrote its own copy
        assert run["settled"] and run["messages"] > 0 and run["channels"] == 3
        assert run["data_bytes_per_msg"] > 0 and run["write_bytes"] > 0
        assert run["copied_s"] >= 1 and run["fan_out_msgs_per_s"] > 0


def test_bench_keys_compares_keyed_with_unkeyed_and_measures_a_key(capsys):
    from tests.bench import bench_keys

    bench_keys.main(["--rounds", "1", "--messages", "4000", "--keys", "20000"])
    out = capsys.readouterr().out
    rates = re.search(r"unkeyed ([\d,]+) msgs/s\s+keyed ([\d,]+) msgs/s\s+keyed/unkeyed ([\d.]+)", out)
    assert rates and all(float(v.replace(",", "")) > 0 for v in rates.groups()), out
    per_key = re.search(r"RSS after 20,000 messages: unkeyed \d+ MB, keyed \d+ MB: (-?\d+) B per remembered key", out)
    assert per_key, out


def test_bench_priorities_states_write_drain_and_live_rates_of_both_modes(capsys):
    from tests.bench import bench_priorities

    bench_priorities.main(["--rounds", "1", "--messages", "4000", "--flags=--mem-queue-size=500"])
    out = capsys.readouterr().out
    for row in ("write", "drain", "live"):
        found = re.search(rf"  {row}\s+([\d,]+)\s+([\d,]+)\s+([\d.]+)", out)
        assert found and all(float(v.replace(",", "")) > 0 for v in found.groups()), out
