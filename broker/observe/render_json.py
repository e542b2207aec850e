"""``/stats?format=json``: a snapshot in nsqd's JSON shapes, written as Go's ``encoding/json`` writes.

Key order and ``null`` are nsqd 1.3.0's: ``"topics": null`` when a topic filter matched
nothing, ``"producers": null`` when there are none, a channel's ``"clients": null`` when
clients were excluded, omitempty fields left out. pynsqd's dead-letter keys follow nsqd's.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any

from broker.gocompat import go_json
from broker.observe.stats import ChannelStats, ClientStats, E2eStats, MemoryStats, Snapshot, TopicStats

__all__ = ["stats_document", "memory_document", "render_json"]


def _fields(*names: str) -> Callable[[Any], dict[str, Any]]:
    """A function of a stats record: ``{name: record.name}`` for each of ``names``, in that order
    (the JSON keys are the records' field names)."""
    get = attrgetter(*names)
    return lambda record: dict(zip(names, get(record)))


# Each in nsqd's key order; the documents below add the keys that are not plain fields.
_client_fields = _fields(
    "client_id", "hostname", "version", "remote_address", "state", "ready_count", "in_flight_count",
    "message_count", "finish_count", "requeue_count", "connect_ts", "sample_rate", "deflate", "snappy",
    "user_agent",
)
_client_tls_fields = _fields(
    "tls", "tls_cipher_suite", "tls_version", "tls_negotiated_protocol", "tls_negotiated_protocol_is_mutual",
)
_channel_fields = _fields(
    "channel_name", "depth", "backend_depth", "in_flight_count", "deferred_count", "message_count",
    "requeue_count", "timeout_count", "client_count",
)
_topic_fields = _fields("depth", "backend_depth", "message_count", "message_bytes", "paused")
_memory_fields = _fields(
    "heap_objects", "heap_idle_bytes", "heap_in_use_bytes", "heap_released_bytes", "gc_pause_usec_100",
    "gc_pause_usec_99", "gc_pause_usec_95", "next_gc_bytes", "gc_total_runs",
)


def _e2e_document(e2e: E2eStats) -> dict[str, Any]:
    percentiles = None
    if e2e.percentiles is not None:
        # nsqd stores each percentile as a map[string]float64: keys sorted, values float64.
        percentiles = [{"quantile": float(q), "value": float(v)} for q, v in e2e.percentiles]
    return {"count": e2e.count, "percentiles": percentiles}


def _client_document(client: ClientStats) -> dict[str, Any]:
    doc = _client_fields(client)
    # omitempty fields, in struct order
    if client.authed:
        doc["authed"] = True
    if client.auth_identity:
        doc["auth_identity"] = client.auth_identity
    if client.auth_identity_url:
        doc["auth_identity_url"] = client.auth_identity_url
    if client.pub_counts:
        doc["pub_counts"] = [{"topic": name, "count": count} for name, count in client.pub_counts]
    doc.update(_client_tls_fields(client))
    return doc


def _channel_document(channel: ChannelStats) -> dict[str, Any]:
    doc = _channel_fields(channel)
    doc["clients"] = None if channel.clients is None else [_client_document(c) for c in channel.clients]
    doc["paused"] = channel.paused
    doc["e2e_processing_latency"] = _e2e_document(channel.e2e_processing_latency)
    if channel.max_attempts or channel.buried_count:
        # pynsqd's dead letters, after nsqd's keys (clients of nsqd's shape ignore them)
        doc["max_attempts"] = channel.max_attempts
        doc["buried_count"] = channel.buried_count
    if channel.priorities is not None:
        # pynsqd's priorities: only for a topic that has them
        doc["priorities"] = [{"priority": p, "depth": n} for p, n in channel.priorities]
    return doc


def _topic_document(topic: TopicStats) -> dict[str, Any]:
    doc: dict[str, Any] = {"topic_name": topic.topic_name, "channels": [_channel_document(c) for c in topic.channels]}
    doc.update(_topic_fields(topic))
    doc["e2e_processing_latency"] = _e2e_document(topic.e2e_processing_latency)
    if topic.keys is not None:
        # pynsqd's keyed publishes, after nsqd's keys, only for a topic that had one
        doc["keyed_count"], doc["duplicate_count"], doc["keys_held"] = topic.keys
    if topic.replication is not None:  # pynsqd's replication, only on a node that keeps copies
        doc["replication"] = topic.replication._asdict()
    return doc


def memory_document(memory: MemoryStats) -> dict[str, int]:
    """nsqd's ``memory`` block as a dict, in nsqd's key order."""
    return _memory_fields(memory)


def stats_document(snap: Snapshot) -> dict[str, Any]:
    """The ``/stats?format=json`` document as plain dicts and lists, in nsqd's key order."""
    doc: dict[str, Any] = {
        "version": snap.version,
        "health": snap.health,
        "start_time": snap.start_time,
        "topics": None if snap.topics is None else [_topic_document(t) for t in snap.topics],
    }
    if snap.memory is not None:
        doc["memory"] = memory_document(snap.memory)
    doc["producers"] = None if snap.producers is None else [_client_document(c) for c in snap.producers]
    if snap.replication is not None:  # pynsqd's, after nsqd's keys, only on a node that keeps copies
        doc["replication"] = snap.replication
    return doc


def render_json(snap: Snapshot) -> bytes:
    """``/stats?format=json``: the body nsqd writes, byte for byte in layout."""
    # e2e percentiles are the document's only floats: without them, the fast encoder
    floats = any(t.e2e_processing_latency.percentiles is not None
                 or any(c.e2e_processing_latency.percentiles is not None for c in t.channels)
                 for t in snap.topics or ())
    return go_json(stats_document(snap), floats=floats)
