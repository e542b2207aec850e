"""Reporting on the running broker: one snapshot behind ``/stats`` and ``/metrics``.

* :mod:`~broker.observe.collect` -- :func:`snapshot`, one walk over topics, channels and clients
  (read through the structural types of :mod:`~broker.observe.sources`);
* :mod:`~broker.observe.stats` -- the frozen records a snapshot is made of;
* :mod:`~broker.observe.runtime` -- garbage-collection pauses and memory of the process;
* :mod:`~broker.observe.render_json` and :mod:`~broker.observe.render_text` -- ``/stats``;
* :mod:`~broker.observe.prometheus` -- ``/metrics`` (imported by the first scrape: it loads
  prometheus-client, which a start need not pay for);
* :mod:`~broker.observe.statsd_lines`, :mod:`~broker.observe.statsd_packets` and
  :mod:`~broker.observe.statsd_pusher` -- nsqd's statsd push (``--statsd-address``).

Every renderer reads the same snapshot, so the numbers they show always agree.
"""

from broker.gocompat import go_json
from broker.observe.collect import health_text, snapshot
from broker.observe.render_json import render_json, stats_document
from broker.observe.render_text import render_text
from broker.observe.runtime import GC_PAUSES, GcPauses, memory_stats
from broker.observe.sources import BrokerSource, ChannelSource, ClientSource, LatencySource, TopicSource
from broker.observe.stats import (
    NO_E2E,
    ChannelStats,
    ClientStats,
    E2eStats,
    HistogramStats,
    MemoryStats,
    Snapshot,
    TopicStats,
)
from broker.observe.statsd_lines import PushState, host_key, statsd_lines, statsd_prefix
from broker.observe.statsd_packets import pack_lines
from broker.observe.statsd_pusher import StatsdPusher

__all__ = [
    "snapshot", "health_text",
    "Snapshot", "TopicStats", "ChannelStats", "ClientStats", "E2eStats", "NO_E2E", "HistogramStats", "MemoryStats",
    "GcPauses", "GC_PAUSES", "memory_stats",
    "render_json", "render_text", "stats_document", "go_json",
    "StatsdPusher", "PushState", "statsd_lines", "statsd_prefix", "host_key", "pack_lines",
    "BrokerSource", "TopicSource", "ChannelSource", "ClientSource", "LatencySource",
]
