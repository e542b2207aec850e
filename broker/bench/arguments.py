"""Command-line flags of ``pynsqd bench writer|reader|channels``.

The flag names, defaults and value syntax follow nsq's ``bench_writer``,
``bench_reader`` and ``bench_channels`` (``--runfor=10s``, ``--size``,
``--batch-size``, ``--deadline``, ``--nsqd-tcp-address`` ...), and Go's
single-dash spelling (``-runfor 10s``) is accepted too, so scripts written for
nsq's tools work unchanged. Flags nsq's tools do not have (``--count``,
``--connections``, ``--processes``, ``--pipeline``, ``--json`` ...) are pynsqd's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

__all__ = [
    "WriterConfig",
    "ReaderConfig",
    "ChannelsConfig",
    "build_parser",
    "parse_args",
    "parse_duration",
    "parse_deadline",
    "parse_address",
]

DEFAULT_ADDRESS = "127.0.0.1:4150"
DEFAULT_RUNFOR = 10.0
#: nsq's tools open one connection per core (GOMAXPROCS).
DEFAULT_CONNECTIONS = os.cpu_count() or 1
DEFAULT_PROGRESS = 5.0

_T = TypeVar("_T")

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True, slots=True)
class WriterConfig:
    """What ``bench writer`` publishes, where, and for how long."""

    host: str
    port: int
    topic: str = "sub_bench"
    size: int = 200
    batch_size: int = 200
    mpub: bool = True  # False: single-message PUB (batch size 1 without --mpub)
    runfor: float | None = DEFAULT_RUNFOR
    count: int | None = None
    deadline: float | None = None  # unix time
    connections: int = DEFAULT_CONNECTIONS
    processes: int = 1
    pipeline: int = 1  # commands in flight per connection
    identify: dict = field(default_factory=dict)
    json: bool = False
    progress: float = DEFAULT_PROGRESS


@dataclass(frozen=True, slots=True)
class ReaderConfig:
    """What ``bench reader`` subscribes to and how it consumes."""

    host: str
    port: int
    topic: str = "sub_bench"
    channel: str = "ch"
    rdy: int = 2500  # per connection
    runfor: float | None = DEFAULT_RUNFOR
    count: int | None = None
    deadline: float | None = None
    connections: int = DEFAULT_CONNECTIONS
    processes: int = 1
    identify: dict = field(default_factory=dict)
    json: bool = False
    progress: float = DEFAULT_PROGRESS
    max_latency_samples: int = 2_000_000


@dataclass(frozen=True, slots=True)
class ChannelsConfig:
    """How many subscriptions ``bench channels`` opens and how long it holds them."""

    host: str
    port: int
    num: int = 1000
    topic: str = "t"  # prefix of the topic names in "topics" mode, the topic in "channels" mode
    channel: str = "ch"
    mode: str = "topics"  # topics: t0/ch .. tN/ch (nsq's); channels: t/ch0 .. t/chN (fan-out)
    rdy: int = 1
    runfor: float | None = DEFAULT_RUNFOR
    deadline: float | None = None
    processes: int = 1
    identify: dict = field(default_factory=dict)
    json: bool = False
    progress: float = DEFAULT_PROGRESS
    max_latency_samples: int = 2_000_000


def parse_duration(text: str) -> float:
    """Seconds in a Go duration (``250ms``, ``10s``, ``1m30s``) or a plain number of seconds.

    Raises ValueError for anything else, including negative durations.
    """
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        pos, seconds = 0, 0.0
        for m in _DURATION_PART.finditer(text):
            if m.start() != pos:
                break
            seconds += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
            pos = m.end()
        if pos != len(text) or not text:
            raise ValueError(f"invalid duration {text!r}") from None
    if seconds < 0 or seconds != seconds:
        raise ValueError(f"invalid duration {text!r}")
    return seconds


def parse_deadline(text: str) -> float:
    """Unix time of a start deadline.

    Accepts nsq's ``2006-01-02 15:04:05`` layout, read as UTC as Go's ``time.Parse``
    does (nsq's bench.py builds it from ``utcnow()``), an ISO 8601 time with an
    offset, or a number of seconds since the epoch. Raises ValueError otherwise.
    """
    text = text.strip()
    try:
        return float(text.removeprefix("@"))
    except ValueError:
        pass
    when = datetime.datetime.fromisoformat(text)
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp()


def parse_address(text: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6) as a pair; raises ValueError."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"invalid address {text!r}, want host:port")
    return host.strip("[]"), int(port)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _flag_type(parse: Callable[[str], _T], what: str | None = None) -> Callable[[str], _T]:
    """``parse`` as an argparse ``type``: its ValueError becomes argparse's usage error, whose
    message is the ValueError's, or ``invalid <what> '<text>': <its message>`` given ``what``."""
    def convert(text: str) -> _T:
        try:
            return parse(text)
        except ValueError as exc:
            message = str(exc) if what is None else f"invalid {what} {text!r}: {exc}"
            raise argparse.ArgumentTypeError(message) from None
    return convert


_duration = _flag_type(parse_duration)
_deadline = _flag_type(parse_deadline, "deadline")
_address = _flag_type(parse_address)


def _identify(text: str) -> dict:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise argparse.ArgumentTypeError(f"invalid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("IDENTIFY parameters must be a JSON object")
    return value


def _flag(parser: argparse.ArgumentParser, name: str, **kwargs) -> None:
    """Add ``--name`` and Go's ``-name`` spelling of one flag."""
    parser.add_argument(f"--{name}", f"-{name}", **kwargs)


def _add_common(p: argparse.ArgumentParser, *, runfor_help: str) -> None:
    _flag(p, "nsqd-tcp-address", dest="address", type=_address, default=DEFAULT_ADDRESS,
          metavar="HOST:PORT", help=f"<addr>:<port> to connect to nsqd (default {DEFAULT_ADDRESS})")
    _flag(p, "runfor", type=_duration, default=None, metavar="DURATION", help=runfor_help)
    _flag(p, "deadline", type=_deadline, default=None, metavar="TIME",
          help="start the measured run at this time: '2006-01-02 15:04:05' (UTC, as nsq), "
               "ISO 8601 with offset, or unix seconds; connections are set up before it")
    _flag(p, "processes", type=_positive_int, default=1,
          help="worker processes the connections are spread over (default 1)")
    _flag(p, "identify", type=_identify, default={}, metavar="JSON",
          help="extra IDENTIFY parameters, e.g. '{\"output_buffer_timeout\": 25}'")
    _flag(p, "json", action="store_true", help="print one JSON object with the results on stdout")
    _flag(p, "progress", type=_duration, default=DEFAULT_PROGRESS, metavar="DURATION",
          help=f"print progress to stderr this often, 0 to disable (default {DEFAULT_PROGRESS:g}s)")


def build_parser() -> argparse.ArgumentParser:
    """The ``bench`` argument parser with its writer, reader and channels subcommands."""
    parser = argparse.ArgumentParser(
        prog="pynsqd bench",
        description="Measure the throughput and latency of any nsqd-compatible (V2 protocol) server.",
    )
    sub = parser.add_subparsers(dest="tool", required=True, metavar="{writer,reader,channels}")

    w = sub.add_parser("writer", help="publish as fast as possible (nsq's bench_writer)")
    _add_common(w, runfor_help="duration of time to run (default 10s, or until --count)")
    _flag(w, "topic", default="sub_bench", help="topic to publish to (default sub_bench)")
    _flag(w, "size", type=_positive_int, default=200, help="size of messages in bytes (default 200)")
    _flag(w, "batch-size", type=_positive_int, default=200,
          help="messages per MPUB; 1 publishes with PUB unless --mpub (default 200)")
    _flag(w, "mpub", action="store_true", help="use MPUB even for a batch size of 1")
    _flag(w, "count", type=_positive_int, default=None, help="stop after publishing this many messages")
    _flag(w, "connections", type=_positive_int, default=DEFAULT_CONNECTIONS,
          help=f"TCP connections in total (default: one per core, {DEFAULT_CONNECTIONS})")
    _flag(w, "pipeline", type=_positive_int, default=1,
          help="commands in flight per connection before waiting for OK (default 1, as nsq)")

    r = sub.add_parser("reader", help="subscribe and FIN as fast as possible (nsq's bench_reader)")
    _add_common(r, runfor_help="duration of time to run (default 10s, or until --count)")
    _flag(r, "topic", default="sub_bench", help="topic to receive messages on (default sub_bench)")
    _flag(r, "channel", default="ch", help="channel to receive messages on (default ch)")
    _flag(r, "size", type=_positive_int, default=None,
          help="accepted for nsq compatibility; MB/s is computed from the bodies received")
    _flag(r, "rdy", type=_positive_int, default=None, help="RDY count per connection (default 2500)")
    _flag(r, "max-in-flight", type=_positive_int, default=None,
          help="total RDY, divided between the connections (instead of --rdy)")
    _flag(r, "count", type=_positive_int, default=None, help="stop after receiving this many messages")
    _flag(r, "connections", type=_positive_int, default=DEFAULT_CONNECTIONS,
          help=f"TCP connections in total (default: one per core, {DEFAULT_CONNECTIONS})")
    _flag(r, "max-latency-samples", type=_positive_int, default=2_000_000,
          help="latencies kept per process before sampling (default 2000000)")

    c = sub.add_parser("channels", help="hold many subscriptions at once (nsq's bench_channels)")
    _add_common(c, runfor_help="how long to hold the subscriptions once made (default 10s)")
    _flag(c, "num", type=_positive_int, default=1000, help="number of subscriptions (default 1000)")
    _flag(c, "mode", choices=("topics", "channels"), default="topics",
          help="topics: one channel on each of NUM topics, as nsq (default); "
               "channels: NUM channels on one topic, every message fanned out NUM times")
    _flag(c, "topic", default="t", help="topic name prefix in topics mode, the topic in channels mode")
    _flag(c, "channel", default="ch", help="the channel in topics mode, channel name prefix in channels mode")
    _flag(c, "rdy", type=_positive_int, default=1, help="RDY count per connection (default 1)")
    return parser


def parse_args(argv: list[str]) -> WriterConfig | ReaderConfig | ChannelsConfig:
    """Parse ``bench`` arguments into a config; exits with status 2 on bad flags (argparse)."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    host, port = ns.address
    count = getattr(ns, "count", None)
    runfor = ns.runfor if ns.runfor is not None else (None if count else DEFAULT_RUNFOR)
    if runfor == 0 and not count:
        parser.error("--runfor must be positive unless --count is given")
    common = dict(host=host, port=port, runfor=runfor or None, deadline=ns.deadline,
                  processes=ns.processes, identify=ns.identify, json=ns.json, progress=ns.progress)
    if ns.tool == "writer":
        if ns.processes > ns.connections:
            parser.error("--processes cannot exceed --connections")
        return WriterConfig(topic=ns.topic, size=ns.size, batch_size=ns.batch_size,
                            mpub=ns.batch_size > 1 or ns.mpub, count=count,
                            connections=ns.connections, pipeline=ns.pipeline, **common)
    if ns.tool == "reader":
        if ns.processes > ns.connections:
            parser.error("--processes cannot exceed --connections")
        if ns.rdy is not None and ns.max_in_flight is not None:
            parser.error("give --rdy or --max-in-flight, not both")
        rdy = ns.rdy or 2500
        if ns.max_in_flight is not None:
            rdy = max(1, ns.max_in_flight // ns.connections)
        return ReaderConfig(topic=ns.topic, channel=ns.channel, rdy=rdy, count=count,
                            connections=ns.connections,
                            max_latency_samples=max(2, ns.max_latency_samples), **common)
    if ns.processes > ns.num:
        parser.error("--processes cannot exceed --num")
    return ChannelsConfig(num=ns.num, mode=ns.mode, topic=ns.topic, channel=ns.channel,
                          rdy=ns.rdy, **common)
