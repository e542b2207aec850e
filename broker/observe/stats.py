"""The frozen stats of one snapshot: the broker, its topics, channels, clients and memory.

:func:`broker.observe.snapshot` fills them; the ``/stats`` renderers and the Prometheus
exporter only read them, so every report of one snapshot shows the same numbers. The
fields are nsqd 1.3.0's (``nsqd/stats.go``) plus pynsqd's dead-letter and FIN-latency ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from broker.core.latency import HistogramStats

__all__ = [
    "E2eStats",
    "KeyStats",
    "percentile_suffix",
    "NO_E2E",
    "HistogramStats",
    "ClientStats",
    "ChannelStats",
    "TopicStats",
    "MemoryStats",
    "Snapshot",
]


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


#: Priorities ``/stats`` and ``/metrics`` show per channel at most: the most urgent ones.
PRIORITY_LEVELS = 10


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
    #: pynsqd's priorities (None: the channel's topic has none): ready messages at each of the
    #: :data:`PRIORITY_LEVELS` most urgent priorities, ``(priority, count)``, most urgent first
    priorities: tuple[tuple[int, int], ...] | None = None


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
    #: pynsqd's keyed publishes (None: the topic never had one): keyed messages published,
    #: how many of them were duplicates (not stored), keys remembered now
    keys: KeyStats | None = None
    #: pynsqd's replication (None: the node keeps no copies, ``--replicas`` 1)
    replication: ReplicaStats | None = None


class ReplicaStats(NamedTuple):
    """A topic's replication (see :mod:`broker.replication`)."""

    replicas: int
    copies_held: int
    copies_waiting: int
    takeovers: int
    publishes_refused: int
    #: copies a gone peer held that are not made again elsewhere yet
    copies_missing: int = 0


class KeyStats(NamedTuple):
    """A topic's keyed publishes (see :mod:`broker.core.keys`)."""

    keyed_count: int
    duplicate_count: int
    keys_held: int


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
    #: ``(address, connected)`` for each ``--lookupd-tcp-address``, in the order given
    lookupd_peers: tuple[tuple[str, bool], ...] = ()
    #: Connected TCP clients by transport: ``((tls, compression), count)`` with compression
    #: ``"none"``, ``"snappy"`` or ``"deflate"``, sorted.
    transports: tuple[tuple[tuple[bool, str], int], ...] = ()
    #: publish keys remembered over all topics, and those forgotten early (--dedup-max-keys)
    keys_held: int = 0
    keys_evicted: int = 0
    #: the node's replication (None: ``--replicas`` 1): its id, its peers, the copies it holds
    replication: dict | None = None


def percentile_suffix(quantile: float) -> str:
    """How nsqd's statsd names a percentile: ``0.99`` -> ``"99"`` (``%.0f`` of q*100)."""
    return "%.0f" % (quantile * 100.0)
