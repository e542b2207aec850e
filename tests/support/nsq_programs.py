"""nsq 1.3.0's own programs (nsqlookupd, nsqadmin, nsqd) as processes on ephemeral ports.

They are found through an ``NSQ_BIN`` environment variable naming their folder, or the
``shared/nsq/bin`` script beside (or above) the checkout, which unpacks them and prints the
folder. :func:`nsq_bin_missing` says why a test must skip on a machine that has neither.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.paths import nsq_bin
from tests.support.processes import wait_listening

__all__ = ["NsqProgram", "nsq_bin", "nsq_bin_missing"]

def nsq_bin_missing() -> str | None:
    """Why tests with nsq's programs cannot run here, or None when they can."""
    if nsq_bin() is None:
        return "nsq 1.3.0's programs are not here (set NSQ_BIN, or put nsq's bin script at ../shared/nsq/bin)"
    return None


class NsqProgram:
    """One of nsq's programs running with ``args``; its addresses are read from its log.

    ``expect`` names the listeners it logs (``("TCP", "HTTP")`` for nsqlookupd and nsqd,
    ``("HTTP",)`` for nsqadmin).
    """

    def __init__(self, name: str, log_path: Path, *args: str, expect: tuple[str, ...] = ("TCP", "HTTP")):
        self.name = name
        self.args = list(args)
        self.log_path = log_path
        self.expect = expect
        self.proc: subprocess.Popen | None = None
        self.tcp: tuple[str, int] | None = None
        self.http: tuple[str, int] | None = None

    def start(self, timeout: float = 20.0) -> NsqProgram:
        """Start it and return once its listeners are logged; raises if it exits first."""
        folder = nsq_bin()
        assert folder is not None, nsq_bin_missing()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            start_offset = log.tell()
            self.proc = subprocess.Popen([str(folder / self.name), *self.args], stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL)
        found = wait_listening(self.proc, self.log_path, start_offset, self.expect, self.name, timeout)
        self.tcp, self.http = found.get("TCP"), found.get("HTTP")
        return self

    def address(self, kind: str) -> str:
        """``host:port`` of its TCP or HTTP listener."""
        host, port = self.tcp if kind == "TCP" else self.http
        return f"{host}:{port}"

    def kill(self) -> None:
        """SIGKILL and wait (idempotent)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

