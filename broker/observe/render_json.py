"""``/stats?format=json``: a snapshot in nsqd's JSON shapes, written as Go's ``encoding/json`` writes.

Key order and ``null`` are nsqd 1.3.0's: ``"topics": null`` when a topic filter matched
nothing, ``"producers": null`` when there are none, a channel's ``"clients": null`` when
clients were excluded, omitempty fields left out. pynsqd's dead-letter keys follow nsqd's.
"""

from __future__ import annotations

from typing import Any

from broker.gocompat import go_json
from broker.observe.stats import ChannelStats, ClientStats, E2eStats, MemoryStats, Snapshot, TopicStats

__all__ = ["stats_document", "memory_document", "render_json"]


def _e2e_document(e2e: E2eStats) -> dict[str, Any]:
    percentiles = None
    if e2e.percentiles is not None:
        # nsqd stores each percentile as a map[string]float64: keys sorted, values float64.
        percentiles = [{"quantile": float(q), "value": float(v)} for q, v in e2e.percentiles]
    return {"count": e2e.count, "percentiles": percentiles}


def _client_document(client: ClientStats) -> dict[str, Any]:
    doc: dict[str, Any] = {
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


def _channel_document(channel: ChannelStats) -> dict[str, Any]:
    doc: dict[str, Any] = {
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


def _topic_document(topic: TopicStats) -> dict[str, Any]:
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


def memory_document(memory: MemoryStats) -> dict[str, int]:
    """nsqd's ``memory`` block as a dict, in nsqd's key order."""
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
    return doc


def render_json(snap: Snapshot) -> bytes:
    """``/stats?format=json``: the body nsqd writes, byte for byte in layout."""
    return go_json(stats_document(snap))
