"""What the Python runtime tells about the process: garbage-collection pauses and memory.

Python has no Go heap. nsqd's ``memory`` block keeps its keys and is filled from what
CPython offers (see :class:`~broker.observe.stats.MemoryStats`); GC pauses are measured
with ``gc.callbacks`` into a ring of the last :data:`GC_PAUSE_HISTORY`, as Go keeps
``MemStats.PauseNs``.
"""

from __future__ import annotations

import gc
import math
import os
import platform
import resource
import sys
import time
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.observe.stats import MemoryStats


__all__ = ["BUILT_WITH", "GC_PAUSE_HISTORY", "GcPauses", "GC_PAUSES", "memory_stats"]

#: What the text format's first line says the broker was built with, in place of Go's version.
BUILT_WITH = f"{platform.python_implementation().lower()}{platform.python_version()}"

#: GC pauses remembered for the percentiles, as Go's ``MemStats.PauseNs`` ring.
GC_PAUSE_HISTORY = 256


class GcPauses:
    """Durations of recent garbage collections, measured with ``gc.callbacks``.

    Go reports the pauses of its last 256 collections; this keeps the last
    :data:`GC_PAUSE_HISTORY` of CPython's. :meth:`install` and :meth:`uninstall` nest, so
    every server that shows memory stats can install it for as long as it runs.
    """

    __slots__ = ("_pauses", "_started", "_users")

    def __init__(self) -> None:
        self._pauses: deque[int] = deque(maxlen=GC_PAUSE_HISTORY)
        self._started = 0
        self._users = 0

    def install(self) -> None:
        """Start measuring (once, however many users install it)."""
        self._users += 1
        if self._users == 1:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        """Stop measuring once the last user has uninstalled it."""
        if self._users == 0:
            return
        self._users -= 1
        if self._users == 0:
            try:
                gc.callbacks.remove(self._callback)
            except ValueError:
                pass

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter_ns()
        elif self._started:
            self._pauses.append(time.perf_counter_ns() - self._started)
            self._started = 0

    def record(self, pause_ns: int) -> None:
        """Add one pause measured elsewhere."""
        self._pauses.append(pause_ns)

    def percentiles_usec(self) -> tuple[int, int, int]:
        """The 100th, 99th and 95th percentile pause in microseconds (nsqd's rounding)."""
        pauses = sorted(self._pauses)
        p100, p99, p95 = (_go_percentile(p, pauses) // 1000 for p in (100.0, 99.0, 95.0))
        return p100, p99, p95


#: The process-wide pause recorder (``gc.callbacks`` is process-wide too).
GC_PAUSES = GcPauses()


def _go_percentile(perc: float, ordered: list[int]) -> int:
    # nsqd's percentile(): index floor(perc/100 * n + 0.5), clamped to the last element.
    if not ordered:
        return 0
    index = min(int(math.floor(perc / 100.0 * len(ordered) + 0.5)), len(ordered) - 1)
    return ordered[index]


_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _resident_bytes() -> int:
    try:
        with open("/proc/self/statm", "rb") as stream:
            return int(stream.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        # ru_maxrss is the peak (KiB on Linux), the best a non-Linux system offers here.
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_stats(pauses: GcPauses = GC_PAUSES) -> MemoryStats:
    """The ``memory`` block now (see :class:`MemoryStats` for where each value comes from)."""
    from broker.observe.stats import MemoryStats  # the records load with the first report, not at start

    p100, p99, p95 = pauses.percentiles_usec()
    return MemoryStats(
        heap_objects=sys.getallocatedblocks(),
        heap_idle_bytes=0,
        heap_in_use_bytes=_resident_bytes(),
        heap_released_bytes=0,
        gc_pause_usec_100=p100,
        gc_pause_usec_99=p99,
        gc_pause_usec_95=p95,
        next_gc_bytes=0,
        gc_total_runs=sum(generation["collections"] for generation in gc.get_stats()),
    )
