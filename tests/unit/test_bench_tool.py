"""Tests of the benchmark tool itself: flags, percentile maths, output, the timed loops.

The loops are exercised against a scripted V2 peer on 127.0.0.1:0 (frames cut
into odd pieces, heartbeats in between); ``tests/system/test_bench_runs.py`` runs
the tool briefly against a real broker.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import socket
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from broker.bench import BenchResult, format_text, main, parse_args, percentile, summarize, to_json
from broker.bench.arguments import (
    ChannelsConfig,
    ReaderConfig,
    WriterConfig,
    parse_address,
    parse_deadline,
    parse_duration,
)
from broker.bench.channels import subscriptions
from broker.bench.latency import LatencySamples, merge
from broker.bench.pool import PoolOutcome, Scoreboard, WorkerReport
from broker.bench.reader import ConsumerPlan, ReaderWorker
from broker.bench.report import build_result
from broker.bench.writer import WriterWorker, split_quotas
from broker.protocol import encode_message_frame, encode_response
from tests.bench.matrix import disk, loads
from tests.bench.matrix.disk import DiskMeter, copied, figures, io_counters
from tests.bench.matrix.rows import CONSUMER_ROWS, Outcome
from tests.support.paths import REPO

PEER_TIMEOUT = 10.0

# -- flags --------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, seconds",
    [("10s", 10.0), ("250ms", 0.25), ("1m30s", 90.0), ("1.5", 1.5), ("2h", 7200.0), ("500us", 0.0005), ("0", 0.0)],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "10x", "s", "-1s", "1s2", "ten seconds"])
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError):
        parse_duration(text)


def test_parse_deadline_formats():
    # nsq's layout has no zone and Go reads it as UTC
    assert parse_deadline("2006-01-02 15:04:05") == 1136214245.0
    assert parse_deadline("2006-01-02T16:04:05+01:00") == 1136214245.0
    assert parse_deadline("1136214245.5") == 1136214245.5
    assert parse_deadline("@1136214245") == 1136214245.0
    with pytest.raises(ValueError):
        parse_deadline("tomorrow")


def test_parse_address():
    assert parse_address("127.0.0.1:4150") == ("127.0.0.1", 4150)
    assert parse_address("[::1]:4150") == ("::1", 4150)
    for bad in ("127.0.0.1", ":4150", "host:port", "host:70000"):
        with pytest.raises(ValueError):
            parse_address(bad)


def test_writer_defaults_follow_nsq():
    c = parse_args(["writer"])
    assert isinstance(c, WriterConfig)
    assert (c.host, c.port, c.topic, c.size, c.batch_size) == ("127.0.0.1", 4150, "sub_bench", 200, 200)
    assert (c.runfor, c.count, c.deadline, c.mpub, c.pipeline, c.json) == (10.0, None, None, True, 1, False)


def test_writer_flags_in_go_and_gnu_spelling():
    c = parse_args(["writer", "-runfor", "2s", "--size=100", "-batch-size=1", "--nsqd-tcp-address", "10.0.0.1:4000",
                    "--deadline=2006-01-02 15:04:05", "--connections=4", "--processes=2", "--pipeline=8",
                    "--identify", '{"output_buffer_timeout": 25}', "--json"])
    assert (c.runfor, c.size, c.batch_size, c.mpub) == (2.0, 100, 1, False)
    assert (c.host, c.port, c.deadline) == ("10.0.0.1", 4000, 1136214245.0)
    assert (c.connections, c.processes, c.pipeline, c.identify, c.json) == (4, 2, 8, {"output_buffer_timeout": 25}, True)
    assert parse_args(["writer", "--batch-size=1", "--mpub"]).mpub is True


def test_count_without_runfor_runs_until_count():
    c = parse_args(["writer", "--count=1000"])
    assert (c.count, c.runfor) == (1000, None)
    c = parse_args(["reader", "--count=1000", "--runfor=5s"])
    assert (c.count, c.runfor) == (1000, 5.0)


def test_reader_rdy_and_max_in_flight():
    c = parse_args(["reader", "--channel=x", "--size=100"])
    assert isinstance(c, ReaderConfig)
    assert (c.topic, c.channel, c.rdy) == ("sub_bench", "x", 2500)
    assert parse_args(["reader", "--rdy=10"]).rdy == 10
    assert parse_args(["reader", "--max-in-flight=1000", "--connections=4"]).rdy == 250
    assert parse_args(["reader", "--max-in-flight=2", "--connections=4"]).rdy == 1


def test_channels_flags_and_names():
    c = parse_args(["channels", "--num=3"])
    assert isinstance(c, ChannelsConfig)
    assert subscriptions(c) == [("t0", "ch"), ("t1", "ch"), ("t2", "ch")]
    c = parse_args(["channels", "--num=2", "--mode=channels", "--topic=fan", "--channel=c"])
    assert subscriptions(c) == [("fan", "c0"), ("fan", "c1")]


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["juggle"],
        ["writer", "--size=0"],
        ["writer", "--runfor=soon"],
        ["writer", "--runfor=0"],
        ["writer", "--connections=1", "--processes=2"],
        ["reader", "--rdy=5", "--max-in-flight=5"],
        ["reader", "--identify=[1]"],
        ["channels", "--mode=both"],
    ],
)
def test_bad_arguments_exit_2(argv, capsys):
    assert main(argv) == 2
    assert capsys.readouterr().err


def test_unreachable_server_exits_1(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        assert main(["writer", f"--nsqd-tcp-address=127.0.0.1:{port}", "--runfor=1s", "--progress=0"]) == 1
    assert "[bench_writer] error:" in capsys.readouterr().err


def test_split_quotas():
    assert split_quotas(10, 3) == [4, 3, 3]
    assert split_quotas(2, 4) == [1, 1, 0, 0]
    assert sum(split_quotas(12345, 7)) == 12345


# -- percentile maths ---------------------------------------------------------


def test_percentile_nearest_rank():
    values = list(range(1, 1001))
    assert percentile(values, 50) == 500
    assert percentile(values, 99) == 990
    assert percentile(values, 99.9) == 999
    assert percentile(values, 100) == 1000
    assert percentile(values, 0.01) == 1
    assert percentile([7], 50) == percentile([7], 99.9) == 7
    assert percentile([1, 2], 50) == 1
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile(values, 0)
    with pytest.raises(ValueError):
        percentile(values, 101)


def test_summarize_in_milliseconds():
    ns = [i * 1_000_000 for i in range(1000, 0, -1)]  # 1..1000 ms, unsorted
    s = summarize(ns)
    assert (s.count, s.samples) == (1000, 1000)
    assert (s.min_ms, s.p50_ms, s.p90_ms, s.p99_ms, s.p999_ms, s.max_ms) == (1, 500, 900, 990, 999, 1000)
    assert s.mean_ms == pytest.approx(500.5)
    assert summarize([]) is None


def test_latency_samples_stay_bounded_and_span_the_run():
    samples = LatencySamples(max_samples=1000)
    for start in range(0, 100_000, 250):
        samples.extend(list(range(start, start + 250)))
    assert samples.count == 100_000
    assert len(samples.values) <= 1000
    assert samples.stride == 128
    # an even thinning keeps the distribution: the median stays in the middle
    assert summarize(samples.values).p50_ms == pytest.approx(0.05, rel=0.05)
    assert samples.values[0] == 0 and samples.values[-1] > 99_000


def test_merge_uses_the_coarsest_stride():
    fine, coarse = LatencySamples(max_samples=100), LatencySamples(max_samples=10)
    fine.extend([1] * 80)
    coarse.extend([2] * 40)  # halved twice: stride 4, 10 values
    values, count = merge([fine, coarse])
    assert count == 120
    assert coarse.stride == 4
    assert sorted(values) == [1] * 20 + [2] * 10


# -- output -------------------------------------------------------------------


def _result(tool: str = "reader", latency: bool = True) -> BenchResult:
    config = parse_args([tool, "--runfor=2s"])
    lat = LatencySamples()
    lat.extend([1_000_000, 2_000_000, 3_000_000])
    report = WorkerReport(messages=3, body_bytes=600, started=10.0, finished=12.0, cpu_user=0.5, cpu_system=0.1,
                          latencies=lat if latency else None)
    outcome = PoolOutcome(reports=[report], start=10.0, setup=0.25, duration=2.0, cpu_user=0.5, cpu_system=0.1)
    return build_result(tool, config, outcome)


def test_json_shape():
    doc = json.loads(json.dumps(to_json(_result())))
    assert doc["tool"] == "reader"
    assert doc["messages"] == 3 and doc["body_bytes"] == 600
    assert doc["msgs_per_s"] == pytest.approx(1.5)
    assert doc["mib_per_s"] == pytest.approx(300 / 2**20)
    assert doc["us_per_op"] == pytest.approx(2e6 / 3)
    assert doc["duration_s"] == 2.0 and doc["setup_s"] == 0.25
    assert doc["cpu"] == {"user_s": 0.5, "system_s": 0.1, "percent_of_core": pytest.approx(30.0)}
    assert set(doc["latency_ms"]) == {"count", "samples", "min_ms", "mean_ms", "p50_ms", "p90_ms", "p99_ms",
                                      "p999_ms", "max_ms"}
    assert doc["latency_ms"]["p50_ms"] == 2.0
    assert doc["config"]["channel"] == "ch" and doc["config"]["runfor"] == 2.0
    assert json.loads(json.dumps(to_json(_result("writer", latency=False))))["latency_ms"] is None


def test_text_first_line_parses_like_nsq():
    lines = format_text(_result())
    # the expression nsq's bench.py applies to bench_writer/bench_reader output
    m = re.search(r"duration: (\S+)s - (\S+)mb/s - (\S+)ops/s - (\S+)us/op", lines[0])
    assert lines[0].startswith("[bench_reader] ")
    assert [float(x) for x in m.groups()] == pytest.approx([2.0, 300 / 2**20, 1.5, 2e6 / 3], rel=1e-3, abs=1e-3)
    assert any("p50 2.000ms" in line and "p999" in line for line in lines)
    assert any("tool cpu" in line for line in lines)


# -- the timed loops against a scripted peer ----------------------------------


class ScriptedPeer:
    """A V2 server on 127.0.0.1:0 run by a thread: answers set-up, then runs ``script(sock, rfile)``."""

    def __init__(self, script):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.script = script
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        try:
            self.listener.settimeout(PEER_TIMEOUT)
            sock, _ = self.listener.accept()
            with sock:
                sock.settimeout(PEER_TIMEOUT)
                rfile = sock.makefile("rb")
                assert rfile.read(4) == b"  V2"
                line, body = read_command(rfile)
                assert line == b"IDENTIFY" and json.loads(body)["feature_negotiation"] is True
                sock.sendall(encode_response(json.dumps({"max_rdy_count": 2500, "version": "test"}).encode()))
                self.script(sock, rfile)
        except BaseException as exc:  # reported by join()
            self.error = exc
        finally:
            self.listener.close()

    def join(self):
        self.thread.join(PEER_TIMEOUT)
        assert not self.thread.is_alive()
        if self.error:
            raise self.error


def read_command(rfile) -> tuple[bytes, bytes | None]:
    line = rfile.readline()
    if not line:
        raise EOFError
    line = line.rstrip(b"\n")
    if line.split(b" ")[0] in (b"IDENTIFY", b"PUB", b"MPUB"):
        (size,) = struct.unpack(">I", rfile.read(4))
        return line, rfile.read(size)
    return line, None


def in_pieces(data: bytes, piece: int = 7):
    return [data[i : i + piece] for i in range(0, len(data), piece)]


def run_against(peer: ScriptedPeer, worker):
    """Connect ``worker`` to ``peer``, run it to its end and close it, then wait for the peer's
    script to finish. Returns the worker's report."""
    try:
        worker.connect()
        start = time.monotonic()
        report = worker.run(start, start + PEER_TIMEOUT, Scoreboard([0, 0], 1), 0)
    finally:
        worker.close()
    peer.join()
    return report


def test_reader_loop_handles_split_frames_and_heartbeats():
    ids = [f"{i:016x}".encode() for i in range(50)]
    received = []

    def script(sock, rfile):
        assert read_command(rfile) == (b"SUB sub_bench ch", None)
        sock.sendall(encode_response(b"OK"))
        assert read_command(rfile) == (b"RDY 2500", None)
        now = time.time_ns()
        stream = b"".join(encode_message_frame(now, 1, i, b"x" * 100) for i in ids[:20])
        stream += encode_response(b"_heartbeat_")
        stream += b"".join(encode_message_frame(now, 1, i, b"x" * 100) for i in ids[20:])
        for piece in in_pieces(stream):
            sock.sendall(piece)
        while True:
            try:
                received.append(read_command(rfile)[0])
            except EOFError:
                return

    peer = ScriptedPeer(script)
    plan = ConsumerPlan(host="127.0.0.1", port=peer.port, subscriptions=[("sub_bench", "ch")], rdy=2500,
                        client_id="test", count=len(ids))
    report = run_against(peer, ReaderWorker(plan))
    assert report.messages == len(ids)
    assert report.body_bytes == 100 * len(ids)
    assert report.latencies.count == len(ids)
    assert received.count(b"NOP") == 1
    assert [r for r in received if r != b"NOP"] == [b"FIN " + i for i in ids]


def test_writer_loop_counts_oks_not_heartbeats():
    commands = []

    def script(sock, rfile):
        while True:
            try:
                line, body = read_command(rfile)
            except EOFError:
                return
            commands.append((line, body))
            if line == b"NOP":
                continue
            reply = encode_response(b"OK")
            if len(commands) == 2:
                reply = encode_response(b"_heartbeat_") + reply
            for piece in in_pieces(reply, 3):
                sock.sendall(piece)

    peer = ScriptedPeer(script)
    config = WriterConfig(host="127.0.0.1", port=peer.port, size=10, batch_size=200, count=450, connections=1,
                          pipeline=2)
    report = run_against(peer, WriterWorker(config, [3]))  # ceil(450 / 200) batches
    assert report.messages == 600 and report.body_bytes == 6000
    mpubs = [c for c in commands if c[0] == b"MPUB sub_bench"]
    assert len(mpubs) == 3
    assert struct.unpack(">I", mpubs[0][1][:4]) == (200,)
    assert (b"NOP", None) in commands


# -- the matrix runner's profile summary ---------------------------------------


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
                           cwd=tmp_path, env=child_env(), capture_output=True, text=True, check=True).stdout.split()
    assert [Path(f).resolve() for f in found] == [ROOT / "broker" / "__init__.py", ROOT / "diskqueue" / "__init__.py"]
    assert Path(broker.__file__).resolve() == ROOT / "broker" / "__init__.py"
