"""Taking a snapshot: one walk over the broker's topics, channels and clients.

:func:`snapshot` runs without awaiting, so nothing changes while it reads, and returns the
frozen records of :mod:`broker.observe.stats` that ``/stats`` and ``/metrics`` render.
nsqd's filters and quirks are kept (``nsqd/stats.go``, ``nsqd/http.go``):

* a ``topic`` filter that matches nothing gives no topics and no producers; a ``channel``
  filter that matches nothing drops the topic;
* ``producers`` (connections that have published) is None when there are none or clients
  are excluded; a channel's ``clients`` is None when clients are excluded;
* a client's ``pub_counts`` holds at most one entry (nsqd stops after the first match);
* a topic's e2e latency is empty when the topic has no channels or no percentiles are
  configured.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Iterable

from broker.config.options import NSQD_COMPAT_VERSION
from broker.core.host import Copies
from broker.core.latency import HistogramStats
from broker.gocompat import SECOND
from broker.observe.health import health_text
from broker.observe.runtime import memory_stats
from broker.observe.sources import BrokerSource, ChannelSource, ClientSource, LatencySource, TopicSource
from broker.observe.stats import (
    NO_E2E,
    PRIORITY_LEVELS,
    ChannelStats,
    ClientStats,
    E2eStats,
    KeyStats,
    ReplicaStats,
    Snapshot,
    TopicStats,
)

__all__ = ["snapshot"]


def _e2e_from(stream: LatencySource | None) -> E2eStats:
    if stream is None or not stream.percentiles:
        # nsqd keeps no latency stream without percentiles and reports an empty result.
        return NO_E2E
    result = stream.snapshot()
    percentiles = tuple((float(p["quantile"]), p["value"]) for p in result["percentiles"] or ())
    return E2eStats(int(result["count"]), percentiles)


def _histogram_from(channel: ChannelSource) -> HistogramStats | None:
    histogram = getattr(channel, "fin_latency", None)
    return None if histogram is None else histogram.snapshot()


def _client_stats(client: ClientSource, topic_filter: str) -> ClientStats:
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
        authed=bool(getattr(client, "authed", False)),
        auth_identity=getattr(client, "auth_identity", ""),
        auth_identity_url=getattr(client, "auth_identity_url", ""),
        pub_counts=pub_counts,
        tls=bool(getattr(client, "tls", False)),
        tls_cipher_suite=getattr(client, "tls_cipher_suite", ""),
        tls_version=getattr(client, "tls_version", ""),
        # no ALPN is offered on the V2 port, as in nsqd
        tls_negotiated_protocol="",
        tls_negotiated_protocol_is_mutual=bool(getattr(client, "tls", False)),
    )


def _channel_stats(channel: ChannelSource, include_clients: bool, topic_filter: str) -> ChannelStats:
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
        priorities=tuple(channel.priority_levels()[:PRIORITY_LEVELS]) if channel.ranked else None,
    )


def _topic_stats(topic: TopicSource, channels: tuple[ChannelStats, ...], copies: Copies) -> TopicStats:
    # nsqd aggregates the topic's latency from its channels' streams: none without channels.
    e2e = _e2e_from(topic.e2e) if topic.channels else NO_E2E
    counters = copies.counters(topic.name)
    return TopicStats(
        topic_name=topic.name,
        channels=channels,
        depth=topic.depth,
        backend_depth=topic.backend_depth,
        message_count=topic.message_count,
        message_bytes=topic.message_bytes,
        paused=topic.paused,
        e2e_processing_latency=e2e,
        keys=None if topic.keys is None else KeyStats(topic.keys.received, topic.keys.duplicates,
                                                      len(topic.keys.held)),
        replication=None if counters is None else ReplicaStats(*counters),
    )


def _lookupd_peers(broker: BrokerSource) -> tuple[tuple[str, bool], ...]:
    return tuple((peer.address, peer.connected) for listener in broker.listeners for peer in listener.peer_states())


def _transports(clients: Iterable[ClientSource]) -> tuple[tuple[tuple[bool, str], int], ...]:
    """Connected clients counted by (TLS, compression)."""
    counts = Counter(
        (bool(getattr(c, "tls", False)),
         "snappy" if getattr(c, "snappy", False) else "deflate" if getattr(c, "deflate", False) else "none")
        for c in clients
    )
    return tuple(sorted(counts.items()))


def snapshot(
    broker: BrokerSource,
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
    copies = broker.host.copies
    uptime_ns = max(0, time.time_ns() - broker.start_time * SECOND)
    percentiles = tuple(broker.options.e2e_processing_latency_percentiles)
    header = functools.partial(Snapshot, version=NSQD_COMPAT_VERSION, health=health_text(broker),
                               start_time=int(broker.start_time), uptime_ns=uptime_ns, memory=memory,
                               percentiles=percentiles, lookupd_peers=_lookupd_peers(broker),
                               transports=_transports(broker.clients), keys_held=broker.keys.held,
                               keys_evicted=broker.keys.evicted,
                               replication=copies.node_stats())
    if topic:
        found = broker.topics.get(topic)
        if found is None:
            return header(topics=None, producers=None)
        topics: Iterable[TopicSource] = (found,)
    else:
        topics = (broker.topics[name] for name in sorted(broker.topics))
    topic_stats = []
    for t in topics:
        if channel:
            found_channel = t.channels.get(channel)
            if found_channel is None:
                continue
            channels: Iterable[ChannelSource] = (found_channel,)
        else:
            channels = (t.channels[name] for name in sorted(t.channels))
        channel_stats = tuple(_channel_stats(c, include_clients, topic) for c in channels)
        topic_stats.append(_topic_stats(t, channel_stats, copies))
    producers = None
    if include_clients:
        # Connection order, where nsqd walks a sync.Map (no defined order).
        publishing = sorted((c for c in broker.clients if c.pub_counts), key=lambda c: c.number)
        producers = tuple(_client_stats(c, topic) for c in publishing) or None
    return header(topics=tuple(topic_stats), producers=producers)
