"""Unit tests of the Prometheus exposition, on snapshots built from plain dataclasses."""

from __future__ import annotations

import pytest

from broker.core.latency import LATENCY_BUCKETS, LatencyHistogram
from broker.observe.prometheus import MetricsExporter, percentile_suffix
from broker.observe.stats import E2eStats, Snapshot
from tests.support.exposition import metric_samples
from tests.support.snapshots import MEMORY, MIXIN_NAMES, START, channel, client, topic


def example_snapshot() -> Snapshot:
    histogram = LatencyHistogram()
    for ms in (0.5, 3, 3, 40, 2000):
        histogram.observe_many([int(ms * 1_000_000)])
    e2e = E2eStats(5, ((0.99, 2_000_000_000.0), (0.95, 40_000_000.0)))
    ch = channel(clients=(client(),), e2e_processing_latency=e2e, fin_latency=histogram.snapshot())
    quiet = channel("quiet", paused=True, e2e_processing_latency=E2eStats(0, ((0.99, 0.0), (0.95, 0.0))))
    t = topic(channels=(ch, quiet), e2e_processing_latency=e2e)
    return Snapshot(version="1.3.0", health="OK", start_time=START, uptime_ns=1, topics=(t, topic("empty")),
                    memory=MEMORY, producers=None, percentiles=(0.99, 0.95))


@pytest.fixture(scope="module")
def exposition() -> str:
    return MetricsExporter().render(example_snapshot()).decode()


def test_every_mixin_series_exists(exposition):
    names = {name for name, _ in metric_samples(exposition)}
    missing = [name for name in MIXIN_NAMES if name not in names]
    assert not missing


def test_counters_keep_their_statsd_names(exposition):
    assert "# TYPE nsq_topic_message_count untyped\n" in exposition
    assert 'nsq_topic_message_count{topic="t"} 12.0\n' in exposition
    assert "nsq_topic_message_count_total" not in exposition


def test_values_and_labels(exposition):
    found = metric_samples(exposition)
    assert found[("nsq_topic_depth", (("topic", "t"),))] == 5
    assert found[("nsq_topic_depth", (("topic", "empty"),))] == 5
    assert found[("nsq_topic_channel_count", (("topic", "t"),))] == 2
    key = (("channel", "ch"), ("topic", "t"))
    assert found[("nsq_topic_channel_in_flight_count", key)] == 2
    assert found[("nsq_channel_inflight_count", key)] == 2
    assert found[("nsq_channel_in_flight_count", key)] == 2
    assert found[("nsq_topic_channel_clients", key)] == 1
    assert found[("nsq_topic_channel_requeue_count", key)] == 1
    assert found[("nsq_topic_channel_paused", (("channel", "quiet"), ("topic", "t")))] == 1
    assert found[("nsq_topic_channel_e2e_processing_latency_99", key)] == 2e9
    assert found[("nsq_channel_e2e_latency_95p", key)] == 4e7
    assert found[("nsq_topic_e2e_latency_99_percentile", (("topic", "t"),))] == 2e9
    assert found[("nsq_mem_gc_runs", ())] == 7
    assert found[("nsq_server_healthy", ())] == 1
    assert found[("nsq_server_topic_count", ())] == 2
    # a topic without channels reports no latency, as nsqd's statsd output does
    assert ("nsq_topic_e2e_processing_latency_99", (("topic", "empty"),)) not in found


def test_client_series_carry_lovoos_labels(exposition):
    found = metric_samples(exposition)
    labels = (("channel", "ch"), ("client_id", "worker"), ("deflate", "false"), ("hostname", "host1"),
              ("remote_address", "127.0.0.1:5555"), ("snappy", "false"), ("tls", "false"), ("topic", "t"),
              ("version", "V2"))
    assert found[("nsq_client_ready_count", labels)] == 10
    assert found[("nsq_client_finish_count", labels)] == 5


def test_fin_latency_histogram(exposition):
    found = metric_samples(exposition)
    key = (("channel", "ch"), ("topic", "t"))
    assert found[("nsq_topic_channel_e2e_processing_latency_seconds_count", key)] == 5
    assert found[("nsq_topic_channel_e2e_processing_latency_seconds_sum", key)] == pytest.approx(2.0465)
    def bucket(le):
        return found[("nsq_topic_channel_e2e_processing_latency_seconds_bucket", (key[0], ("le", le), key[1]))]

    assert bucket("0.001") == 1
    assert bucket("0.005") == 3
    assert bucket("0.05") == 4
    assert bucket("2.5") == 5
    assert bucket("+Inf") == 5
    # the channel without a histogram has no series
    assert ("nsq_topic_channel_e2e_processing_latency_seconds_count", (("channel", "quiet"), ("topic", "t"))) \
        not in found


def test_process_metrics_are_included(exposition):
    names = {name for name, _ in metric_samples(exposition)}
    assert "process_resident_memory_bytes" in names
    assert "python_gc_collections_total" in names


def test_a_large_fin_run_fills_the_histogram_as_its_latencies_one_by_one():
    bounds = [round(b * 1e9) for b in LATENCY_BUCKETS]
    # every bound, one below and one above it, zero, negatives, beyond the last bound
    latencies = [x for b in bounds for x in (b - 1, b, b + 1)] + [0, -5, -1, 10**13, 7] * 3
    together, one_by_one = LatencyHistogram(), LatencyHistogram()
    together.observe_many(latencies)
    for latency in latencies:
        one_by_one.observe_many([latency])
    assert together.snapshot() == one_by_one.snapshot()
    assert together.snapshot().count == len(latencies)


def test_histogram_buckets():
    histogram = LatencyHistogram()
    histogram.observe_many([-5])
    histogram.observe_many([1_000_000])  # exactly 1ms: in the 0.001 bucket (le)
    histogram.observe_many([10**13])  # beyond the last bound: +Inf only
    snap = histogram.snapshot()
    assert snap.count == 3
    assert snap.buckets[0] == (0.001, 2)
    assert snap.buckets[-1] == (LATENCY_BUCKETS[-1], 2)
    assert snap.sum_seconds == pytest.approx(10_000.001)


@pytest.mark.parametrize("quantile, suffix", [(0.99, "99"), (0.95, "95"), (1.0, "100"), (0.5, "50"),
                                              (0.999, "100")])
def test_percentile_suffix_is_statsds(quantile, suffix):
    assert percentile_suffix(quantile) == suffix


def test_duplicate_suffixes_are_exposed_once():
    snap = Snapshot(version="1.3.0", health="NOK - x", start_time=START, uptime_ns=1, topics=(), memory=None,
                    producers=None, percentiles=(1.0, 0.999))
    text = MetricsExporter().render(snap).decode()
    assert text.count("# TYPE nsq_topic_e2e_processing_latency_100 gauge") == 1
    assert "nsq_server_healthy 0.0" in text
    assert "nsq_mem_" not in text
