"""The benchmark tool's short real runs against a ``pynsqd`` process."""

from __future__ import annotations

import json

import pytest

from broker.bench import main


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
