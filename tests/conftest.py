"""Shared fixtures: brokers in-process (on 127.0.0.1:0, tmp data path) and as real processes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def broker_args(data_path: Path, *extra: str) -> list[str]:
    return [f"--data-path={data_path}", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", *extra]


@asynccontextmanager
async def running_daemon(data_path: Path, *extra: str):
    """An in-process daemon; shut down gracefully on exit."""
    from broker.config.options import parse_args
    from broker.daemon import Daemon

    daemon = Daemon(parse_args(broker_args(data_path, *extra)))
    async with trio.open_nursery() as nursery:
        daemon.addresses = await nursery.start(daemon.run)
        try:
            yield daemon
        finally:
            daemon.request_shutdown()


@pytest.fixture
async def daemon(tmp_path):
    """A daemon with default options on a fresh data directory."""
    async with running_daemon(tmp_path / "data") as d:
        yield d


@pytest.fixture
def start_daemon(tmp_path):
    """Factory: ``async with start_daemon(*flags) as d`` on the test's data directory."""
    def factory(*extra: str, data_path: Path | None = None):
        return running_daemon(data_path or tmp_path / "data", *extra)
    return factory


_LISTEN = re.compile(r"(TCP|HTTP): listening on (\S+)")


class BrokerProcess:
    """A real ``pynsqd`` process (``python -m broker``); ports parsed from its log."""

    def __init__(self, data_path: Path, *extra: str, log_path: Path | None = None):
        self.data_path = data_path
        self.extra = extra
        self.log_path = log_path or data_path.parent / "broker.log"
        self.proc: subprocess.Popen | None = None
        self.tcp: tuple[str, int] | None = None
        self.http: tuple[str, int] | None = None

    def start(self, timeout: float = 20.0) -> BrokerProcess:
        self.data_path.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        start_offset = log.tell()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "broker", *broker_args(self.data_path, *self.extra)],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL,
        )
        log.close()
        import time
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log_path.read_bytes()[start_offset:].decode("utf-8", "replace")
            found = dict((kind, addr) for kind, addr in _LISTEN.findall(text))
            if "TCP" in found and "HTTP" in found:
                self.tcp = _split(found["TCP"])
                self.http = _split(found["HTTP"])
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{text}")
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"broker did not start within {timeout}s:\n{text}")

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait: the graceful path."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """SIGKILL: the crash path."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def _split(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


@pytest.fixture
def broker_process(tmp_path):
    """Factory for real broker processes; every process started is killed at the end."""
    started: list[BrokerProcess] = []

    def factory(*extra: str, data_path: Path | None = None) -> BrokerProcess:
        proc = BrokerProcess(data_path or tmp_path / "data", *extra)
        started.append(proc)
        return proc.start()

    yield factory
    for proc in started:
        proc.kill()
