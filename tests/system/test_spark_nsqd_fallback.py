"""Against nsq's own nsqd (no lease extension) the connector reads on the driver, and says so."""

from __future__ import annotations

import json
import logging
import socket

import pytest

from broker.protocol import MAGIC_V2, encode_identify
from pyspark_nsq.held_source import HeldSource
from pyspark_nsq.leased_source import LeasedSource
from pyspark_nsq.options import SourceOptions
from pyspark_nsq.stream_reader import open_source
from tests.support.paths import nsq_bin
from tests.support.processes import BrokerProcess

pytestmark = pytest.mark.spark


def _start(tmp_path, program):
    broker = BrokerProcess(tmp_path / "data", log_path=tmp_path / "broker.log", program=program)
    return broker.start()


@pytest.fixture
def nsqd(tmp_path):
    programs = nsq_bin()
    if programs is None:
        pytest.skip("nsq 1.3.0's nsqd not found (set NSQ_BIN or provide ../shared/nsq/bin)")
    broker = _start(tmp_path, [str(programs / "nsqd")])
    yield broker
    broker.kill()


@pytest.fixture
def pynsqd(tmp_path):
    broker = _start(tmp_path, None)
    yield broker
    broker.kill()


def _open_and_stop(broker, caplog):
    """The streaming source the connector opens on ``broker`` for topic ``t``, stopped again;
    the connector's INFO lines are captured in ``caplog``."""
    caplog.set_level(logging.INFO, "pyspark_nsq")
    host, port = broker.tcp
    source = open_source(SourceOptions.parse({"nsqd": f"{host}:{port}", "topic": "t", "channel": "c"}))
    source.stop()
    return source


def test_nsqds_identify_answer_has_no_lease(nsqd):
    with socket.create_connection(nsqd.tcp, timeout=10) as sock:
        sock.sendall(MAGIC_V2 + encode_identify({"feature_negotiation": True, "lease": "q.1.0"}))
        data = b""
        while len(data) < 8 or len(data) < 4 + int.from_bytes(data[:4], "big"):
            data += sock.recv(4096)
    answer = json.loads(data[8:])
    assert answer["version"] == "1.3.0" and "lease" not in answer


def test_against_nsqd_the_source_reads_on_the_driver_and_logs_it(nsqd, caplog):
    assert isinstance(_open_and_stop(nsqd, caplog), HeldSource)
    host, port = nsqd.tcp
    assert (f"nsq source: nsqd {host}:{port} offers no leases (a pynsqd extension); messages pass "
            "through the driver, which does not scale past one process") in caplog.messages


def test_against_pynsqd_the_executors_read(pynsqd, caplog):
    assert isinstance(_open_and_stop(pynsqd, caplog), LeasedSource)
    assert "nsq source: the brokers offer leases; executors read the messages" in caplog.messages
