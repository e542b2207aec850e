"""Tests of the benchmark tool itself: flags, percentile maths, output, the timed loops.

The loops are exercised against a scripted V2 peer on 127.0.0.1:0 (frames cut
into odd pieces, heartbeats in between); ``tests/system/test_bench_runs.py`` runs
the tool briefly against a real broker.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import threading
import time

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
