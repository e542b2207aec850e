"""The lines of one statsd push, named, typed and ordered as nsqd 1.3.0 writes them.

nsqd (``nsqd/statsd.go``, ``internal/statsd/``) walks its stats sorted by topic and channel
name and writes, per topic::

    topic.<t>.message_count            counter, delta since the last push
    topic.<t>.message_bytes            counter, delta
    topic.<t>.depth                    gauge
    topic.<t>.backend_depth            gauge
    topic.<t>.e2e_processing_latency_<p>   gauge (ns), per configured percentile

then per channel of the topic ``message_count`` (counter), ``depth``, ``backend_depth``,
``in_flight_count``, ``deferred_count`` (gauges), ``requeue_count``, ``timeout_count``
(counters), ``clients`` (gauge) and its e2e percentiles; and last, when memory stats are
on, eight ``mem.*`` gauges and the ``mem.gc_runs`` counter. A line is
``<prefix><name>:<value>|c`` or ``|g``, ending in a newline.

A counter's delta is taken against the same topic (and channel) of the previous push, or
against zero when it was not there, so a topic deleted and re-created can report a
negative delta, as nsqd's does.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.observe.stats import ChannelStats, E2eStats, MemoryStats, TopicStats, percentile_suffix
from broker.observe.statsd_prefix import host_key, statsd_prefix

__all__ = ["EPHEMERAL_SUFFIX", "FIRST_PUSH", "PushState", "host_key", "statsd_lines", "statsd_prefix"]

#: Topics and channels whose names end so are left out by ``--statsd-exclude-ephemeral``.
EPHEMERAL_SUFFIX = "#ephemeral"


@dataclass(frozen=True, slots=True)
class PushState:
    """What the previous push reported, for the next push's counter deltas.

    ``topics`` maps a topic name to its stats; ``gc_runs`` is the collection count then.
    """

    topics: dict[str, TopicStats]
    gc_runs: int = 0


#: Before the first push every counter starts from zero.
FIRST_PUSH = PushState({})


class _Lines:
    """Accumulates ``<prefix><name>:<value>|<type>\\n`` lines."""

    __slots__ = ("prefix", "lines")

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.lines: list[bytes] = []

    def counter(self, name: str, delta: int) -> None:
        self.lines.append(f"{self.prefix}{name}:{delta}|c\n".encode())

    def gauge(self, name: str, value: int) -> None:
        self.lines.append(f"{self.prefix}{name}:{value}|g\n".encode())

    def latency(self, path: str, e2e: E2eStats) -> None:
        for quantile, value in e2e.percentiles or ():
            # nsqd converts the float nanoseconds with int64(): truncation
            self.gauge(f"{path}.e2e_processing_latency_{percentile_suffix(quantile)}", int(value))


def _channel_lines(out: _Lines, topic: str, channel: ChannelStats, last: ChannelStats | None) -> None:
    path = f"topic.{topic}.channel.{channel.channel_name}"
    out.counter(f"{path}.message_count", channel.message_count - (last.message_count if last else 0))
    out.gauge(f"{path}.depth", channel.depth)
    out.gauge(f"{path}.backend_depth", channel.backend_depth)
    out.gauge(f"{path}.in_flight_count", channel.in_flight_count)
    out.gauge(f"{path}.deferred_count", channel.deferred_count)
    out.counter(f"{path}.requeue_count", channel.requeue_count - (last.requeue_count if last else 0))
    out.counter(f"{path}.timeout_count", channel.timeout_count - (last.timeout_count if last else 0))
    out.gauge(f"{path}.clients", channel.client_count)
    out.latency(path, channel.e2e_processing_latency)


def _memory_lines(out: _Lines, memory: MemoryStats, last_gc_runs: int) -> None:
    out.gauge("mem.heap_objects", memory.heap_objects)
    out.gauge("mem.heap_idle_bytes", memory.heap_idle_bytes)
    out.gauge("mem.heap_in_use_bytes", memory.heap_in_use_bytes)
    out.gauge("mem.heap_released_bytes", memory.heap_released_bytes)
    out.gauge("mem.gc_pause_usec_100", memory.gc_pause_usec_100)
    out.gauge("mem.gc_pause_usec_99", memory.gc_pause_usec_99)
    out.gauge("mem.gc_pause_usec_95", memory.gc_pause_usec_95)
    out.gauge("mem.next_gc_bytes", memory.next_gc_bytes)
    out.counter("mem.gc_runs", memory.gc_total_runs - last_gc_runs)


def statsd_lines(prefix: str, topics: tuple[TopicStats, ...], memory: MemoryStats | None, last: PushState,
                 *, exclude_ephemeral: bool = False) -> tuple[list[bytes], PushState]:
    """The lines of one push and the state the next push takes its deltas from.

    ``topics`` must be sorted by name with their channels sorted (as a snapshot is);
    ``memory`` is None when ``--statsd-mem-stats=false`` (the last GC count is then kept).
    ``prefix`` is already expanded (:func:`statsd_prefix`).
    """
    out = _Lines(prefix)
    for topic in topics:
        name = topic.topic_name
        if exclude_ephemeral and name.endswith(EPHEMERAL_SUFFIX):
            continue
        last_topic = last.topics.get(name)
        out.counter(f"topic.{name}.message_count", topic.message_count - (last_topic.message_count if last_topic else 0))
        out.counter(f"topic.{name}.message_bytes", topic.message_bytes - (last_topic.message_bytes if last_topic else 0))
        out.gauge(f"topic.{name}.depth", topic.depth)
        out.gauge(f"topic.{name}.backend_depth", topic.backend_depth)
        out.latency(f"topic.{name}", topic.e2e_processing_latency)
        last_channels = {c.channel_name: c for c in last_topic.channels} if last_topic else {}
        for channel in topic.channels:
            if exclude_ephemeral and channel.channel_name.endswith(EPHEMERAL_SUFFIX):
                continue
            _channel_lines(out, name, channel, last_channels.get(channel.channel_name))
    gc_runs = last.gc_runs
    if memory is not None:
        _memory_lines(out, memory, last.gc_runs)
        gc_runs = memory.gc_total_runs
    # nsqd remembers every topic it saw, excluded ephemeral ones too
    return out.lines, PushState({topic.topic_name: topic for topic in topics}, gc_runs)
