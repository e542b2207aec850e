"""``/stats`` in nsqd's text format: a snapshot as nsqd's ``/stats`` prints it for people."""

from __future__ import annotations

import datetime
import time

from broker.gocompat import SECOND, format_duration
from broker.observe.render_json import memory_document
from broker.observe.runtime import BUILT_WITH
from broker.observe.stats import ChannelStats, ClientStats, E2eStats, Snapshot, TopicStats

__all__ = ["render_text"]


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


def _dead_letter_text(channel: ChannelStats) -> str:
    # pynsqd's dead letters, only where the JSON shows them, so that a broker without
    # dead-lettering prints nsqd's lines byte for byte
    if not (channel.max_attempts or channel.buried_count):
        return ""
    return f" buried: {channel.buried_count} max-attempts: {channel.max_attempts}"


def _priorities_text(channel: ChannelStats) -> str:
    # pynsqd's priorities, only for a topic that has them
    if channel.priorities is None:
        return ""
    return " priorities: " + (" ".join(f"{p}={n}" for p, n in channel.priorities) or "none")


def _keys_text(topic: TopicStats) -> str:
    """pynsqd's keyed publishes at the end of a topic's line, for a topic that had one."""
    if topic.keys is None:
        return ""
    keyed, duplicates, held = topic.keys
    return f" keyed: {keyed} duplicates: {duplicates} keys: {held}"


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
        for key, value in memory_document(memory).items():
            lines.append(f"   {key:<25}\t{value}\n")
    topics = snap.topics or ()
    lines.append("\nTopics:" if topics else "\nTopics: None\n")
    for topic in topics:
        prefix = "*P " if topic.paused else "   "
        lines.append(f"\n{prefix}[{topic.topic_name:<15}] depth: {topic.depth:<5d} be-depth: {topic.backend_depth:<5d} "
                     f"msgs: {topic.message_count:<8d} e2e%: {_e2e_text(topic.e2e_processing_latency)}"
                     f"{_keys_text(topic)}\n")
        for channel in topic.channels:
            prefix = "   *P " if channel.paused else "      "
            lines.append(
                f"{prefix}[{channel.channel_name:<25}] depth: {channel.depth:<5d} be-depth: {channel.backend_depth:<5d} "
                f"inflt: {channel.in_flight_count:<4d} def: {channel.deferred_count:<4d} "
                f"re-q: {channel.requeue_count:<5d} timeout: {channel.timeout_count:<5d} "
                f"msgs: {channel.message_count:<8d} e2e%: {_e2e_text(channel.e2e_processing_latency)}"
                f"{_dead_letter_text(channel)}{_priorities_text(channel)}\n")
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
