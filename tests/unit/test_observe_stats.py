"""Unit tests of the /stats renderers, on snapshots built from plain dataclasses."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.gocompat import go_json
from broker.gocompat import json_float as go_float
from broker.observe.render_json import render_json
from broker.observe.render_text import render_text
from broker.observe.runtime import GcPauses, memory_stats
from tests.support.snapshots import START, channel, client, snap, topic

# --------------------------------------------------------------------------- Go-style JSON


@pytest.mark.parametrize(
    "value, text",
    [(1.0, "1"), (0.99, "0.99"), (0.5, "0.5"), (1500.0, "1500"), (1e-7, "1e-7"), (1.5e-7, "1.5e-7"),
     (1e21, "1e+21"), (1e20, "100000000000000000000"), (0.000001, "0.000001"), (3.14e-5, "0.0000314"),
     (0.0, "0"), (-2.5, "-2.5")],
)
def test_go_float(value, text):
    assert go_float(value) == text


def test_go_json_escapes_like_encoding_json():
    assert go_json({"b": 1, "a": [True, None, "x<y>&z\"\\\n\t\x01\u2028é"]}) == (
        '{"b":1,"a":[true,null,"x\\u003cy\\u003e\\u0026z\\"\\\\\\n\\t\\u0001\\u2028é"]}'.encode())
    # invalid UTF-8 carried as surrogate escapes becomes U+FFFD
    assert go_json(b"a\xffb".decode("utf-8", "surrogateescape")) == '"a\ufffdb"'.encode()


_NO_FLOAT_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.text(st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF)),
    lambda inner: st.lists(inner, max_size=5) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(_NO_FLOAT_JSON)
def test_go_json_without_floats_writes_what_the_general_encoder_writes(value):
    # the fast path (the C encoder made Go's) against the general one, escapes, invalid
    # UTF-8 (lone surrogates), control characters and backslashes before b and f included
    assert go_json(value, floats=False) == go_json(value)


@pytest.mark.parametrize("text", ["\\b", "\b\f\\f", "a\x08\x0cb", "\\\x08", "<&>\u2028\u2029\udcff", "\x00\x1f\x7f"])
def test_go_json_without_floats_on_the_escapes_that_differ(text):
    assert go_json({text: [text]}, floats=False) == go_json({text: [text]})


# --------------------------------------------------------------------------- JSON


def test_json_empty_broker_matches_nsqd_prefix():
    body = render_json(snap())
    assert body.startswith(b'{"version":"1.3.0","health":"OK","start_time":1700000000,"topics":[],"memory":{')
    assert body.endswith(b',"producers":null}')


def test_json_full_document_layout():
    consumer = client()
    producer = client(client_id="pub", pub_counts=(("t", 3),), state=0)
    document = json.loads(render_json(snap((topic(channels=(channel(clients=(consumer,)),)),), (producer,))))
    assert list(document) == ["version", "health", "start_time", "topics", "memory", "producers"]
    t = document["topics"][0]
    assert list(t) == ["topic_name", "channels", "depth", "backend_depth", "message_count", "message_bytes",
                       "paused", "e2e_processing_latency"]
    assert t["e2e_processing_latency"] == {"count": 0, "percentiles": None}
    c = t["channels"][0]
    assert list(c) == ["channel_name", "depth", "backend_depth", "in_flight_count", "deferred_count",
                       "message_count", "requeue_count", "timeout_count", "client_count", "clients", "paused",
                       "e2e_processing_latency"]
    assert c["e2e_processing_latency"] == {"count": 4, "percentiles": [
        {"quantile": 0.99, "value": 1500}, {"quantile": 0.5, "value": 2500000}]}
    cl = c["clients"][0]
    assert list(cl) == ["client_id", "hostname", "version", "remote_address", "state", "ready_count",
                        "in_flight_count", "message_count", "finish_count", "requeue_count", "connect_ts",
                        "sample_rate", "deflate", "snappy", "user_agent", "tls", "tls_cipher_suite", "tls_version",
                        "tls_negotiated_protocol", "tls_negotiated_protocol_is_mutual"]
    p = document["producers"][0]
    assert p["pub_counts"] == [{"topic": "t", "count": 3}]
    assert list(p).index("pub_counts") == list(p).index("user_agent") + 1
    assert list(document["memory"]) == ["heap_objects", "heap_idle_bytes", "heap_in_use_bytes",
                                        "heap_released_bytes", "gc_pause_usec_100", "gc_pause_usec_99",
                                        "gc_pause_usec_95", "next_gc_bytes", "gc_total_runs"]


def test_json_exact_bytes_for_one_channel():
    body = render_json(snap((topic(channels=(channel(clients=None),)),), memory=None))
    assert body == (
        b'{"version":"1.3.0","health":"OK","start_time":1700000000,"topics":[{"topic_name":"t","channels":'
        b'[{"channel_name":"ch","depth":3,"backend_depth":1,"in_flight_count":2,"deferred_count":1,'
        b'"message_count":9,"requeue_count":1,"timeout_count":0,"client_count":0,"clients":null,"paused":false,'
        b'"e2e_processing_latency":{"count":4,"percentiles":[{"quantile":0.99,"value":1500},'
        b'{"quantile":0.5,"value":2500000}]}}],"depth":5,"backend_depth":2,"message_count":12,'
        b'"message_bytes":345,"paused":false,"e2e_processing_latency":{"count":0,"percentiles":null}}],'
        b'"producers":null}'
    )


def test_json_unmatched_topic_filter_is_null():
    assert render_json(snap(None, memory=None)) == (
        b'{"version":"1.3.0","health":"OK","start_time":1700000000,"topics":null,"producers":null}')


def test_json_unhealthy():
    assert b'"health":"NOK - disk full"' in render_json(snap(health="NOK - disk full"))


# --------------------------------------------------------------------------- text


def test_text_layout():
    consumer = client()
    producer = client(hostname="pubhost", remote_address="10.0.0.1:4000", user_agent="",
                      pub_counts=(("t", 3),))
    text = render_text(snap((topic(paused=True, channels=(channel(clients=(consumer,)),
                                                          channel("paused-ch", paused=True))),), (producer,)),
                       now=START + 75).decode()
    lines = text.split("\n")
    assert lines[0].startswith("nsqd v1.3.0 (built w/")
    assert lines[1].startswith("start_time 2023-11-1")
    assert lines[2] == "uptime 1m1.5s"
    assert lines[3:5] == ["", "Health: OK"]
    assert lines[6] == "Memory:"
    assert lines[7] == "   heap_objects             \t10"
    assert lines[15] == "   gc_total_runs            \t7"
    assert lines[16:18] == ["", "Topics:"]
    assert lines[18] == "*P [t              ] depth: 5     be-depth: 2     msgs: 12       e2e%: "
    assert lines[19] == ("      [ch                       ] depth: 3     be-depth: 1     inflt: 2    def: 1    "
                         "re-q: 1     timeout: 0     msgs: 9        e2e%: 1.5us, 2.5ms")
    assert lines[20] == ("        [V2 host1:5555 pynsq/0.9.1] state: 3 inflt: 2    rdy: 10   fin: 5        "
                         "re-q: 1        msgs: 7        connected: 1m15s")
    assert lines[21].startswith("   *P [paused-ch                ] depth: 3")
    assert lines[22:24] == ["", "Producers:"]
    assert lines[24] == "   [V2 pubhost:4000" + " " * 9 + "] msgs: 3        topics: t=3 connected: 1m15s"


def test_text_dead_letters_only_where_the_channel_uses_them():
    text = render_text(snap((topic(channels=(channel("plain"), channel("capped", max_attempts=5),
                                              channel("left", buried_count=2))),))).decode()
    lines = {line.split("]")[0].strip(" [").strip(): line for line in text.split("\n") if "depth:" in line}
    assert lines["plain"].endswith("e2e%: 1.5us, 2.5ms")
    assert lines["capped"].endswith("e2e%: 1.5us, 2.5ms buried: 0 max-attempts: 5")
    assert lines["left"].endswith("e2e%: 1.5us, 2.5ms buried: 2 max-attempts: 0")


def test_text_empty():
    text = render_text(snap(memory=None)).decode()
    assert "\nHealth: OK\n\nTopics: None\n\nProducers: None\n" in text
    assert "Memory:" not in text


# --------------------------------------------------------------------------- memory


def test_gc_pause_percentiles_use_nsqds_rounding():
    pauses = GcPauses()
    for usec in range(1, 101):
        pauses.record(usec * 1000)
    assert pauses.percentiles_usec() == (100, 100, 96)
    assert GcPauses().percentiles_usec() == (0, 0, 0)


def test_gc_pauses_are_measured_once_installed():
    import gc

    pauses = GcPauses()
    pauses.install()
    pauses.install()
    try:
        gc.collect()
        p100, p99, p95 = pauses.percentiles_usec()
        assert p100 >= 1, "a full collection takes more than a microsecond"
        assert p100 >= p99 >= p95
        assert len(pauses._pauses) >= 1
    finally:
        pauses.uninstall()
        pauses.uninstall()
    assert pauses._callback not in gc.callbacks


def test_memory_stats_are_plausible():
    import gc

    runs_before = memory_stats().gc_total_runs
    gc.collect()
    memory = memory_stats()
    assert memory.heap_objects > 0
    assert memory.heap_in_use_bytes > 1 << 20
    assert memory.gc_total_runs > runs_before
    assert memory.heap_idle_bytes == memory.heap_released_bytes == memory.next_gc_bytes == 0
