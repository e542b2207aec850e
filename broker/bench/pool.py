"""Worker processes: set-up, a common start, progress, and their reports.

Each worker process owns some connections and runs one timed loop over them, so
the load generator uses every core it is given instead of one GIL. The parent
waits until every worker has connected (and, with ``--deadline``, until the
deadline), sends one start signal, prints progress from a shared scoreboard, and
collects a ``WorkerReport`` from each worker at the end.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import resource
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO

from .latency import LatencySamples

__all__ = ["WorkerReport", "Scoreboard", "PoolOutcome", "BenchFailed", "run_pool", "cpu_seconds"]

#: how long set-up (connect, IDENTIFY, SUB) may take before the run is abandoned
SETUP_TIMEOUT = 60.0
#: how long after the end of the run the workers may take to finish
DRAIN_TIMEOUT = 30.0
_POLL = 0.05


class BenchFailed(Exception):
    """A worker could not connect, or failed during the run."""


@dataclass(slots=True)
class WorkerReport:
    """What one worker process measured (sent back to the parent by pickling)."""

    messages: int
    body_bytes: int
    started: float  # time.monotonic() when its timed loop began
    finished: float  # time.monotonic() when its last counted message completed
    cpu_user: float
    cpu_system: float
    latencies: LatencySamples | None = None
    extra: dict = field(default_factory=dict)


class Scoreboard:
    """Per-worker message counts and a stop flag in shared memory (no locks: one writer per slot)."""

    __slots__ = ("_cells", "_n")

    def __init__(self, cells, n: int):
        self._cells = cells
        self._n = n

    def set(self, slot: int, count: int) -> None:
        """Publish one worker's running count."""
        self._cells[slot] = count

    def total(self) -> int:
        """The sum of every worker's count."""
        return sum(self._cells[: self._n])

    def stop(self) -> None:
        """Ask every worker to finish."""
        self._cells[self._n] = 1

    @property
    def stopped(self) -> bool:
        """True once stop() was called in any process."""
        return self._cells[self._n] != 0


class Worker(Protocol):
    """The loop a worker process runs: blocking set-up, then one timed run."""

    def connect(self) -> None: ...

    def run(self, start: float, end: float | None, board: Scoreboard, slot: int) -> WorkerReport: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class PoolOutcome:
    """The reports of all workers and the run's timing and CPU use."""

    reports: list[WorkerReport]
    start: float  # time.monotonic() of the start signal
    setup: float  # seconds from starting the workers until all were connected
    duration: float  # start signal to the last worker's last message
    cpu_user: float  # the tool's own processes, over the timed run
    cpu_system: float


def cpu_seconds() -> tuple[float, float]:
    """User and system CPU seconds of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


def _worker_main(factory: Callable[[], Worker], slot: int, cells, n: int, pipe) -> None:
    # a Ctrl-C in the terminal reaches the whole process group; only the parent
    # reacts to it, by raising the stop flag, so that every worker reports
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    worker = None
    try:
        worker = factory()
        worker.connect()
        pipe.send(("ready", None))
        message = pipe.recv()
        if message[0] != "go":
            return
        report = worker.run(message[1], message[2], Scoreboard(cells, n), slot)
        pipe.send(("done", report))
    except Exception as exc:
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        pipe.send(("error", detail))
    finally:
        if worker is not None:
            worker.close()
        pipe.close()


def _context():
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def run_pool(
    factories: Sequence[Callable[[], Any]],
    *,
    label: str,
    runfor: float | None,
    count: int | None = None,
    deadline: float | None = None,
    progress: float = 0.0,
    out: TextIO = sys.stderr,
) -> PoolOutcome:
    """Run one worker process per factory until ``runfor`` elapses or ``count`` messages.

    ``factories`` are picklable callables returning a ``Worker``. Raises BenchFailed
    when a worker fails; the worker processes are always joined before returning.
    """
    ctx = _context()
    n = len(factories)
    cells = ctx.RawArray("q", n + 1)
    board = Scoreboard(cells, n)
    pipes, procs = [], []
    setup_began = time.monotonic()
    try:
        for slot, factory in enumerate(factories):
            parent_end, child_end = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, args=(factory, slot, cells, n, child_end),
                               name=f"bench-{label}-{slot}", daemon=True)
            proc.start()
            child_end.close()
            pipes.append(parent_end)
            procs.append(proc)
        _await_ready(pipes)
        setup = time.monotonic() - setup_began
        if deadline is not None:
            delay = deadline - time.time()
            print(f"[bench_{label}] sleeping until {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(deadline))}"
                  f" UTC ({max(delay, 0):.3f}s)", file=out, flush=True)
            if delay > 0:
                time.sleep(delay)
        cpu0 = cpu_seconds()
        start = time.monotonic()
        end = start + runfor if runfor else None
        for p in pipes:
            p.send(("go", start, end))
        reports = _collect(pipes, board, label=label, start=start, end=end, count=count,
                           progress=progress, out=out)
        cpu1 = cpu_seconds()
    finally:
        for p in pipes:
            try:
                p.send(("abort", None))
            except OSError:
                pass
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.terminate()
                proc.join()
    finished = max(r.finished for r in reports)
    return PoolOutcome(
        reports=reports,
        start=start,
        setup=setup,
        duration=max(finished - start, 1e-9),
        cpu_user=sum(r.cpu_user for r in reports) + cpu1[0] - cpu0[0],
        cpu_system=sum(r.cpu_system for r in reports) + cpu1[1] - cpu0[1],
    )


def _await_ready(pipes: list) -> None:
    waiting = set(range(len(pipes)))
    limit = time.monotonic() + SETUP_TIMEOUT
    while waiting:
        ready = multiprocessing.connection.wait([pipes[i] for i in waiting],
                                                timeout=max(limit - time.monotonic(), 0))
        if not ready:
            raise BenchFailed(f"workers not connected after {SETUP_TIMEOUT:g}s")
        for p in ready:
            kind, detail = _receive(p)
            if kind == "error":
                raise BenchFailed(f"set-up failed: {detail}")
            waiting.discard(pipes.index(p))


def _receive(pipe) -> tuple[str, Any]:
    try:
        return pipe.recv()
    except EOFError:
        return "error", "worker process exited"


def _collect(pipes, board: Scoreboard, *, label, start, end, count, progress, out) -> list[WorkerReport]:
    reports: dict[int, WorkerReport] = {}
    next_progress = start + progress if progress > 0 else None
    last_total, last_time = 0, start
    give_up = None
    while len(reports) < len(pipes):
        now = time.monotonic()
        try:
            ready = multiprocessing.connection.wait(
                [p for i, p in enumerate(pipes) if i not in reports], timeout=_POLL)
        except KeyboardInterrupt:
            print(f"[bench_{label}] interrupted, stopping", file=out, flush=True)
            board.stop()
            continue
        for p in ready:
            kind, detail = _receive(p)
            if kind == "error":
                board.stop()
                raise BenchFailed(f"worker failed: {detail}")
            reports[pipes.index(p)] = detail
        now = time.monotonic()
        if count is not None and not board.stopped and board.total() >= count:
            board.stop()
        if end is not None and now >= end and give_up is None:
            give_up = end + DRAIN_TIMEOUT
        if give_up is not None and now >= give_up:
            raise BenchFailed(f"workers still running {DRAIN_TIMEOUT:g}s after the end of the run")
        if next_progress is not None and now >= next_progress and len(reports) < len(pipes):
            total = board.total()
            rate = (total - last_total) / (now - last_time)
            print(f"[bench_{label}] {now - start:8.1f}s: {total} msgs, {rate:.0f} msgs/s",
                  file=out, flush=True)
            last_total, last_time = total, now
            next_progress += progress
    return [reports[i] for i in range(len(pipes))]
