"""The result of one benchmark run, as nsq-style text lines or as JSON.

The first text line has the layout of nsq's bench tools
(``duration: ... - N mb/s - N ops/s - N us/op``, with mb = 2**20 bytes) so that
scripts parsing nsq's output (such as nsq's bench.py) read this tool's too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .latency import LatencySummary, merge, summarize
from .pool import PoolOutcome

__all__ = ["BenchResult", "build_result", "format_text", "to_json"]

_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class BenchResult:
    """Totals of one run over all worker processes."""

    tool: str  # writer | reader | channels
    config: dict
    duration_s: float
    messages: int
    body_bytes: int
    setup_s: float  # connecting and subscribing, before the timed run
    cpu_user_s: float  # the tool's processes during the timed run
    cpu_system_s: float
    latency: LatencySummary | None = None  # publish (server timestamp) to receive
    extra: dict = field(default_factory=dict)

    @property
    def msgs_per_s(self) -> float:
        """Messages per second."""
        return self.messages / self.duration_s

    @property
    def mib_per_s(self) -> float:
        """Message body MiB per second (nsq's "mb/s")."""
        return self.body_bytes / _MIB / self.duration_s

    @property
    def us_per_op(self) -> float:
        """Microseconds per message, as nsq prints it."""
        return self.duration_s * 1e6 / self.messages if self.messages else 0.0

    @property
    def cpu_percent(self) -> float:
        """The tool's CPU use over the run, in percent of one core."""
        return 100.0 * (self.cpu_user_s + self.cpu_system_s) / self.duration_s


def build_result(tool: str, config: Any, outcome: PoolOutcome) -> BenchResult:
    """Add up the workers' reports of one run."""
    reports = outcome.reports
    latencies = [r.latencies for r in reports if r.latencies is not None]
    latency = None
    if latencies:
        values, count = merge(latencies)
        latency = summarize(values, count)
    extra: dict = {}
    if any(r.extra for r in reports):
        setup = [ns for r in reports for ns in r.extra.get("setup_ns", ())]
        summary = summarize(setup)
        extra["subscribe_ms"] = dataclasses.asdict(summary) if summary else None
        extra["closed_by_server"] = sum(r.extra.get("closed_by_server", 0) for r in reports)
        extra["error_count"] = sum(r.extra.get("error_count", 0) for r in reports)
        extra["errors"] = [e for r in reports for e in r.extra.get("errors", ())][:5]
    return BenchResult(
        tool=tool,
        config=dataclasses.asdict(config),
        duration_s=outcome.duration,
        messages=sum(r.messages for r in reports),
        body_bytes=sum(r.body_bytes for r in reports),
        setup_s=outcome.setup,
        cpu_user_s=outcome.cpu_user,
        cpu_system_s=outcome.cpu_system,
        latency=latency,
        extra=extra,
    )


def format_text(result: BenchResult) -> list[str]:
    """Human-readable lines, the first in nsq's layout."""
    tag = f"[bench_{result.tool}]"
    c = result.config
    conns = c.get("connections", c.get("num"))
    lines = [
        f"{tag} duration: {result.duration_s:.6f}s - {result.mib_per_s:.3f}mb/s - "
        f"{result.msgs_per_s:.3f}ops/s - {result.us_per_op:.3f}us/op",
        f"{tag} {result.messages} msgs, {result.body_bytes} body bytes, {conns} connections in "
        f"{c['processes']} process(es), set-up {result.setup_s:.3f}s",
        f"{tag} tool cpu: {result.cpu_user_s:.2f}s user + {result.cpu_system_s:.2f}s sys "
        f"= {result.cpu_percent:.0f}% of one core",
    ]
    lat = result.latency
    if lat is not None:
        lines.append(
            f"{tag} latency (publish to receive): p50 {lat.p50_ms:.3f}ms - p99 {lat.p99_ms:.3f}ms - "
            f"p999 {lat.p999_ms:.3f}ms - max {lat.max_ms:.3f}ms ({lat.samples} samples of {lat.count})"
        )
    sub = result.extra.get("subscribe_ms")
    if sub and result.tool == "channels":
        lines.append(
            f"{tag} subscribe: {sub['count']} in {result.setup_s:.3f}s - "
            f"p50 {sub['p50_ms']:.3f}ms - p99 {sub['p99_ms']:.3f}ms - max {sub['max_ms']:.3f}ms"
        )
    if result.extra.get("closed_by_server"):
        lines.append(f"{tag} connections closed by the server: {result.extra['closed_by_server']}")
    if result.extra.get("error_count"):
        lines.append(f"{tag} error frames: {result.extra['error_count']}, e.g. {result.extra['errors']}")
    return lines


def to_json(result: BenchResult) -> dict:
    """The result as a JSON-serialisable dict (the ``--json`` output)."""
    return {
        "tool": result.tool,
        "duration_s": result.duration_s,
        "messages": result.messages,
        "body_bytes": result.body_bytes,
        "msgs_per_s": result.msgs_per_s,
        "mib_per_s": result.mib_per_s,
        "us_per_op": result.us_per_op,
        "setup_s": result.setup_s,
        "cpu": {
            "user_s": result.cpu_user_s,
            "system_s": result.cpu_system_s,
            "percent_of_core": result.cpu_percent,
        },
        "latency_ms": dataclasses.asdict(result.latency) if result.latency else None,
        "config": result.config,
        **result.extra,
    }
