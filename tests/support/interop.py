"""Real client libraries in their own processes, observed through the JSON lines they print.

Each library runs in a separate interpreter (gevent must never be patched into the Trio test
process, and Tornado/asyncio/Node each want their own loop). A client script prints one JSON
object per line: ``subscribed`` once a consumer's SUB is answered, ``message`` per delivery,
``published`` per publish response, ``error`` for every error frame the library reports,
``done`` at a clean end. Bodies are Latin-1 text on both sides.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
import sys
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from tests.support.paths import REPO

__all__ = [
    "ANSQ",
    "GNSQ",
    "HEX16",
    "LIBRARIES",
    "NSQJS",
    "PYNSQ",
    "ClientFailed",
    "ClientProcess",
    "Library",
    "address",
    "assert_no_errors",
    "consume_config",
    "libraries",
    "nsqjs_missing",
    "of_kind",
    "publish_with",
    "run_client",
    "start_client",
    "text",
]

INTEROP_DIR = Path(__file__).resolve().parents[1] / "system" / "interop"
CLIENTS_DIR = INTEROP_DIR / "clients"
JS_DIR = INTEROP_DIR / "js"
HEX16 = re.compile(r"^[0-9a-f]{16}$")

# The command line that starts each client script.
PYNSQ = [sys.executable, str(CLIENTS_DIR / "pynsq_client.py")]
GNSQ = [sys.executable, str(CLIENTS_DIR / "gnsq_client.py")]
ANSQ = [sys.executable, str(CLIENTS_DIR / "ansq_client.py")]
NSQJS = ["node", str(JS_DIR / "nsqjs_client.js")]
_serial = itertools.count()


def nsqjs_missing() -> str | None:
    """Why the nsqjs tests cannot run here, or None when node and nsqjs are installed."""
    if shutil.which("node") is None:
        return "node is not installed"
    if not (JS_DIR / "node_modules" / "nsqjs").is_dir():
        return f"nsqjs is not installed (npm ci --prefix {JS_DIR.relative_to(REPO)})"
    return None


def address(host_port: tuple[str, int]) -> str:
    """A broker's ``(host, port)`` as the clients take it: ``"host:port"``."""
    host, port = host_port
    return f"{host}:{port}"


def text(body: bytes) -> str:
    """A body as the client scripts take and report it."""
    return body.decode("latin-1")


def of_kind(events: list[dict], kind: str) -> list[dict]:
    """The report lines of one kind, in the order they were printed."""
    return [event for event in events if event["event"] == kind]


def assert_no_errors(events: list[dict]) -> None:
    """The client library saw no error frame and no connection failure."""
    errors = of_kind(events, "error")
    assert not errors, f"the client library reported errors: {errors}"


class ClientFailed(AssertionError):
    """The client process exited badly or its report ended early; carries its stderr."""


class ClientProcess:
    """One running client script; its report is read line by line as it arrives."""

    __slots__ = ("name", "process", "stderr_path", "events", "_buffer")

    def __init__(self, name: str, process: trio.Process, stderr_path: Path):
        self.name = name
        self.process = process
        self.stderr_path = stderr_path
        self.events: list[dict] = []
        self._buffer = b""

    def _failure(self, why: str) -> ClientFailed:
        stderr = self.stderr_path.read_text(errors="replace")[-4000:]
        return ClientFailed(f"{self.name}: {why}\nreport so far: {self.events}\nstderr:\n{stderr}")

    async def next_event(self) -> dict | None:
        """The next report line, or None at the end of the report."""
        while b"\n" not in self._buffer:
            data = await self.process.stdout.receive_some(65536)
            if not data:
                if self._buffer:
                    raise self._failure(f"report ends mid-line: {self._buffer!r}")
                return None
            self._buffer += data
        line, _, self._buffer = self._buffer.partition(b"\n")
        event = json.loads(line)
        for key in ("timestamp", "received_ns"):
            if key in event:
                event[key] = int(event[key])
        self.events.append(event)
        return event

    async def wait_for(self, kind: str, count: int = 1) -> list[dict]:
        """Read on until ``count`` events of ``kind`` were reported in total."""
        while len(of_kind(self.events, kind)) < count:
            if await self.next_event() is None:
                raise self._failure(f"exited before reporting {count} {kind!r}")
        return of_kind(self.events, kind)[:count]

    async def result(self) -> list[dict]:
        """The whole report, once the process has ended with status 0 after ``done``."""
        while await self.next_event() is not None:
            pass
        status = await self.process.wait()
        if status != 0 or not of_kind(self.events, "done"):
            raise self._failure(f"exit status {status}")
        return self.events


@asynccontextmanager
async def start_client(argv: list[str], command: str, config: dict, *, log_dir: Path):
    """Run ``argv command json(config)``; killed on exit from the block if still running."""
    name = f"{Path(argv[-1]).stem} {command}"
    log_dir.mkdir(parents=True, exist_ok=True)
    stderr_path = log_dir / f"{next(_serial):02d}-{Path(argv[-1]).stem}-{command}.stderr"
    with open(stderr_path, "wb") as stderr:
        process = await trio.lowlevel.open_process(
            [*argv, command, json.dumps(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
    client = ClientProcess(name, process, stderr_path)
    try:
        yield client
    finally:
        if process.returncode is None:
            process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()
            await process.stdout.aclose()


async def run_client(argv: list[str], command: str, config: dict, *, log_dir: Path) -> list[dict]:
    """Run a client script to completion and return its report."""
    async with start_client(argv, command, config, log_dir=log_dir) as client:
        return await client.result()


async def publish_with(argv: list[str], broker, logs: Path, *ops: dict) -> list[dict]:
    """Run a client's ``publish`` command with ``ops``; every one must get ``OK``."""
    events = await run_client(argv, "publish", {"tcp": address(broker.tcp), "ops": list(ops)}, log_dir=logs)
    assert [e["response"] for e in of_kind(events, "published")] == ["OK"] * len(ops)
    return events


def consume_config(broker, topic: str, channels=("ch",), **options) -> dict:
    """The config of a client's ``consume`` command: ``topic`` through ``channels``."""
    return {"tcp": address(broker.tcp), "topic": topic, "channels": list(channels), **options}


@dataclass(frozen=True)
class Library:
    """One client library as the shared scenarios drive it."""

    name: str
    argv: list[str]
    #: The consume option that makes the library give up on a message after N attempts (None: it has none).
    max_attempts_option: str | None = None
    #: Why its tests cannot run on this machine (None: they can).
    missing: str | None = None


LIBRARIES = {
    "pynsq": Library("pynsq", PYNSQ, max_attempts_option="max_tries"),
    "gnsq": Library("gnsq", GNSQ, max_attempts_option="max_tries"),
    "ansq": Library("ansq", ANSQ),
    "nsqjs": Library("nsqjs", NSQJS, max_attempts_option="max_attempts", missing=nsqjs_missing()),
}


def libraries(*names: str) -> pytest.MarkDecorator:
    """Parametrize a test over the named client libraries (all of them when none are named)."""
    chosen = [LIBRARIES[name] for name in names or LIBRARIES]
    return pytest.mark.parametrize(
        "library",
        [
            pytest.param(lib, id=lib.name, marks=pytest.mark.skipif(lib.missing is not None, reason=str(lib.missing)))
            for lib in chosen
        ],
    )
