"""``pynsqd bench writer|reader|channels``: measure any nsqd-compatible server.

Modelled on nsq's ``bench_writer``, ``bench_reader`` and ``bench_channels``
(same flags and result line), with several processes, a message count instead
of a duration, publish-to-receive latency percentiles, the tool's own CPU use
and ``--json`` output. The load generator works on raw blocking sockets with
pre-encoded commands so that it is not what limits the numbers.
"""

from __future__ import annotations

import json
import resource
import sys
from collections.abc import Callable

from .arguments import ChannelsConfig, ReaderConfig, WriterConfig, parse_args
from .channels import run_channels
from .latency import LatencySummary, percentile, summarize
from .opening import ServerError
from .pool import BenchFailed
from .reader import run_reader
from .report import BenchResult, format_text, to_json
from .writer import run_writer

__all__ = [
    "main",
    "run_writer",
    "run_reader",
    "run_channels",
    "parse_args",
    "WriterConfig",
    "ReaderConfig",
    "ChannelsConfig",
    "BenchResult",
    "BenchFailed",
    "ServerError",
    "LatencySummary",
    "percentile",
    "summarize",
    "format_text",
    "to_json",
]

_RUNNERS: dict[type, Callable[..., BenchResult]] = {
    WriterConfig: run_writer,
    ReaderConfig: run_reader,
    ChannelsConfig: run_channels,
}


def _raise_fd_limit(wanted: int) -> None:
    # bench channels opens thousands of sockets; the soft limit is often 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def main(argv: list[str] | None = None) -> int:
    """Run one benchmark from command-line arguments; returns the exit status.

    Results go to stdout (text, or one JSON object with ``--json``); progress and
    errors go to stderr. Returns 2 for bad arguments, 1 when the run failed.
    """
    try:
        config = parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    tool = type(config).__name__.removesuffix("Config").lower()
    _raise_fd_limit(getattr(config, "num", getattr(config, "connections", 0)) + 256)
    try:
        result = _RUNNERS[type(config)](config)
    except (BenchFailed, ServerError, OSError, ValueError) as exc:
        print(f"[bench_{tool}] error: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        # before the start signal; once running, an interrupt ends the run with a report
        print(f"[bench_{tool}] interrupted", file=sys.stderr, flush=True)
        return 130
    if config.json:
        print(json.dumps(to_json(result)), flush=True)
    else:
        print("\n".join(format_text(result)), flush=True)
    return 0
