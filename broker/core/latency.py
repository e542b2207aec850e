"""End-to-end processing latency (publish to FIN), nsqd's ``e2e_processing_latency``.

nsqd keeps two quantile streams, each covering half of
``--e2e-processing-latency-window-time``, and reports their merge; we do the
same with two bounded reservoirs of samples. With no percentiles configured
only the count is kept, which costs one integer add per FIN.
"""

from __future__ import annotations

import random
from bisect import bisect_left, bisect_right
from dataclasses import dataclass

import trio

__all__ = ["LATENCY_BUCKETS", "HistogramStats", "LatencyHistogram", "LatencyStream"]

#: Samples kept per half window (reservoir sampling beyond this).
RESERVOIR_SIZE = 4096


class _Reservoir:
    __slots__ = ("samples", "seen", "started")

    def __init__(self, started: float):
        self.samples: list[int] = []
        self.seen = 0
        self.started = started

    def add(self, value: int) -> None:
        self.seen += 1
        if len(self.samples) < RESERVOIR_SIZE:
            self.samples.append(value)
        else:
            slot = random.randrange(self.seen)
            if slot < RESERVOIR_SIZE:
                self.samples[slot] = value


class LatencyStream:
    """Latency samples (ns) of one topic or channel over a rolling window."""

    __slots__ = ("percentiles", "half_window", "count", "_current", "_previous")

    def __init__(self, percentiles: tuple[float, ...], window_time: float):
        self.percentiles = tuple(percentiles)
        self.half_window = window_time / 2
        self.count = 0
        self._current: _Reservoir | None = None
        self._previous: _Reservoir | None = None

    def record_many(self, latencies_ns: list[int]) -> None:
        """Add samples (one FIN run's)."""
        if not self.percentiles:
            self.count += len(latencies_ns)
            return
        for latency_ns in latencies_ns:
            self.record(latency_ns)

    def record(self, latency_ns: int) -> None:
        """Add one sample."""
        self.count += 1
        if not self.percentiles:
            return
        now = trio.current_time()
        current = self._current
        if current is None or now - current.started >= self.half_window:
            self._previous = current if current is not None and now - current.started < 2 * self.half_window else None
            current = self._current = _Reservoir(now)
        current.add(latency_ns)

    def snapshot(self) -> dict:
        """``{"count": n, "percentiles": [{"quantile": q, "value": ns}, ...] | None}``."""
        if not self.percentiles:
            return {"count": self.count, "percentiles": None}
        samples: list[int] = []
        now = trio.current_time()
        for reservoir in (self._previous, self._current):
            if reservoir is not None and now - reservoir.started < 2 * self.half_window:
                samples.extend(reservoir.samples)
        samples.sort()
        result = []
        for q in self.percentiles:
            value = samples[min(len(samples) - 1, int(q * len(samples)))] if samples else 0
            result.append({"quantile": q, "value": value})
        return {"count": self.count, "percentiles": result}


#: Upper bounds (seconds) of the publish-to-FIN histogram buckets: milliseconds for
#: healthy consumers up to an hour for messages that waited in a backlog.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
)
_BOUNDS_NS = tuple(round(bound * 1e9) for bound in LATENCY_BUCKETS)
#: From this many latencies at once, sorting them and bisecting per bucket beats a bisect per latency.
_SORT_FROM = 32


@dataclass(frozen=True, slots=True)
class HistogramStats:
    """Cumulative bucket counts of a latency histogram: ``buckets`` is ``((upper_seconds, n), ...)``."""

    buckets: tuple[tuple[float, int], ...]
    count: int
    sum_seconds: float


class LatencyHistogram:
    """Publish-to-FIN latencies of one channel in fixed buckets; one per channel, owned by it.

    :meth:`observe_many` is called for every run of FINs: one bisect and an add per message,
    or for a large run one sort and a bisect per bucket.
    """

    __slots__ = ("_counts", "_sum_ns")

    def __init__(self) -> None:
        self._counts = [0] * (len(_BOUNDS_NS) + 1)
        self._sum_ns = 0

    def observe_many(self, latencies_ns: list[int]) -> None:
        """Record latencies in nanoseconds (negative ones count as 0)."""
        counts = self._counts
        bounds = _BOUNDS_NS
        if len(latencies_ns) >= _SORT_FROM:
            # a large FIN run: sorted once, each bucket is one bisect (C loops, not one per message)
            ordered = sorted(latencies_ns)
            start = bisect_right(ordered, 0)  # none of them adds to the sum
            counts[0] += start
            positive = start
            for index, bound in enumerate(bounds):
                stop = bisect_right(ordered, bound, start)
                counts[index] += stop - start
                start = stop
            counts[-1] += len(ordered) - start
            self._sum_ns += sum(ordered[positive:])
            return
        total = 0
        for latency_ns in latencies_ns:
            if latency_ns > 0:
                counts[bisect_left(bounds, latency_ns)] += 1
                total += latency_ns
            else:
                counts[0] += 1
        self._sum_ns += total

    def snapshot(self) -> HistogramStats:
        """Cumulative counts per bucket (``+Inf`` is :attr:`HistogramStats.count`)."""
        if not any(self._counts):
            return _EMPTY_HISTOGRAM  # most channels of a big broker finish nothing: /stats stays cheap
        running = 0
        buckets = []
        for bound, count in zip(LATENCY_BUCKETS, self._counts):
            running += count
            buckets.append((bound, running))
        total = running + self._counts[-1]
        return HistogramStats(tuple(buckets), total, self._sum_ns / 1e9)


_EMPTY_HISTOGRAM = HistogramStats(tuple((bound, 0) for bound in LATENCY_BUCKETS), 0, 0.0)
