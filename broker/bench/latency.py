"""Publish-to-receive latencies: a bounded sample store and its percentiles.

A reader sees hundreds of thousands of messages a second, so latencies are kept
as raw nanosecond integers in an ``array`` (8 bytes each) rather than as objects.
Past ``max_samples`` the store halves itself and from then on keeps every second
(fourth, ...) latency, so a run of any length stays bounded and its samples still
span the whole run. Percentiles use the nearest-rank method: the p-th percentile
of n sorted values is the value at rank ceil(p/100 * n).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["LatencySamples", "LatencySummary", "percentile", "summarize", "merge"]

#: 2 million samples = 16 MB per worker process.
DEFAULT_MAX_SAMPLES = 2_000_000


class LatencySamples:
    """Latencies in nanoseconds, decimated once more than ``max_samples`` are held.

    ``count`` is every latency offered; ``stride`` is how many offered latencies
    each kept sample stands for.
    """

    __slots__ = ("values", "stride", "count", "_skip", "_max")

    def __init__(self, max_samples: int = DEFAULT_MAX_SAMPLES):
        if max_samples < 2:
            raise ValueError(f"max_samples must be at least 2, not {max_samples}")
        self.values = array("q")
        self.stride = 1
        self.count = 0
        self._skip = 0
        self._max = max_samples

    def extend(self, latencies: Sequence[int]) -> None:
        """Offer a batch of latencies (one receive's worth)."""
        n = len(latencies)
        self.count += n
        if self.stride == 1:
            self.values.extend(latencies)
        else:
            self.values.extend(latencies[self._skip :: self.stride])
            self._skip = (self._skip - n) % self.stride
        while len(self.values) > self._max:
            self.values = self.values[::2]
            self.stride *= 2

    def decimated(self, stride: int) -> array:
        """The kept values thinned so that each stands for ``stride`` latencies."""
        if stride % self.stride:
            raise ValueError(f"stride {stride} is not a multiple of {self.stride}")
        return self.values[:: stride // self.stride]


def merge(parts: Iterable[LatencySamples]) -> tuple[array, int]:
    """Combine the samples of several workers at their coarsest common stride.

    Returns the values and the number of latencies offered in total.
    """
    parts = list(parts)
    if not parts:
        return array("q"), 0
    stride = max(p.stride for p in parts)
    # strides are powers of two, so the largest is a multiple of every other
    values = array("q")
    for p in parts:
        values.extend(p.decimated(stride))
    return values, sum(p.count for p in parts)


def percentile(sorted_values: Sequence[int], pct: float) -> int:
    """Nearest-rank percentile of already sorted values; raises ValueError when empty."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0 < pct <= 100:
        raise ValueError(f"percentile must be in (0, 100], not {pct}")
    # rounded first so that float noise (99.9 / 100 * 1000 = 999.0000000000001)
    # does not push the rank up by one
    rank = math.ceil(round(pct / 100 * len(sorted_values), 9))
    return sorted_values[max(rank, 1) - 1]


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """Latency percentiles of one run, in milliseconds."""

    count: int  # latencies observed
    samples: int  # latencies the percentiles were computed from
    min_ms: float
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float


def summarize(values: Iterable[int], count: int | None = None) -> LatencySummary | None:
    """Percentiles of nanosecond latencies; None when there are none."""
    ordered = sorted(values)
    if not ordered:
        return None

    def ms(ns: float) -> float:
        return ns / 1e6

    return LatencySummary(
        count=len(ordered) if count is None else count,
        samples=len(ordered),
        min_ms=ms(ordered[0]),
        mean_ms=ms(sum(ordered) / len(ordered)),
        p50_ms=ms(percentile(ordered, 50)),
        p90_ms=ms(percentile(ordered, 90)),
        p99_ms=ms(percentile(ordered, 99)),
        p999_ms=ms(percentile(ordered, 99.9)),
        max_ms=ms(ordered[-1]),
    )
