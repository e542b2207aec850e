"""One snapshot of the broker's topics, channels and clients, and its two ``/stats`` renderings.

:func:`snapshot` walks the domain once and returns frozen dataclasses; the JSON and text
renderers below (``GET /stats``) and :mod:`broker.observe.metrics` (``GET /metrics``) only read
those, so the numbers they show always agree.

The shapes are nsqd 1.3.0's (``nsqd/stats.go``, ``nsqd/http.go``), down to its quirks:

* a ``topic`` filter that matches nothing gives ``"topics": null`` and
  ``"producers": null``; a ``channel`` filter that matches nothing drops the topic;
* ``producers`` (connections that have published) is ``null`` when there are none
  or clients are excluded; a channel's ``clients`` is ``null`` when clients are excluded;
* a client's ``pub_counts`` holds at most one entry (nsqd stops after the first match);
* a topic's e2e latency is ``{"count": 0, "percentiles": null}`` when the topic has no
  channels or no percentiles are configured.

JSON is written the way Go's ``encoding/json`` writes it (:func:`go_json`): no spaces,
``<``, ``>`` and ``&`` escaped, integral floats without a fraction.

Python has no Go heap. The ``memory`` block keeps nsqd's keys and fills them from what
CPython offers (see :class:`MemoryStats`).
"""

from __future__ import annotations

import datetime
import gc
import math
import os
import platform
import re
import resource
import sys
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from broker.config.options import NSQD_COMPAT_VERSION
from broker.core.latency import HistogramStats
from broker.gocompat import SECOND, format_duration

if TYPE_CHECKING:
    from broker.core.broker import Broker
    from broker.core.channel import Channel
    from broker.core.topic import Topic
    from broker.server.connection import Client

__all__ = [
    "E2eStats",
    "HistogramStats",
    "ClientStats",
    "ChannelStats",
    "TopicStats",
    "MemoryStats",
    "Snapshot",
    "GcPauses",
    "GC_PAUSES",
    "snapshot",
    "memory_stats",
    "health_text",
    "render_json",
    "render_text",
    "go_json",
    "stats_document",
]

#: What the text format's first line says the broker was built with, in place of Go's version.
BUILT_WITH = f"{platform.python_implementation().lower()}{platform.python_version()}"

#: GC pauses remembered for the percentiles, as Go's ``MemStats.PauseNs`` ring.
GC_PAUSE_HISTORY = 256


# --------------------------------------------------------------------------- the snapshot


@dataclass(frozen=True, slots=True)
class E2eStats:
    """End-to-end (publish to FIN) latency: ``percentiles`` is ``((quantile, ns), ...)`` or None."""

    count: int
    percentiles: tuple[tuple[float, float], ...] | None


NO_E2E = E2eStats(0, None)


@dataclass(frozen=True, slots=True)
class ClientStats:
    """One V2 connection, nsqd's ``ClientV2Stats``; ``pub_counts`` is ``((topic, n), ...)``."""

    client_id: str
    hostname: str
    version: str
    remote_address: str
    state: int
    ready_count: int
    in_flight_count: int
    message_count: int
    finish_count: int
    requeue_count: int
    connect_ts: int
    sample_rate: int
    deflate: bool
    snappy: bool
    user_agent: str
    authed: bool
    auth_identity: str
    auth_identity_url: str
    pub_counts: tuple[tuple[str, int], ...]
    tls: bool
    tls_cipher_suite: str
    tls_version: str
    tls_negotiated_protocol: str
    tls_negotiated_protocol_is_mutual: bool


@dataclass(frozen=True, slots=True)
class ChannelStats:
    """One channel; ``clients`` is None when clients were not asked for.

    ``fin_latency`` is the publish-to-FIN histogram (None when the channel keeps none).
    ``buried_count`` and ``max_attempts`` (0: never bury) describe pynsqd's dead letters.
    """

    channel_name: str
    depth: int
    backend_depth: int
    in_flight_count: int
    deferred_count: int
    message_count: int
    requeue_count: int
    timeout_count: int
    client_count: int
    clients: tuple[ClientStats, ...] | None
    paused: bool
    e2e_processing_latency: E2eStats
    fin_latency: HistogramStats | None = None
    buried_count: int = 0
    max_attempts: int = 0


@dataclass(frozen=True, slots=True)
class TopicStats:
    """One topic with its (possibly filtered) channels, sorted by name."""

    topic_name: str
    channels: tuple[ChannelStats, ...]
    depth: int
    backend_depth: int
    message_count: int
    message_bytes: int
    paused: bool
    e2e_processing_latency: E2eStats


@dataclass(frozen=True, slots=True)
class MemoryStats:
    """nsqd's ``memory`` block, filled from CPython's counters.

    ==================== ==============================================================
    key                  source
    ==================== ==============================================================
    heap_objects         ``sys.getallocatedblocks()``: live blocks of the object allocator
    heap_idle_bytes      0 (CPython does not report free heap)
    heap_in_use_bytes    resident set size of the process (``/proc/self/statm``)
    heap_released_bytes  0 (CPython does not report memory returned to the OS)
    gc_pause_usec_100/99/95  percentiles of the last 256 garbage-collection pauses (µs)
    next_gc_bytes        0 (CPython's collector is triggered by allocation counts, not bytes)
    gc_total_runs        collections run so far, all generations (``gc.get_stats()``)
    ==================== ==============================================================
    """

    heap_objects: int
    heap_idle_bytes: int
    heap_in_use_bytes: int
    heap_released_bytes: int
    gc_pause_usec_100: int
    gc_pause_usec_99: int
    gc_pause_usec_95: int
    next_gc_bytes: int
    gc_total_runs: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything ``/stats`` and ``/metrics`` show, taken at one instant.

    ``topics`` is None when a topic filter matched nothing; ``producers`` is None when
    there are none, clients were excluded or the topic filter matched nothing.
    ``percentiles`` are the configured e2e quantiles (what the latency families are named by).
    """

    version: str
    health: str
    start_time: int
    uptime_ns: int
    topics: tuple[TopicStats, ...] | None
    memory: MemoryStats | None
    producers: tuple[ClientStats, ...] | None
    percentiles: tuple[float, ...] = ()


# --------------------------------------------------------------------------- GC pauses


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
        return tuple(_go_percentile(p, pauses) // 1000 for p in (100.0, 99.0, 95.0))


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


# --------------------------------------------------------------------------- walking the domain


def health_text(broker: Broker) -> str:
    """``OK``, or ``NOK - <error>`` after a failed disk write (nsqd's ``GetHealth``)."""
    error = broker.health_error
    return "OK" if error is None else f"NOK - {error}"


def _e2e_from(stream: Any) -> E2eStats:
    if stream is None or not stream.percentiles:
        # nsqd keeps no latency stream without percentiles and reports an empty result.
        return NO_E2E
    result = stream.snapshot()
    percentiles = tuple((float(p["quantile"]), p["value"]) for p in result["percentiles"] or ())
    return E2eStats(int(result["count"]), percentiles)


def _histogram_from(channel: Channel) -> HistogramStats | None:
    histogram = getattr(channel, "fin_latency", None)
    return None if histogram is None else histogram.snapshot()


def _client_stats(client: Client, topic_filter: str) -> ClientStats:
    pub_counts: tuple[tuple[str, int], ...] = ()
    for name, count in client.pub_counts.items():
        if topic_filter and name != topic_filter:
            continue
        # nsqd 1.3.0 breaks out of this loop after the first entry it keeps.
        pub_counts = ((name, count),)
        break
    return ClientStats(
        client_id=client.client_id,
        hostname=client.hostname,
        version="V2",
        remote_address=client.remote_address,
        state=int(client.state),
        ready_count=client.rdy,
        in_flight_count=client.in_flight_count,
        message_count=client.message_count,
        finish_count=client.finish_count,
        requeue_count=client.requeue_count,
        connect_ts=int(client.connect_ts),
        sample_rate=client.sample_rate,
        deflate=bool(getattr(client, "deflate", False)),
        snappy=bool(getattr(client, "snappy", False)),
        user_agent=client.user_agent,
        authed=False,
        auth_identity="",
        auth_identity_url="",
        pub_counts=pub_counts,
        tls=False,
        tls_cipher_suite="",
        tls_version="",
        tls_negotiated_protocol="",
        tls_negotiated_protocol_is_mutual=False,
    )


def _channel_stats(channel: Channel, include_clients: bool, topic_filter: str) -> ChannelStats:
    clients = None
    if include_clients:
        clients = tuple(_client_stats(client, topic_filter) for client in channel.clients)
    return ChannelStats(
        channel_name=channel.name,
        depth=channel.depth,
        backend_depth=channel.backend_depth,
        in_flight_count=len(channel.in_flight),
        deferred_count=len(channel.deferred),
        message_count=channel.message_count,
        requeue_count=channel.requeue_count,
        timeout_count=channel.timeout_count,
        client_count=len(channel.clients),
        clients=clients,
        paused=channel.paused,
        e2e_processing_latency=_e2e_from(channel.e2e),
        fin_latency=_histogram_from(channel),
        buried_count=len(channel.buried),
        max_attempts=channel.bury_after,
    )


def _topic_stats(topic: Topic, channels: tuple[ChannelStats, ...]) -> TopicStats:
    # nsqd aggregates the topic's latency from its channels' streams: none without channels.
    e2e = _e2e_from(topic.e2e) if topic.channels else NO_E2E
    return TopicStats(
        topic_name=topic.name,
        channels=channels,
        depth=topic.depth,
        backend_depth=topic.backend_depth,
        message_count=topic.message_count,
        message_bytes=topic.message_bytes,
        paused=topic.paused,
        e2e_processing_latency=e2e,
    )


def snapshot(
    broker: Broker,
    topic: str | None = None,
    channel: str | None = None,
    include_clients: bool = True,
    include_mem: bool = True,
) -> Snapshot:
    """Take one consistent snapshot of ``broker`` (no awaits: nothing changes meanwhile).

    ``topic`` and ``channel`` filter as nsqd's ``/stats`` does (empty or None: all);
    ``include_clients`` adds each channel's clients and the producers; ``include_mem``
    adds the memory block.
    """
    topic = topic or ""
    channel = channel or ""
    memory = memory_stats() if include_mem else None
    uptime_ns = max(0, time.time_ns() - broker.start_time * SECOND)
    percentiles = tuple(broker.options.e2e_processing_latency_percentiles)
    header = dict(version=NSQD_COMPAT_VERSION, health=health_text(broker), start_time=int(broker.start_time),
                  uptime_ns=uptime_ns, memory=memory, percentiles=percentiles)
    if topic:
        found = broker.topics.get(topic)
        if found is None:
            return Snapshot(topics=None, producers=None, **header)
        topics: Iterable[Topic] = (found,)
    else:
        topics = (broker.topics[name] for name in sorted(broker.topics))
    topic_stats = []
    for t in topics:
        if channel:
            found_channel = t.channels.get(channel)
            if found_channel is None:
                continue
            channels: Iterable[Channel] = (found_channel,)
        else:
            channels = (t.channels[name] for name in sorted(t.channels))
        channel_stats = tuple(_channel_stats(c, include_clients, topic) for c in channels)
        topic_stats.append(_topic_stats(t, channel_stats))
    producers = None
    if include_clients:
        # Connection order, where nsqd walks a sync.Map (no defined order).
        publishing = sorted((c for c in broker.clients if c.pub_counts), key=lambda c: c.number)
        producers = tuple(_client_stats(c, topic) for c in publishing) or None
    return Snapshot(topics=tuple(topic_stats), producers=producers, **header)


# --------------------------------------------------------------------------- Go-style JSON

_JSON_PLAIN = re.compile(r'[ !#-%\'-;=?-\[\]-~]*\Z')
_JSON_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t",
                 "<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def _json_string(text: str) -> str:
    if _JSON_PLAIN.match(text):
        return f'"{text}"'
    out = ['"']
    for ch in text:
        escaped = _JSON_ESCAPES.get(ch)
        if escaped is not None:
            out.append(escaped)
        elif ch < " ":
            out.append("\\u%04x" % ord(ch))
        elif "\ud800" <= ch <= "\udfff":
            # a lone surrogate stands for invalid UTF-8, which Go replaces
            out.append("\ufffd")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def go_float(value: float) -> str:
    """A float64 as Go's ``encoding/json`` writes it (``1``, ``0.99``, ``1e-7``, ``1e+21``)."""
    if not math.isfinite(value):
        raise ValueError(f"json: unsupported value: {value!r}")
    if value == 0:
        return "0"
    text = repr(float(value))
    if 1e-6 <= abs(value) < 1e21:
        # Go: the shortest digits in fixed notation
        if "e" in text:
            text = format(Decimal(text), "f")
        return text[:-2] if text.endswith(".0") else text
    # Go: exponent notation with at least two exponent digits, "e-07" shortened to "e-7"
    if len(text) >= 4 and text[-4] == "e" and text[-3] == "-" and text[-2] == "0":
        text = text[:-2] + text[-1]
    return text


def _encode(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(str(int(value)))
    elif isinstance(value, float):
        out.append(go_float(value))
    elif isinstance(value, str):
        out.append(_json_string(value))
    elif isinstance(value, dict):
        out.append("{")
        first = True
        for key, item in value.items():
            if not first:
                out.append(",")
            first = False
            out.append(_json_string(key))
            out.append(":")
            _encode(item, out)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _encode(item, out)
        out.append("]")
    else:
        raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def go_json(value: Any) -> bytes:
    """``value`` as Go's ``json.Marshal`` would write it; dicts keep their key order."""
    out: list[str] = []
    _encode(value, out)
    return "".join(out).encode("utf-8")


# --------------------------------------------------------------------------- JSON rendering


def _e2e_document(e2e: E2eStats) -> dict:
    percentiles = None
    if e2e.percentiles is not None:
        # nsqd stores each percentile as a map[string]float64: keys sorted, values float64.
        percentiles = [{"quantile": float(q), "value": float(v)} for q, v in e2e.percentiles]
    return {"count": e2e.count, "percentiles": percentiles}


def _client_document(client: ClientStats) -> dict:
    doc = {
        "client_id": client.client_id,
        "hostname": client.hostname,
        "version": client.version,
        "remote_address": client.remote_address,
        "state": client.state,
        "ready_count": client.ready_count,
        "in_flight_count": client.in_flight_count,
        "message_count": client.message_count,
        "finish_count": client.finish_count,
        "requeue_count": client.requeue_count,
        "connect_ts": client.connect_ts,
        "sample_rate": client.sample_rate,
        "deflate": client.deflate,
        "snappy": client.snappy,
        "user_agent": client.user_agent,
    }
    # omitempty fields, in struct order
    if client.authed:
        doc["authed"] = True
    if client.auth_identity:
        doc["auth_identity"] = client.auth_identity
    if client.auth_identity_url:
        doc["auth_identity_url"] = client.auth_identity_url
    if client.pub_counts:
        doc["pub_counts"] = [{"topic": name, "count": count} for name, count in client.pub_counts]
    doc["tls"] = client.tls
    doc["tls_cipher_suite"] = client.tls_cipher_suite
    doc["tls_version"] = client.tls_version
    doc["tls_negotiated_protocol"] = client.tls_negotiated_protocol
    doc["tls_negotiated_protocol_is_mutual"] = client.tls_negotiated_protocol_is_mutual
    return doc


def _channel_document(channel: ChannelStats) -> dict:
    doc = {
        "channel_name": channel.channel_name,
        "depth": channel.depth,
        "backend_depth": channel.backend_depth,
        "in_flight_count": channel.in_flight_count,
        "deferred_count": channel.deferred_count,
        "message_count": channel.message_count,
        "requeue_count": channel.requeue_count,
        "timeout_count": channel.timeout_count,
        "client_count": channel.client_count,
        "clients": None if channel.clients is None else [_client_document(c) for c in channel.clients],
        "paused": channel.paused,
        "e2e_processing_latency": _e2e_document(channel.e2e_processing_latency),
    }
    if channel.max_attempts or channel.buried_count:
        # pynsqd's dead letters, after nsqd's keys (clients of nsqd's shape ignore them)
        doc["max_attempts"] = channel.max_attempts
        doc["buried_count"] = channel.buried_count
    return doc


def _topic_document(topic: TopicStats) -> dict:
    return {
        "topic_name": topic.topic_name,
        "channels": [_channel_document(c) for c in topic.channels],
        "depth": topic.depth,
        "backend_depth": topic.backend_depth,
        "message_count": topic.message_count,
        "message_bytes": topic.message_bytes,
        "paused": topic.paused,
        "e2e_processing_latency": _e2e_document(topic.e2e_processing_latency),
    }


def _memory_document(memory: MemoryStats) -> dict:
    return {
        "heap_objects": memory.heap_objects,
        "heap_idle_bytes": memory.heap_idle_bytes,
        "heap_in_use_bytes": memory.heap_in_use_bytes,
        "heap_released_bytes": memory.heap_released_bytes,
        "gc_pause_usec_100": memory.gc_pause_usec_100,
        "gc_pause_usec_99": memory.gc_pause_usec_99,
        "gc_pause_usec_95": memory.gc_pause_usec_95,
        "next_gc_bytes": memory.next_gc_bytes,
        "gc_total_runs": memory.gc_total_runs,
    }


def stats_document(snap: Snapshot) -> dict:
    """The ``/stats?format=json`` document as plain dicts and lists, in nsqd's key order."""
    doc: dict[str, Any] = {
        "version": snap.version,
        "health": snap.health,
        "start_time": snap.start_time,
        "topics": None if snap.topics is None else [_topic_document(t) for t in snap.topics],
    }
    if snap.memory is not None:
        doc["memory"] = _memory_document(snap.memory)
    doc["producers"] = None if snap.producers is None else [_client_document(c) for c in snap.producers]
    return doc


def render_json(snap: Snapshot) -> bytes:
    """``/stats?format=json``: the body nsqd writes, byte for byte in layout."""
    return go_json(stats_document(snap))


# --------------------------------------------------------------------------- text rendering


def _human_ns(value: float) -> str:
    # nsqd's stringy.NanoSecondToHuman
    if value > 1_000_000_000:
        return "%0.1fs" % (value / 1_000_000_000)
    if value > 1_000_000:
        return "%0.1fms" % (value / 1_000_000)
    if value > 1000:
        return "%0.1fus" % (value / 1000)
    return "%0.1fns" % value


def _e2e_text(e2e: E2eStats) -> str:
    return ", ".join(_human_ns(value) for _, value in e2e.percentiles or ())


def _rfc3339(seconds: int) -> str:
    stamp = datetime.datetime.fromtimestamp(seconds).astimezone()
    text = stamp.isoformat(timespec="seconds")
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _split_port(address: str) -> str:
    host, sep, port = address.rpartition(":")
    return port if sep else ""


def _client_text(client: ClientStats, now: float) -> str:
    connected = format_duration(max(0, int(now) - client.connect_ts) * SECOND)
    ident = f"{client.hostname}:{_split_port(client.remote_address)} {client.user_agent}"
    if client.pub_counts:
        total = sum(count for _, count in client.pub_counts)
        topics = ",".join(f"{name}={count}" for name, count in client.pub_counts)
        return f"[{client.version} {ident:<21}] msgs: {total:<8d} topics: {topics} connected: {connected}"
    return (f"[{client.version} {ident:<21}] state: {client.state} inflt: {client.in_flight_count:<4d} "
            f"rdy: {client.ready_count:<4d} fin: {client.finish_count:<8d} re-q: {client.requeue_count:<8d} "
            f"msgs: {client.message_count:<8d} connected: {connected}")


def render_text(snap: Snapshot, now: float | None = None) -> bytes:
    """``/stats`` in nsqd's text format (``now`` in unix seconds, for the connected times)."""
    now = time.time() if now is None else now
    lines = [
        f"nsqd v{snap.version} (built w/{BUILT_WITH})\n",
        f"start_time {_rfc3339(snap.start_time)}\n",
        f"uptime {format_duration(snap.uptime_ns)}\n",
        f"\nHealth: {snap.health}\n",
    ]
    memory = snap.memory
    if memory is not None:
        lines.append("\nMemory:\n")
        for key, value in _memory_document(memory).items():
            lines.append(f"   {key:<25}\t{value}\n")
    topics = snap.topics or ()
    lines.append("\nTopics:" if topics else "\nTopics: None\n")
    for topic in topics:
        prefix = "*P " if topic.paused else "   "
        lines.append(f"\n{prefix}[{topic.topic_name:<15}] depth: {topic.depth:<5d} be-depth: {topic.backend_depth:<5d} "
                     f"msgs: {topic.message_count:<8d} e2e%: {_e2e_text(topic.e2e_processing_latency)}\n")
        for channel in topic.channels:
            prefix = "   *P " if channel.paused else "      "
            lines.append(
                f"{prefix}[{channel.channel_name:<25}] depth: {channel.depth:<5d} be-depth: {channel.backend_depth:<5d} "
                f"inflt: {channel.in_flight_count:<4d} def: {channel.deferred_count:<4d} "
                f"re-q: {channel.requeue_count:<5d} timeout: {channel.timeout_count:<5d} "
                f"msgs: {channel.message_count:<8d} e2e%: {_e2e_text(channel.e2e_processing_latency)}\n")
            for client in channel.clients or ():
                lines.append(f"        {_client_text(client, now)}\n")
    producers = snap.producers or ()
    if producers:
        lines.append("\nProducers:\n")
        for client in producers:
            lines.append(f"   {_client_text(client, now)}\n")
    else:
        lines.append("\nProducers: None\n")
    return "".join(lines).encode("utf-8")
