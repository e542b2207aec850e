"""The side-by-side benchmark matrix (``tests/bench/run_matrix.py`` and ``tests/bench/matrix/``)
without brokers: its rows, its runs of nsq's bench tools, its disk meter and its tables.
``tests/system/test_bench_runs.py`` runs it briefly against real brokers."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.bench.matrix import disk, loads
from tests.bench.matrix.disk import DiskMeter, copied, figures, io_counters
from tests.bench.matrix.rows import CONSUMER_ROWS, Outcome
from tests.support.paths import REPO


def _load_run_matrix(monkeypatch):
    spec = importlib.util.spec_from_file_location("run_matrix", REPO / "tests" / "bench" / "run_matrix.py")
    run_matrix = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "run_matrix", run_matrix)  # dataclasses look their module up
    spec.loader.exec_module(run_matrix)
    return run_matrix


def test_matrix_runner_summarizes_collapsed_stacks(monkeypatch):
    run_matrix = _load_run_matrix(monkeypatch)
    collapsed = "main (a.py:1);loop (a.py:9);parse (p.py:3) 30\nmain (a.py:1);loop (a.py:10) 10\n 5\n"
    summary = run_matrix.summarize_stacks(collapsed)
    assert summary["samples"] == 40
    assert summary["top"][0] == {"function": "parse (p.py)", "self_pct": 75.0, "inclusive_pct": 75.0, "samples": 30}
    assert summary["top"][1]["function"] == "loop (a.py)" and summary["top"][1]["inclusive_pct"] == 100.0


def test_matrix_runner_rows(monkeypatch):
    run_matrix = _load_run_matrix(monkeypatch)
    assert [s.name for s in run_matrix.scenarios([], with_matrix=False)] == [
        "nsq PUB 100B x8 writer", "nsq MPUB200 100B writer", "nsq MPUB200 100B both", "nsq MPUB200 1000B both",
        "nsq MPUB200 100B writer mem=0", "http /pub 100B x16", "http /mpub 100x100B x16"]
    assert len(run_matrix.scenarios([], with_matrix=True)) == 24
    # --only chooses among every row, the matrix's included
    assert [s.name for s in run_matrix.scenarios(["1000B", "MPUB", "both", "mem=0"], with_matrix=False)] == [
        "1000B MPUB200 both mem=0"]
    assert [s.name for s in run_matrix.scenarios(["PUB 100B"], with_matrix=False)] == [
        "nsq PUB 100B x8 writer", "http /pub 100B x16"]


def test_matrix_runner_fan_out_and_consumer_rows(monkeypatch):
    run_matrix = _load_run_matrix(monkeypatch)
    default = {s.name for s in run_matrix.scenarios([], with_matrix=False)}
    channels = run_matrix.scenarios(["channels"], with_matrix=False)
    assert [s.name for s in channels] == [
        "nsq MPUB200 100B writer 1 channels", "nsq MPUB200 100B writer 3 channels",
        "nsq MPUB200 100B writer 10 channels", "nsq MPUB200 100B writer 30 channels",
        "nsq MPUB200 100B writer 10 channels mem=2000000", "nsq MPUB200 100B writer 30 channels mem=2000000",
        "nsq MPUB200 100B both 10 channels"]
    # nsq's bench_writer, MPUB 200 x 100 B alone, into N channels made beforehand; spilling or all in
    # memory; then with bench_reader on one more channel
    assert [(s.tool, s.size, s.batch, s.role, s.connections, s.readers) for s in channels] == [
        ("nsq", 100, 200, "writer", None, None)] * 6 + [("nsq", 100, 200, "both", None, None)]
    assert [(s.channels, s.mem_queue_size) for s in channels] == [
        (1, None), (3, None), (10, None), (30, None), (10, 2_000_000), (30, 2_000_000), (10, None)]
    consumers = run_matrix.scenarios(["consumers"], with_matrix=False)
    assert [s.name for s in consumers] == [
        "nsq MPUB200 100B both 2 consumers", "nsq MPUB200 100B both 16 consumers", "nsq MPUB200 100B both 64 consumers"]
    assert [(s.tool, s.batch, s.role, s.readers, s.connections, s.channels) for s in consumers] == [
        ("nsq", 200, "both", n, None, None) for n in (2, 16, 64)]
    # neither group is in the default run, and one --only picks one row of them
    assert not default & {s.name for s in (*channels, *consumers)}
    assert [s.name for s in run_matrix.scenarios(["3 channels"], with_matrix=False)] == [
        "nsq MPUB200 100B writer 3 channels"]
    assert [s.name for s in run_matrix.scenarios(["writer 10 channels", "mem="], with_matrix=False)] == [
        "nsq MPUB200 100B writer 10 channels mem=2000000"]
    assert [s.name for s in run_matrix.scenarios(["64 consumers"], with_matrix=False)] == [
        "nsq MPUB200 100B both 64 consumers"]
    # a saved run reads back with its shape
    outcome = run_matrix.Outcome(consumers[2], "nsqd", writer={"msgs_per_s": 1.0, "duration_s": 1.0}, reader=None,
                                 disk={"messages": 1})
    again = run_matrix.Outcome.from_dict(json.loads(json.dumps(outcome.as_dict())))
    assert again.scenario == consumers[2] and again.disk == {"messages": 1}


class _FakeTool:
    """What the runner sees of an nsq bench tool started through subprocess.Popen."""

    started: list[tuple[list[str], dict]] = []

    def __init__(self, cmd, stdout=None, stderr=None, env=None, **kwargs):
        self.started.append((cmd, env))
        self.returncode = 0

    def communicate(self):
        return b"[bench] 2006/01/02 duration: 1.0s - 19.073mb/s - 200000.000ops/s - 5.000us/op\n", b""


def test_consumer_rows_give_bench_reader_their_connections_as_gomaxprocs(monkeypatch, tmp_path):
    monkeypatch.delenv("GOMAXPROCS", raising=False)
    monkeypatch.setattr(loads, "nsq_bin", lambda: tmp_path)
    monkeypatch.setattr(loads.subprocess, "Popen", _FakeTool)
    monkeypatch.setattr(_FakeTool, "started", [])
    row = CONSUMER_ROWS[-1]
    outcome = Outcome(row, "nsqd")
    loads.run_nsq(row, ("127.0.0.1", 4150), outcome, argparse.Namespace(runfor=1.0, rdy=2500))
    (reader, reader_env), (writer, writer_env) = _FakeTool.started
    assert reader[0] == str(tmp_path / "bench_reader") and "--channel=ch" in reader and "--rdy=2500" in reader
    assert reader_env["GOMAXPROCS"] == "64"
    assert writer[0] == str(tmp_path / "bench_writer") and "--batch-size=200" in writer and "--size=100" in writer
    assert "GOMAXPROCS" not in writer_env  # the writer keeps the machine's default
    assert outcome.writer["msgs_per_s"] == outcome.reader["msgs_per_s"] == 200000.0


def test_fan_out_rows_create_their_channels_over_http():
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            seen.append((self.command, self.path))
            status = 404 if "missing" in self.path else 200
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        address = server.server_address[:2]
        loads.create_channels_http(address, "sub_bench", loads.channel_names(3))
        with pytest.raises(RuntimeError, match="404"):
            loads.http_post(address, "/channel/create", topic="missing", channel="ch0")
    finally:
        server.shutdown()
        server.server_close()
    assert seen[:4] == [("POST", "/topic/create?topic=sub_bench"),
                        *(("POST", f"/channel/create?topic=sub_bench&channel=ch{i}") for i in range(3))]


def test_disk_meter_counts_the_data_path_growth_per_published_message(tmp_path, monkeypatch):
    (tmp_path / "broker.log").write_bytes(b"x" * 1000)  # the runner's log: never counted
    (tmp_path / "meta.dat").write_bytes(b"m" * 10)
    stats = {"topic_name": "sub_bench", "message_count": 100, "depth": 0,
             "channels": [{"channel_name": f"ch{i}", "message_count": 100} for i in range(2)]}
    # the broker's /proc/<pid>/io, as the test sets it: how much reached storage depends on the file system
    io = {"write_bytes": 7000, "cancelled_write_bytes": 100}
    monkeypatch.setattr(disk, "io_counters", lambda pid: dict(io) if pid == 4242 else {})
    meter = DiskMeter(tmp_path, 4242, 2, lambda: stats)
    meter.start()
    (tmp_path / "sub_bench:ch0.diskqueue.000000.dat").write_bytes(b"d" * 13_000)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "ch1.dat").write_bytes(b"d" * 13_000)
    (tmp_path / "broker.log").write_bytes(b"x" * 5000)
    io.update(write_bytes=7000 + 8 * 4096, cancelled_write_bytes=100 + 4096)  # 8 pages dirtied, 1 truncated
    time.sleep(0.05)
    result = meter.finish(timeout=5, poll=0.01)
    assert result["settled"] is True and result["messages"] == 100 and result["channels"] == 2
    assert result["data_bytes"] == 26_000 and result["data_bytes_per_msg"] == 260.0
    assert (result["write_bytes"], result["cancelled_write_bytes"]) == (32_768, 4096)
    assert result["write_bytes_per_msg"] == 327.68
    # copied from start() to the first look that found every message in every channel
    assert 0.05 <= result["copied_s"] < 5 and result["fan_out_msgs_per_s"] == pytest.approx(100 / result["copied_s"],
                                                                                              rel=0.01)
    # settled only once every channel holds every message and the topic holds none
    assert copied(stats, 2) and not copied(stats, 3) and not copied(None, 1)
    assert not copied(dict(stats, depth=5), 2)
    assert not copied(dict(stats, channels=[{"message_count": 100}, {"message_count": 99}]), 2)
    # a broker that never settles is measured at the timeout, and says so
    late = DiskMeter(tmp_path, 4242, 3, lambda: stats)
    late.start()
    never = late.finish(timeout=0.05, poll=0.01)
    assert never["settled"] is False and never["copied_s"] is None and never["fan_out_msgs_per_s"] is None


def test_io_counters_are_the_processes_own(tmp_path):
    """What the meter subtracts is read from the process's /proc/<pid>/io: the bytes it passes to write()
    (``wchar``) grow by at least what it wrote, whatever the file system keeps of them."""
    before = io_counters(os.getpid())
    assert {"wchar", "write_bytes", "cancelled_write_bytes"} <= before.keys()
    fd = os.open(tmp_path / "written", os.O_WRONLY | os.O_CREAT)
    try:
        assert os.write(fd, b"w" * 100_000) == 100_000
    finally:
        os.close(fd)
    assert io_counters(os.getpid())["wchar"] - before["wchar"] >= 100_000


def test_disk_table_gives_each_brokers_median_bytes_per_message(monkeypatch):
    run_matrix = _load_run_matrix(monkeypatch)
    row = run_matrix.scenarios(["10 channels"], with_matrix=False)[0]

    def run(broker, messages, data_bytes, copied_s, settled=True):
        return run_matrix.Outcome(row, broker, writer={"msgs_per_s": 1.0, "duration_s": 1.0},
                                  disk=figures(messages, 10, data_bytes, data_bytes + 100, settled=settled,
                                               copied_s=copied_s))

    outcomes = [run("nsqd", 1000, 1_300_000, 4.0), run("pynsqd", 500, 60_000, 1.0), run("nsqd", 1000, 1_200_000, 6.0),
                run("pynsqd", 500, 70_000, None, settled=False),
                run_matrix.Outcome(run_matrix.scenarios([], False)[0], "nsqd")]
    (summary,) = run_matrix.disk_summary(outcomes, ["nsqd", "pynsqd"])
    assert summary["scenario"] == "nsq MPUB200 100B writer 10 channels" and summary["channels"] == 10
    assert summary["nsqd"]["data_bytes_per_msg"] == 1250 and summary["pynsqd"]["data_bytes_per_msg"] == 130
    assert summary["nsqd"]["fan_out_msgs_per_s"] == pytest.approx(625 / 3) and summary["pynsqd"]["fan_out_msgs_per_s"] == 500
    assert summary["pynsqd"]["unsettled"] == 1 and summary["ratio"] == pytest.approx(0.104)
    assert summary["fan_out_ratio"] == pytest.approx(2.4)
    lines = run_matrix.disk_table([summary], ["nsqd", "pynsqd"]).splitlines()
    assert [c.strip() for c in lines[0].split("|")[1:-1]] == [
        "scenario", "nsqd msgs", "nsqd fan-out msgs/s", "pynsqd msgs", "pynsqd fan-out msgs/s", "pynsqd/nsqd",
        "nsqd data B/msg", "nsqd write_bytes B/msg", "pynsqd data B/msg", "pynsqd write_bytes B/msg",
        "pynsqd/nsqd (data)"]
    assert [c.strip() for c in lines[2].split("|")[1:-1]] == [
        "nsq MPUB200 100B writer 10 channels", "1,000", "208", "500", "500 (1 unsettled)", "2.40",
        "1,250", "1,250", "130", "130", "0.10"]
    # ~0 bytes per message (all in memory) gives no ratio
    zero = run_matrix.Outcome(row, "nsqd", disk=figures(1000, 10, -5, 0))
    assert run_matrix.disk_summary([zero, run("pynsqd", 500, 0, 1.0)], ["nsqd", "pynsqd"])[0]["ratio"] is None


def test_matrix_runner_compares_the_medians_of_each_broker(monkeypatch):
    run_matrix = _load_run_matrix(monkeypatch)
    both = run_matrix.Scenario("nsq", 100, 200, "both")

    def run(broker, round_, rate, error=None):
        result = None if error else {"msgs_per_s": rate, "duration_s": 10.0}
        return run_matrix.Outcome(both, broker, round_, writer=result, reader=result and dict(result, msgs_per_s=rate / 2),
                                  broker_cpu_s=5.0, measured_s=10.0, error=error)

    outcomes = [run("nsqd", 0, 100), run("pynsqd", 0, 300), run("pynsqd", 1, 200), run("nsqd", 1, 400),
                run("nsqd", 2, 200), run("pynsqd", 2, 0, error="broker did not start\nlog")]
    writer, reader = run_matrix.summarize(outcomes, ["nsqd", "pynsqd"])
    assert (writer["role"], writer["nsqd"]["runs"], writer["nsqd"]["median"]) == ("writer", [100, 400, 200], 200)
    assert (writer["pynsqd"]["runs"], writer["pynsqd"]["median"]) == ([300, 200], 250)
    assert writer["pynsqd"]["errors"] == ["broker did not start"]
    assert writer["ratio"] == 1.25 and reader["ratio"] == 1.25
    assert writer["nsqd"]["cpu_percent"] == 50.0
    table = run_matrix.comparison_table([writer, reader]).splitlines()
    assert table[2].startswith("| nsq MPUB200 100B both: writer |")
    assert [cell.strip() for cell in table[2].split("|")[2:7]] == ["200", "250", "1.25", "50%", "50%"]
    assert table[2].rstrip(" |").endswith("0.1 0.4 0.2; 0.3 0.2 (1 failed)")


def test_the_matrix_runs_the_checkouts_broker_not_an_installed_copy(tmp_path):
    """The side-by-side runner starts ``python -m broker`` from the checkout with the checkout first
    on ``PYTHONPATH``: a broker installed in site-packages (an older copy) must not be what it measures."""
    import subprocess
    from pathlib import Path

    import broker
    from tests.bench.matrix.brokers import ROOT, child_env

    found = subprocess.run([sys.executable, "-c", "import broker, diskqueue; print(broker.__file__, diskqueue.__file__)"],
                           cwd=tmp_path, env=child_env(), capture_output=True, text=True, check=True, timeout=60).stdout.split()
    assert [Path(f).resolve() for f in found] == [ROOT / "broker" / "__init__.py", ROOT / "diskqueue" / "__init__.py"]
    assert Path(broker.__file__).resolve() == ROOT / "broker" / "__init__.py"
