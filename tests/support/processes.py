"""A real ``pynsqd`` process (``python -m broker``) on ephemeral ports, read from its log."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BrokerProcess", "Exited", "broker_args", "run_to_exit", "stop_process", "wait_listening"]

_LISTEN = re.compile(r"(TCP|HTTP): listening on (\S+)")


def broker_args(data_path: Path, *extra: str) -> list[str]:
    """Command-line flags for a broker on 127.0.0.1:0 (TCP, HTTP, and HTTPS when given a certificate)
    with ``data_path``."""
    return [f"--data-path={data_path}", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
            "--https-address=127.0.0.1:0", *extra]


class BrokerProcess:
    """A real ``pynsqd`` process (``python -m broker``); ports parsed from its log.

    ``program`` runs another nsqd-compatible program instead (nsq's own ``nsqd``), which
    takes the same flags and logs its listeners the same way; ``cwd`` is where it runs
    (``python -m broker`` in another checkout runs that checkout's code).
    """

    def __init__(self, data_path: Path, *extra: str, log_path: Path | None = None,
                 program: list[str] | None = None, preexec_fn: Callable[[], None] | None = None,
                 cwd: Path | None = None):
        self.program = program or [sys.executable, "-m", "broker"]
        self.cwd = cwd
        self.data_path = data_path
        self.extra = extra
        self.preexec_fn = preexec_fn  # run in the child before exec (e.g. to set rlimits)
        # one log per data directory: a restart appends to its own, and two brokers side by
        # side (``one``, ``two``) never read each other's lines
        self.log_path = log_path or data_path.parent / ("broker.log" if data_path.name == "data"
                                                         else f"broker-{data_path.name}.log")
        self.proc: subprocess.Popen | None = None
        self.tcp: tuple[str, int] | None = None
        self.http: tuple[str, int] | None = None

    def start(self, timeout: float = 20.0) -> BrokerProcess:
        """Start it and return once both listeners are logged; raises if it exits first."""
        self.data_path.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        start_offset = log.tell()
        self.proc = subprocess.Popen(
            [*self.program, *broker_args(self.data_path, *self.extra)],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, preexec_fn=self.preexec_fn,
            cwd=self.cwd,
        )
        log.close()
        found = wait_listening(self.proc, self.log_path, start_offset, ("TCP", "HTTP"), "broker", timeout)
        self.tcp, self.http = found["TCP"], found["HTTP"]
        return self

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

    def rss(self, field: str = "VmRSS") -> int:
        """The process's resident set size in bytes (``field="VmHWM"``: its peak); Linux only."""
        with open(f"/proc/{self.proc.pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError(f"no {field} in /proc/{self.proc.pid}/status")


def stop_process(proc: subprocess.Popen, timeout: float, sig: int = signal.SIGTERM) -> int | None:
    """Send ``sig`` (SIGTERM: the graceful path) and wait up to ``timeout`` seconds for the exit;
    SIGKILL it if it is still running then. Returns its exit status, None if it had to be killed."""
    proc.send_signal(sig)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        return None


def wait_listening(proc: subprocess.Popen, log_path: Path, start_offset: int, kinds: tuple[str, ...], name: str,
                   timeout: float) -> dict[str, tuple[str, int]]:
    """The addresses of the listeners ``kinds`` (``TCP``, ``HTTP``) once the log ``proc`` writes
    to ``log_path`` (from ``start_offset`` on) names them all. Raises RuntimeError, with the log,
    if ``proc`` exits first, or after ``timeout`` seconds (``proc`` killed then)."""
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = log_path.read_bytes()[start_offset:].decode("utf-8", "replace")
        found = dict(_LISTEN.findall(text))
        if all(kind in found for kind in kinds):
            return {kind: _split(address) for kind, address in found.items()}
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{text}")
        time.sleep(0.05)  # the log is the only signal another process gives; poll it
    proc.kill()
    proc.wait(10)
    raise RuntimeError(f"{name} did not start within {timeout}s:\n{text}")


def _split(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class Exited:
    """How a program that was expected to stop by itself ended: status, output, peak memory."""

    status: int
    output: str
    max_rss: int  # bytes

    @property
    def fatal_lines(self) -> list[str]:
        """The text after ``FATAL: `` of each FATAL line (timestamps left out, so nsqd's and pynsqd's compare)."""
        return [line.partition("FATAL: ")[2] for line in self.output.splitlines() if "FATAL: " in line]


def run_to_exit(data_path: Path, *extra: str, program: list[str] | None = None, timeout: float = 30.0) -> Exited:
    """Start ``pynsqd`` (or ``program``) on ``data_path`` as :class:`BrokerProcess` would, and
    wait for it to exit by itself (a start-up failure); it is killed after ``timeout`` seconds."""
    argv = [*(program or [sys.executable, "-m", "broker"]), *broker_args(data_path, *extra)]
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        timer = threading.Timer(timeout, proc.kill)  # Popen.kill does nothing once the child is reaped
        timer.start()
        peak = _PeakMemory(proc.pid)
        try:
            _, status, _usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
            peak.stop()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        output = out.read().decode("utf-8", "replace")
    return Exited(proc.returncode, output, peak.bytes)


class _PeakMemory:
    """The peak resident memory of a running process, read from ``/proc/<pid>/status`` (VmHWM)
    every few milliseconds until :meth:`stop`.

    Not the ``ru_maxrss`` that ``wait4`` returns: on Linux that also counts the memory of the
    process that forked it (the test runner, hundreds of MB late in a run) until it exec'd.
    """

    def __init__(self, pid: int):
        self.bytes = 0
        self._path = f"/proc/{pid}/status"
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._done.is_set():
            try:
                with open(self._path) as status:
                    for line in status:
                        if line.startswith("VmHWM:"):
                            self.bytes = max(self.bytes, int(line.split()[1]) * 1024)
            except (OSError, ValueError):
                pass  # gone, or a zombie without memory
            self._done.wait(0.005)

    def stop(self) -> None:
        self._done.set()
        self._thread.join()
