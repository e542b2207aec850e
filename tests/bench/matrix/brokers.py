"""The brokers a run starts (pynsqd or nsqd, as processes) and the CPU accounting of a run."""

from __future__ import annotations

import os
import re
import resource
import shlex
import signal
import subprocess
import time
from pathlib import Path

from tests.support.paths import REPO

#: the checkout whose broker and tools the runs start (cwd and first on PYTHONPATH)
ROOT = REPO


LISTENING = re.compile(rb"(TCP|HTTP): listening on \[?([^\s\]]*)\]?:(\d+)")


START_TIMEOUT = 30.0


STOP_TIMEOUT = 60.0


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def harness_cpu_seconds() -> float:
    """CPU seconds of this runner and of its finished children (the bench tools it waited for)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def machine_busy_seconds() -> float:
    """CPU seconds all cores of the machine spent busy so far (from /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / _CLOCK_TICKS


def process_memory_mb(pid: int) -> tuple[float, float]:
    """(peak RSS, current RSS) of process ``pid`` in MiB, from /proc/<pid>/status."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            values[key] = int(rest.split()[0]) / 1024
    return values["VmHWM"], values["VmRSS"]


class BrokerProcess:
    """A broker started for one run; owns the process and its data directory."""

    def __init__(self, command: list[str], data_path: Path, extra: list[str], log_path: Path):
        self.command = [*command, "--data-path", str(data_path), "--tcp-address", "127.0.0.1:0",
                        "--http-address", "127.0.0.1:0", *extra]
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.address: tuple[str, int] | None = None
        self.http_address: tuple[str, int] | None = None

    def start(self) -> tuple[str, int]:
        """Start the broker and wait for its TCP and HTTP listeners; raises RuntimeError."""
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                     cwd=ROOT, env=child_env())
        log.close()
        limit = time.monotonic() + START_TIMEOUT
        while time.monotonic() < limit:
            found = {kind: (host.decode(), int(port)) for kind, host, port in LISTENING.findall(self.log_path.read_bytes())}
            if b"TCP" in found and b"HTTP" in found:
                self.address, self.http_address = found[b"TCP"], found[b"HTTP"]
                return self.address
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"broker did not start: {shlex.join(self.command)}\n{self.log_tail()}")

    @property
    def pid(self) -> int:
        """The broker's process id."""
        assert self.proc is not None
        return self.proc.pid

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of the broker so far (all its threads)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS

    def memory_mb(self) -> tuple[float, float]:
        """(peak RSS, current RSS) in MiB, from /proc/<pid>/status."""
        return process_memory_mb(self.pid)

    def log_tail(self, lines: int = 20) -> str:
        """The last lines the broker logged."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after STOP_TIMEOUT; returns the exit status. Safe to call twice."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def child_env(**extra: str) -> dict:
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env
