"""statsd push lines (names, types, deltas, order) and their packing into packets, as nsqd 1.3.0's."""

from __future__ import annotations

import dataclasses

import pytest

from broker.observe.stats import E2eStats
from broker.observe.statsd_lines import PushState, statsd_lines
from broker.observe.statsd_packets import pack_lines
from broker.observe.statsd_prefix import host_key, statsd_prefix
from broker.observe.statsd_pusher import split_address
from tests.support.snapshots import MEMORY, channel, topic


@pytest.mark.parametrize(("template", "address", "port", "expected"), [
    ("nsq.%s", "127.0.0.1", 4151, "nsq.127_0_0_1_4151."),
    ("nsq.%s", "host.example.com", 80, "nsq.host_example_com_80."),
    ("nsq.%s", "::1", 4151, "nsq.[__1]_4151."),  # Go's JoinHostPort brackets IPv6
    ("%s.%s.", "h", 1, "h_1.h_1."),
    ("stats.nsq", "h", 1, "stats.nsq."),
    ("", "h", 1, ""),
])
def test_prefix_expands_host_and_port_as_nsqd(template, address, port, expected):
    assert statsd_prefix(template, address, port) == expected


def test_host_key():
    assert host_key("10.0.0.1:4151") == "10_0_0_1_4151"


@pytest.mark.parametrize(("address", "parts"), [
    ("127.0.0.1:8125", ("127.0.0.1", 8125)), ("[::1]:8125", ("::1", 8125)), ("statsd:1", ("statsd", 1)),
    ("host:", ("host", 0)), ("host:+65535", ("host", 65535)),  # as Go's dial reads them
])
def test_split_address(address, parts):
    assert split_address(address) == parts


@pytest.mark.parametrize(("address", "error"), [
    ("127.0.0.1", "address 127.0.0.1: missing port in address"),
    ("127.0.0.1:99999", "address 99999: invalid port"),
    ("[::1]:65536", "address 65536: invalid port"),
    ("127.0.0.1:-1", "address -1: invalid port"),
    ("host:no-such-service", "address udp/no-such-service: unknown port"),
    ("a:b:8125", "address a:b:8125: too many colons in address"),
])
def test_split_address_refuses_what_gos_dial_refuses(address, error):
    with pytest.raises(ValueError) as refused:
        split_address(address)
    assert str(refused.value) == error


def _parsed(lines: list[bytes]) -> list[tuple[str, str, str]]:
    out = []
    for line in lines:
        assert line.endswith(b"\n")
        name, _, rest = line[:-1].decode().partition(":")
        value, _, kind = rest.partition("|")
        out.append((name, value, kind))
    return out


CHANNEL_NAMES = ["message_count", "depth", "backend_depth", "in_flight_count", "deferred_count",
                 "requeue_count", "timeout_count", "clients"]
CHANNEL_COUNTERS = {"message_count", "requeue_count", "timeout_count"}
MEM_NAMES = ["heap_objects", "heap_idle_bytes", "heap_in_use_bytes", "heap_released_bytes", "gc_pause_usec_100",
             "gc_pause_usec_99", "gc_pause_usec_95", "next_gc_bytes", "gc_runs"]


def test_first_push_names_types_and_order():
    e2e = E2eStats(4, ((0.99, 1500.7), (0.5, 2_500_000.0)))
    topics = (topic("a", channels=(channel("x", e2e_processing_latency=e2e),), e2e_processing_latency=e2e),)
    lines, state = statsd_lines("nsq.h_1.", topics, MEMORY, PushState({}))
    parsed = _parsed(lines)
    assert all(name.startswith("nsq.h_1.") for name, _, _ in parsed)
    names = [(name.removeprefix("nsq.h_1."), kind) for name, _, kind in parsed]
    assert names == [
        ("topic.a.message_count", "c"), ("topic.a.message_bytes", "c"), ("topic.a.depth", "g"),
        ("topic.a.backend_depth", "g"), ("topic.a.e2e_processing_latency_99", "g"),
        ("topic.a.e2e_processing_latency_50", "g"),
        *[(f"topic.a.channel.x.{n}", "c" if n in CHANNEL_COUNTERS else "g") for n in CHANNEL_NAMES],
        ("topic.a.channel.x.e2e_processing_latency_99", "g"), ("topic.a.channel.x.e2e_processing_latency_50", "g"),
        *[(f"mem.{n}", "c" if n == "gc_runs" else "g") for n in MEM_NAMES],
    ]
    values = {name.removeprefix("nsq.h_1."): int(value) for name, value, _ in parsed}
    # the first push counts from zero; latency nanoseconds are truncated
    assert values["topic.a.message_count"] == 12 and values["topic.a.message_bytes"] == 345
    assert values["topic.a.e2e_processing_latency_99"] == 1500
    assert values["topic.a.channel.x.message_count"] == 9 and values["topic.a.channel.x.clients"] == 0
    assert values["mem.gc_runs"] == MEMORY.gc_total_runs
    assert state.gc_runs == MEMORY.gc_total_runs and set(state.topics) == {"a"}


def test_counters_are_deltas_and_gauges_are_levels():
    first = (topic("a", channels=(channel("x", message_count=5, requeue_count=1, timeout_count=0, depth=3),),
                   message_count=5, message_bytes=50),)
    _, state = statsd_lines("", first, MEMORY, PushState({}))
    second = (topic("a", channels=(channel("x", message_count=8, requeue_count=3, timeout_count=2, depth=4),
                                   channel("y", message_count=2)), message_count=8, message_bytes=80),)
    memory = dataclasses.replace(MEMORY, gc_total_runs=MEMORY.gc_total_runs + 4)
    lines, _ = statsd_lines("", second, memory, state)
    values = {name: (int(value), kind) for name, value, kind in _parsed(lines)}
    assert values["topic.a.message_count"] == (3, "c")
    assert values["topic.a.message_bytes"] == (30, "c")
    assert values["topic.a.channel.x.message_count"] == (3, "c")
    assert values["topic.a.channel.x.requeue_count"] == (2, "c")
    assert values["topic.a.channel.x.timeout_count"] == (2, "c")
    assert values["topic.a.channel.x.depth"] == (4, "g")
    assert values["topic.a.channel.y.message_count"] == (2, "c")  # new channel: from zero
    assert values["mem.gc_runs"] == (4, "c")


def test_a_recreated_topic_reports_a_negative_delta():
    _, state = statsd_lines("", (topic("a", message_count=5),), None, PushState({}))
    lines, _ = statsd_lines("", (topic("a", message_count=2),), None, state)
    assert lines[0] == b"topic.a.message_count:-3|c\n"


def test_without_memory_stats_no_mem_lines_and_the_gc_count_is_kept():
    lines, state = statsd_lines("p.", (), None, PushState({}, gc_runs=7))
    assert lines == [] and state.gc_runs == 7


def test_exclude_ephemeral_skips_topics_and_channels():
    topics = (topic("a", channels=(channel("x"), channel("y#ephemeral"))), topic("b#ephemeral", channels=(channel("z"),)))
    names = [name for name, _, _ in _parsed(statsd_lines("", topics, None, PushState({}),
                                                          exclude_ephemeral=True)[0])]
    assert not any("#ephemeral" in n for n in names)
    assert "topic.a.channel.x.depth" in names
    everything = [name for name, _, _ in _parsed(statsd_lines("", topics, None, PushState({}))[0])]
    assert "topic.b#ephemeral.channel.z.depth" in everything and "topic.a.channel.y#ephemeral.depth" in everything


@pytest.mark.parametrize(("lines", "size", "packets"), [
    ([], 10, []),
    ([b"aaa\n", b"bb\n", b"c\n"], 10, [b"aaa\nbb\nc\n"]),
    ([b"aaa\n", b"bbbb\n", b"cc\n"], 9, [b"aaa\nbbbb\n", b"cc\n"]),  # an exact fit stays in the packet
    ([b"aaa\n", b"bbbbb\n", b"cc\n"], 9, [b"aaa\n", b"bbbbb\ncc\n"]),  # one byte over: the next packet
    ([b"a\n", b"0123456789ab\n", b"c\n", b"d\n"], 8, [b"a\n", b"0123456789ab\n", b"c\nd\n"]),  # too long: alone
    ([b"0123456789ab\n", b"0123456789ab\n"], 8, [b"0123456789ab\n", b"0123456789ab\n"]),
])
def test_packing_is_nsqds_boundary_buffered_writer(lines, size, packets):
    assert pack_lines(lines, size) == packets
