"""Stats snapshots built from plain dataclasses, for the renderers' tests."""

from __future__ import annotations

from broker.observe.stats import NO_E2E, ChannelStats, ClientStats, E2eStats, MemoryStats, Snapshot, TopicStats

__all__ = ["MEMORY", "MIXIN_NAMES", "START", "channel", "client", "snap", "topic"]

START = 1_700_000_000


def client(**overrides) -> ClientStats:
    fields = dict(
        client_id="worker", hostname="host1", version="V2", remote_address="127.0.0.1:5555", state=3,
        ready_count=10, in_flight_count=2, message_count=7, finish_count=5, requeue_count=1,
        connect_ts=START, sample_rate=0, deflate=False, snappy=False, user_agent="pynsq/0.9.1",
        authed=False, auth_identity="", auth_identity_url="", pub_counts=(), tls=False,
        tls_cipher_suite="", tls_version="", tls_negotiated_protocol="",
        tls_negotiated_protocol_is_mutual=False,
    )
    fields.update(overrides)
    return ClientStats(**fields)


def channel(name="ch", clients=(), **overrides) -> ChannelStats:
    fields = dict(
        channel_name=name, depth=3, backend_depth=1, in_flight_count=2, deferred_count=1, message_count=9,
        requeue_count=1, timeout_count=0, client_count=len(clients or ()), clients=clients, paused=False,
        e2e_processing_latency=E2eStats(4, ((0.99, 1500.0), (0.5, 2_500_000.0))),
    )
    fields.update(overrides)
    return ChannelStats(**fields)


def topic(name="t", channels=(), **overrides) -> TopicStats:
    fields = dict(topic_name=name, channels=channels, depth=5, backend_depth=2, message_count=12,
                  message_bytes=345, paused=False, e2e_processing_latency=NO_E2E)
    fields.update(overrides)
    return TopicStats(**fields)


MEMORY = MemoryStats(heap_objects=10, heap_idle_bytes=0, heap_in_use_bytes=4096, heap_released_bytes=0,
                     gc_pause_usec_100=30, gc_pause_usec_99=20, gc_pause_usec_95=10, next_gc_bytes=0,
                     gc_total_runs=7)


def snap(topics=(), producers=None, memory=MEMORY, health="OK") -> Snapshot:
    return Snapshot(version="1.3.0", health=health, start_time=START, uptime_ns=61_500_000_000,
                    topics=topics, memory=memory, producers=producers)


#: Every series the Grafana NSQ mixin's dashboards and alerts query (with 0.99 configured).
MIXIN_NAMES = [
    "nsq_topic_message_count", "nsq_topic_message_bytes", "nsq_topic_depth", "nsq_topic_backend_depth",
    "nsq_topic_e2e_processing_latency_99", "nsq_topic_channel_clients", "nsq_topic_channel_depth",
    "nsq_topic_channel_backend_depth", "nsq_topic_channel_in_flight_count", "nsq_topic_channel_requeue_count",
    "nsq_topic_channel_timeout_count", "nsq_topic_channel_deferred_count", "nsq_topic_channel_message_count",
    "nsq_topic_channel_e2e_processing_latency_99", "nsq_mem_heap_in_use_bytes", "nsq_mem_heap_idle_bytes",
    "nsq_mem_heap_released_bytes", "nsq_mem_heap_objects", "nsq_mem_next_gc_bytes", "nsq_mem_gc_pause_usec_100",
    "nsq_mem_gc_pause_usec_99", "nsq_mem_gc_pause_usec_95",
]
