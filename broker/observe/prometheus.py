"""Prometheus exposition (``GET /metrics``), built from the same snapshot as ``/stats``.

Series are named the way existing NSQ dashboards and alerts query them:

* the Grafana NSQ mixin's names (nsqd's statsd paths through ``statsd_exporter``):
  ``nsq_topic_*`` with a ``topic`` label, ``nsq_topic_channel_*`` with ``topic`` and
  ``channel``, ``nsq_mem_*``. Counters keep their statsd names, without a ``_total``
  suffix, so they are exposed untyped (``rate()`` works on them as on any counter);
* ``lovoo/nsq_exporter``'s and Telegraf's channel and client names (``nsq_channel_*``,
  ``nsq_client_*``, ``nsq_topic_channel_count``) where they do not collide;
* a histogram of publish-to-FIN time per channel,
  ``nsq_topic_channel_e2e_processing_latency_seconds``, fed by each channel's :class:`~broker.core.latency.LatencyHistogram`;
* prometheus-client's process, platform and Python GC collectors.

Every family is documented in deploy/README.md's "Metrics" section.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric, UnknownMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.utils import floatToGoString

from broker.observe.stats import ChannelStats, ClientStats, Snapshot, TopicStats, percentile_suffix

__all__ = [
    "CONTENT_TYPE",
    "MetricsExporter",
    "families",
    "percentile_suffix",
]

#: The text exposition format every Prometheus version parses.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _flag(value: bool) -> str:
    return "true" if value else "false"


# (name, documentation, value) per topic; the mixin's names first, then lovoo's/Telegraf's.
_TopicGetter = Callable[[TopicStats], float]
_TOPIC_GAUGES: tuple[tuple[str, str, _TopicGetter], ...] = (
    ("nsq_topic_depth", "Messages queued at the topic (memory + disk).", lambda t: t.depth),
    ("nsq_topic_backend_depth", "Messages queued in the topic's disk queue.", lambda t: t.backend_depth),
    ("nsq_topic_channel_count", "Channels of the topic.", lambda t: len(t.channels)),
    ("nsq_topic_paused", "1 if the topic is paused.", lambda t: int(t.paused)),
)
_TOPIC_COUNTERS: tuple[tuple[str, str, _TopicGetter], ...] = (
    ("nsq_topic_message_count", "Messages published to the topic since start (counter).", lambda t: t.message_count),
    ("nsq_topic_message_bytes", "Bytes of message bodies published to the topic since start (counter).",
     lambda t: t.message_bytes),
)

_ChannelGetter = Callable[[ChannelStats], float]
_CHANNEL_GAUGES: tuple[tuple[str, str, _ChannelGetter], ...] = (
    ("nsq_topic_channel_depth", "Ready messages of the channel (memory + disk).", lambda c: c.depth),
    ("nsq_topic_channel_backend_depth", "Ready messages in the channel's disk queue.", lambda c: c.backend_depth),
    ("nsq_topic_channel_in_flight_count", "Messages delivered and not yet finished.", lambda c: c.in_flight_count),
    ("nsq_topic_channel_deferred_count", "Deferred messages waiting for their time.", lambda c: c.deferred_count),
    ("nsq_topic_channel_clients", "Connected consumers of the channel.", lambda c: c.client_count),
    ("nsq_topic_channel_paused", "1 if the channel is paused.", lambda c: int(c.paused)),
    ("nsq_topic_channel_buried_count", "Dead letters: messages buried after --max-attempts (pynsqd).",
     lambda c: c.buried_count),
    ("nsq_channel_depth", "Same as nsq_topic_channel_depth (lovoo/Telegraf name).", lambda c: c.depth),
    ("nsq_channel_backend_depth", "Same as nsq_topic_channel_backend_depth (lovoo/Telegraf name).",
     lambda c: c.backend_depth),
    ("nsq_channel_in_flight_count", "Same as nsq_topic_channel_in_flight_count (lovoo name).",
     lambda c: c.in_flight_count),
    ("nsq_channel_inflight_count", "Same as nsq_topic_channel_in_flight_count (Telegraf name).",
     lambda c: c.in_flight_count),
    ("nsq_channel_deferred_count", "Same as nsq_topic_channel_deferred_count (lovoo/Telegraf name).",
     lambda c: c.deferred_count),
    ("nsq_channel_message_count", "Same as nsq_topic_channel_message_count (lovoo/Telegraf name).",
     lambda c: c.message_count),
    ("nsq_channel_requeue_count", "Same as nsq_topic_channel_requeue_count (lovoo/Telegraf name).",
     lambda c: c.requeue_count),
    ("nsq_channel_timeout_count", "Same as nsq_topic_channel_timeout_count (lovoo/Telegraf name).",
     lambda c: c.timeout_count),
    ("nsq_channel_client_count", "Same as nsq_topic_channel_clients (lovoo/Telegraf name).",
     lambda c: c.client_count),
)
_CHANNEL_COUNTERS: tuple[tuple[str, str, _ChannelGetter], ...] = (
    ("nsq_topic_channel_message_count", "Messages put into the channel since start (counter).",
     lambda c: c.message_count),
    ("nsq_topic_channel_requeue_count", "Messages requeued by consumers (REQ) since start (counter).",
     lambda c: c.requeue_count),
    ("nsq_topic_channel_timeout_count", "In-flight messages that timed out since start (counter).",
     lambda c: c.timeout_count),
)

_ClientGetter = Callable[[ClientStats], float]
_CLIENT_GAUGES: tuple[tuple[str, str, _ClientGetter], ...] = (
    ("nsq_client_state", "Connection state (0 init, 3 subscribed, 4 closing).", lambda c: c.state),
    ("nsq_client_ready_count", "The consumer's RDY count.", lambda c: c.ready_count),
    ("nsq_client_in_flight_count", "Messages in flight to the consumer.", lambda c: c.in_flight_count),
    ("nsq_client_message_count", "Messages sent to the consumer since it connected.", lambda c: c.message_count),
    ("nsq_client_finish_count", "Messages the consumer finished.", lambda c: c.finish_count),
    ("nsq_client_requeue_count", "Messages the consumer requeued.", lambda c: c.requeue_count),
    ("nsq_client_connect_ts", "When the consumer connected (unix seconds).", lambda c: c.connect_ts),
    ("nsq_client_sample_rate", "The consumer's sample rate (percent).", lambda c: c.sample_rate),
)
_CLIENT_LABELS = ("topic", "channel", "deflate", "snappy", "tls", "client_id", "hostname", "version",
                  "remote_address")

_MEMORY_GAUGES = (
    ("heap_objects", "Live blocks of CPython's object allocator (nsqd: Go heap objects)."),
    ("heap_idle_bytes", "Always 0: CPython does not report idle heap."),
    ("heap_in_use_bytes", "Resident set size of the process in bytes (nsqd: Go heap in use)."),
    ("heap_released_bytes", "Always 0: CPython does not report memory returned to the OS."),
    ("gc_pause_usec_100", "Longest of the last 256 garbage-collection pauses, in microseconds."),
    ("gc_pause_usec_99", "99th percentile of the last 256 garbage-collection pauses, in microseconds."),
    ("gc_pause_usec_95", "95th percentile of the last 256 garbage-collection pauses, in microseconds."),
    ("next_gc_bytes", "Always 0: CPython's collector is triggered by allocation counts, not bytes."),
)


def _gauge(name: str, doc: str, labels: Iterable[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def _untyped(name: str, doc: str, labels: Iterable[str]) -> UnknownMetricFamily:
    return UnknownMetricFamily(name, doc, labels=list(labels))


def families(snap: Snapshot) -> list[Metric]:
    """The ``nsq_*`` metric families for one snapshot (taken with clients and memory)."""
    topics = snap.topics or ()
    out: list[Metric] = []

    healthy = _gauge("nsq_server_healthy", "1 while /ping answers OK, 0 after a failed disk write.", ())
    healthy.add_metric([], 1 if snap.health == "OK" else 0)
    topic_count = _gauge("nsq_server_topic_count", "Topics on this broker (Telegraf name).", ())
    topic_count.add_metric([], len(topics))
    clients = _gauge("nsq_server_clients",
                     "Connected TCP clients by transport: TLS or not, and compression (none, snappy, deflate).",
                     ("tls", "compression"))
    for (tls, compression), count in snap.transports:
        clients.add_metric([_flag(tls), compression], count)
    out += [healthy, topic_count, clients]
    lookupd = _gauge("nsq_lookupd_connected",
                     "1 while the connection to this --lookupd-tcp-address is up and identified, else 0.",
                     ("lookupd",))
    for address, connected in snap.lookupd_peers:
        lookupd.add_metric([address], 1 if connected else 0)
    out.append(lookupd)

    out += _topic_families(topics)
    out += _key_families(snap, topics)
    out += _replica_families(topics)
    out += _node_replica_families(snap.replication)
    channels = [(t, c) for t in topics for c in t.channels]
    out += _channel_families(channels)
    out += _latency_families(snap.percentiles, topics, channels)

    histogram = HistogramMetricFamily(
        "nsq_topic_channel_e2e_processing_latency_seconds",
        "Time from publish to FIN of the channel's messages, in seconds.",
        labels=["topic", "channel"],
    )
    for t, c in channels:
        h = c.fin_latency
        if h is None:
            continue
        buckets = [(floatToGoString(bound), count) for bound, count in h.buckets]
        buckets.append(("+Inf", h.count))
        histogram.add_metric([t.topic_name, c.channel_name], buckets, h.sum_seconds)
    out.append(histogram)

    client_families = [_gauge(name, doc, _CLIENT_LABELS) for name, doc, _ in _CLIENT_GAUGES]
    for t, c in channels:
        for client in c.clients or ():
            labels = [t.topic_name, c.channel_name, _flag(client.deflate), _flag(client.snappy), _flag(client.tls),
                      client.client_id, client.hostname, client.version, client.remote_address]
            for client_family, (_, _, get_client) in zip(client_families, _CLIENT_GAUGES):
                client_family.add_metric(labels, get_client(client))
    out += client_families

    memory = snap.memory
    if memory is not None:
        for key, doc in _MEMORY_GAUGES:
            memory_family = _gauge(f"nsq_mem_{key}", doc, ())
            memory_family.add_metric([], getattr(memory, key))
            out.append(memory_family)
        runs = _untyped("nsq_mem_gc_runs", "Garbage collections run since start, all generations (counter).", ())
        runs.add_metric([], memory.gc_total_runs)
        out.append(runs)
    return out


def _topic_families(topics: Sequence[TopicStats]) -> list[Metric]:
    out: list[Metric] = []
    for name, doc, get in _TOPIC_GAUGES:
        gauge = _gauge(name, doc, ("topic",))
        for t in topics:
            gauge.add_metric([t.topic_name], get(t))
        out.append(gauge)
    for name, doc, get in _TOPIC_COUNTERS:
        counter = _untyped(name, doc, ("topic",))
        for t in topics:
            counter.add_metric([t.topic_name], get(t))
        out.append(counter)
    return out


def _key_families(snap: Snapshot, topics: Sequence[TopicStats]) -> list[Metric]:
    """pynsqd's keyed publishes: per topic that had one, and over all topics."""
    keyed = _untyped("nsq_topic_keyed_count", "Keyed messages published to the topic since start, duplicates "
                     "included (counter; pynsqd).", ("topic",))
    duplicates = _untyped("nsq_topic_duplicate_count", "Keyed messages not stored because the topic stored their key "
                          "within --dedup-window (counter; pynsqd).", ("topic",))
    held = _gauge("nsq_topic_keys_held", "Publish keys the topic remembers (pynsqd).", ("topic",))
    for t in topics:
        if t.keys is not None:
            keyed.add_metric([t.topic_name], t.keys.keyed_count)
            duplicates.add_metric([t.topic_name], t.keys.duplicate_count)
            held.add_metric([t.topic_name], t.keys.keys_held)
    all_held = _gauge("nsq_dedup_keys_held", "Publish keys remembered over all topics, at most --dedup-max-keys "
                      "(pynsqd).", ())
    all_held.add_metric([], snap.keys_held)
    evicted = _untyped("nsq_dedup_keys_evicted", "Publish keys forgotten before their window ended, to stay within "
                       "--dedup-max-keys (counter; pynsqd).", ())
    evicted.add_metric([], snap.keys_evicted)
    return [keyed, duplicates, held, all_held, evicted]


def _replica_families(topics: Sequence[TopicStats]) -> list[Metric]:
    """pynsqd's replication, per topic, on a node that keeps copies (``--replicas`` > 1)."""
    replicas = _gauge("nsq_topic_replicas", "Nodes that hold each message of the topic before a publish is "
                      "acknowledged (pynsqd).", ("topic",))
    held = _gauge("nsq_topic_copies_held", "Copies of the topic's messages this node holds for other nodes "
                  "(pynsqd).", ("topic",))
    waiting = _gauge("nsq_topic_copies_waiting", "Copies sent to other nodes and not yet confirmed (pynsqd).",
                     ("topic",))
    takeovers = _untyped("nsq_topic_takeovers", "Messages of the topic taken over from nodes that were gone "
                         "(counter; pynsqd).", ("topic",))
    refused = _untyped("nsq_topic_publishes_refused", "Publishes to the topic refused because too few nodes took "
                       "a copy (counter; pynsqd).", ("topic",))
    missing = _gauge("nsq_topic_copies_missing", "Copies of the topic's messages that a node gone held and that are "
                     "not made again on another node yet (pynsqd).", ("topic",))
    families: list[GaugeMetricFamily | UnknownMetricFamily] = [replicas, held, waiting, takeovers, refused, missing]
    for t in topics:
        if t.replication is not None:
            for family, value in zip(families, t.replication):
                family.add_metric([t.topic_name], value)
    return list(families) if any(t.replication is not None for t in topics) else []


#: The node's replication counters (``/stats``'s ``replication`` block) and their metrics.
_NODE_REPLICA_COUNTERS = (
    ("log_records_lost", "nsq_replication_log_records_lost", "Records of the replication log that could not be "
     "read back, found damaged since start: copies held for other nodes may be lost (counter; pynsqd)."),
    ("log_records_skipped", "nsq_replication_log_records_skipped", "Records of the replication log that could "
     "not be applied at start and were skipped (counter; pynsqd)."),
    ("copies_lost", "nsq_replication_copies_lost", "Copies held for other nodes whose message could not be read "
     "back from the replication log at a takeover (counter; pynsqd)."),
    ("handshakes_refused", "nsq_replication_handshakes_refused", "Connections between this node and another where one "
     "of them did not prove it holds the cluster's secret, or TLS failed (counter; pynsqd)."),
    ("requests_refused", "nsq_replication_requests_refused", "REPL bodies from peer nodes refused because a "
     "request was not what a node sends (counter; pynsqd)."),
    ("takeover_failures", "nsq_replication_takeover_failures", "Topics whose takeover failed and was tried "
     "again (counter; pynsqd)."),
    ("copies_restored", "nsq_replication_copies_restored", "Copies of this node's messages made again on another "
     "node because a node that held them was gone (counter; pynsqd)."),
    ("keys_evicted", "nsq_replication_keys_evicted", "Publish keys of other nodes' copies forgotten before their "
     "dedup window ended, to stay within --dedup-max-keys (counter; pynsqd)."),
)


def _node_replica_families(replication: dict | None) -> list[Metric]:
    """pynsqd's replication, for the node (``--replicas`` > 1): its peers and what went wrong."""
    if replication is None:
        return []
    peers = _gauge("nsq_replication_peer_connected", "1 while this node's link to the peer is up and proven, "
                   "else 0 (pynsqd).", ("peer", "node_id"))
    for peer in replication["peers"]:
        peers.add_metric([peer["address"], peer["node_id"]], 1 if peer["connected"] else 0)
    missing = _gauge("nsq_replication_copies_missing", "Copies of this node's messages that a node gone held and "
                     "that are not made again on another node yet, over all topics (pynsqd).", ())
    missing.add_metric([], replication["copies_missing"])
    keys = _gauge("nsq_replication_keys_held", "Publish keys of other nodes' copies this node remembers within "
                  "their dedup window (pynsqd).", ())
    keys.add_metric([], replication["keys_held"])
    out: list[Metric] = [peers, missing, keys]
    for key, name, doc in _NODE_REPLICA_COUNTERS:
        counter = _untyped(name, doc, ())
        counter.add_metric([], replication[key])
        out.append(counter)
    return out


def _channel_families(channels: Sequence[tuple[TopicStats, ChannelStats]]) -> list[Metric]:
    out: list[Metric] = []
    levels = _gauge("nsq_channel_priority_depth", "Ready messages at each of the channel's most urgent "
                    "priorities, for a topic that has priorities (pynsqd).", ("topic", "channel", "priority"))
    for t, c in channels:
        for priority, count in c.priorities or ():
            levels.add_metric([t.topic_name, c.channel_name, str(priority)], count)
    out.append(levels)
    for name, doc, get in _CHANNEL_GAUGES:
        gauge = _gauge(name, doc, ("topic", "channel"))
        for t, c in channels:
            gauge.add_metric([t.topic_name, c.channel_name], get(c))
        out.append(gauge)
    for name, doc, get in _CHANNEL_COUNTERS:
        counter = _untyped(name, doc, ("topic", "channel"))
        for t, c in channels:
            counter.add_metric([t.topic_name, c.channel_name], get(c))
        out.append(counter)
    return out


def _latency_families(percentiles: tuple[float, ...], topics: Sequence[TopicStats],
                      channels: Sequence[tuple[TopicStats, ChannelStats]]) -> list[Metric]:
    """``*_e2e_processing_latency_<p>`` per configured percentile (ns), plus lovoo's 99/95 names."""
    out: list[Metric] = []
    seen: set[str] = set()
    for quantile in percentiles:
        suffix = percentile_suffix(quantile)
        if suffix in seen:  # 0.999 and 1.0 both print as "100"; statsd would overwrite too
            continue
        seen.add(suffix)
        topic_family = _gauge(f"nsq_topic_e2e_processing_latency_{suffix}",
                              f"{suffix}th percentile publish-to-FIN latency of the topic, in nanoseconds.",
                              ("topic",))
        channel_family = _gauge(f"nsq_topic_channel_e2e_processing_latency_{suffix}",
                                f"{suffix}th percentile publish-to-FIN latency of the channel, in nanoseconds.",
                                ("topic", "channel"))
        lovoo = {"99": ("nsq_topic_e2e_latency_99_percentile", "nsq_channel_e2e_latency_99p"),
                 "95": ("nsq_topic_e2e_latency_95_percentile", "nsq_channel_e2e_latency_95p")}.get(suffix)
        lovoo_topic = lovoo_channel = None
        if lovoo is not None:
            lovoo_topic = _gauge(lovoo[0], f"Same as nsq_topic_e2e_processing_latency_{suffix} (lovoo name).",
                                 ("topic",))
            lovoo_channel = _gauge(lovoo[1], f"Same as nsq_topic_channel_e2e_processing_latency_{suffix} (lovoo name).",
                                   ("topic", "channel"))
        for t in topics:
            value = _quantile_value(t.e2e_processing_latency.percentiles, quantile)
            if value is not None:
                topic_family.add_metric([t.topic_name], value)
                if lovoo_topic is not None:
                    lovoo_topic.add_metric([t.topic_name], value)
        for t, c in channels:
            value = _quantile_value(c.e2e_processing_latency.percentiles, quantile)
            if value is not None:
                channel_family.add_metric([t.topic_name, c.channel_name], value)
                if lovoo_channel is not None:
                    lovoo_channel.add_metric([t.topic_name, c.channel_name], value)
        out += [topic_family, channel_family]
        if lovoo_topic is not None and lovoo_channel is not None:
            out += [lovoo_topic, lovoo_channel]
    return out


def _quantile_value(percentiles: tuple[tuple[float, float], ...] | None, quantile: float) -> float | None:
    for q, value in percentiles or ():
        if q == quantile:
            return value
    return None


class _Families:
    """A collector for one render: the families computed from one snapshot."""

    __slots__ = ("_families",)

    def __init__(self, metric_families: list[Metric]):
        self._families = metric_families

    def collect(self) -> list[Metric]:
        return self._families


class MetricsExporter:
    """Renders ``/metrics``: the ``nsq_*`` families of a snapshot plus process metrics.

    Owns a private registry with prometheus-client's process, platform and GC
    collectors (not the global default registry, so several brokers in one process
    do not collide).
    """

    __slots__ = ("registry",)

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)

    def render(self, snap: Snapshot) -> bytes:
        """The exposition text for ``snap``."""
        return generate_latest(_Families(families(snap))) + generate_latest(self.registry)
