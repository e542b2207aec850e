"""Integration tests: ``/stats`` (JSON and text) field by field, its filters, and agreement
with ``/metrics`` taken in the same run."""

from __future__ import annotations

import json
import time

import pytest

from broker.protocol import encode_dpub, encode_fin, encode_pub, encode_rdy, encode_req, encode_sub
from tests.support.exposition import metric_samples
from tests.support.http_client import request
from tests.support.v2client import connect, subscriber
from tests.support.waiting import wait_for

PERCENTILES = "--e2e-processing-latency-percentile=0.99,0.95"


async def get_json(d, target: str) -> dict:
    reply = await request(d.addresses.http, "GET", target)
    assert reply.status == 200, reply
    assert reply.headers["content-type"] == "application/json; charset=utf-8"
    assert reply.headers["x-nsq-content-type"] == "nsq; version=1.0"
    return json.loads(reply.body)


def fields(doc: dict, *names: str) -> dict:
    """The entries of ``doc`` under ``names``, to compare with what they should be in one assert."""
    return {name: doc[name] for name in names}


async def traffic(d):
    """A producer (3 PUBs, 1 DPUB), a consumer holding 2 in flight after a FIN and a REQ,
    and a paused second channel. Returns the open connections."""
    producer = await connect(d.addresses.tcp)
    await producer.identify(client_id="producer-1", hostname="prodhost", user_agent="test-producer/1.0")
    consumer = await connect(d.addresses.tcp)
    await consumer.identify(client_id="consumer-1", hostname="conshost", user_agent="test-consumer/2.0",
                            feature_negotiation=True)
    await consumer.send(encode_sub("orders", "billing"))
    await consumer.expect_response(b"OK")
    reply = await request(d.addresses.http, "POST", "/channel/create?topic=orders&channel=audit")
    assert reply.status == 200
    assert (await request(d.addresses.http, "POST", "/channel/pause?topic=orders&channel=audit")).status == 200
    for body in (b"one", b"two", b"three!"):
        await producer.send(encode_pub("orders", body))
        await producer.expect_response(b"OK")
    await producer.send(encode_dpub("orders", 60_000, b"later"))
    await producer.expect_response(b"OK")
    await consumer.send(encode_rdy(3))
    first = await consumer.read_message()
    await consumer.send(encode_fin(first.id))
    second = await consumer.read_message()
    await consumer.send(encode_req(second.id, 0))
    # after the REQ the message comes back; the consumer keeps two in flight
    await consumer.read_messages(2)
    channel = d.broker.topics["orders"].channels["billing"]
    await wait_for(lambda: len(channel.in_flight) == 2 and channel.requeue_count == 1)
    return producer, consumer


async def test_stats_json_field_by_field(start_daemon):
    async with start_daemon(PERCENTILES) as d:
        producer, consumer = await traffic(d)
        stats = await get_json(d, "/stats?format=json")

        assert stats["version"] == "1.3.0"
        assert stats["health"] == "OK"
        assert stats["start_time"] == d.broker.start_time
        assert abs(stats["start_time"] - time.time()) < 60
        assert [t["topic_name"] for t in stats["topics"]] == ["orders"]

        t = stats["topics"][0]
        assert t["depth"] == 0 and t["backend_depth"] == 0
        assert t["message_count"] == 4
        assert t["message_bytes"] == len(b"one" + b"two" + b"three!" + b"later")
        assert t["paused"] is False
        assert t["e2e_processing_latency"]["count"] == 1
        assert [p["quantile"] for p in t["e2e_processing_latency"]["percentiles"]] == [0.99, 0.95]
        assert t["e2e_processing_latency"]["percentiles"][0]["value"] > 0

        audit, billing = t["channels"]  # sorted by name
        assert audit["channel_name"] == "audit" and billing["channel_name"] == "billing"
        assert audit["paused"] is True and billing["paused"] is False
        assert audit["depth"] == 3 and audit["deferred_count"] == 1 and audit["message_count"] == 4
        assert audit["client_count"] == 0 and audit["clients"] == []

        counts = {"depth": 0, "backend_depth": 0, "in_flight_count": 2, "deferred_count": 1, "message_count": 4,
                  "requeue_count": 1, "timeout_count": 0, "client_count": 1}
        assert fields(billing, *counts) == counts
        assert billing["e2e_processing_latency"]["count"] == 1

        (c,) = billing["clients"]
        identity = {"client_id": "consumer-1", "hostname": "conshost", "version": "V2"}
        assert fields(c, *identity) == identity
        assert c["remote_address"].startswith("127.0.0.1:")
        counts = {"state": 3, "ready_count": 3, "in_flight_count": 2, "message_count": 4, "finish_count": 1,
                  "requeue_count": 1}
        assert fields(c, *counts) == counts
        assert abs(c["connect_ts"] - time.time()) < 60
        assert c["sample_rate"] == 0
        assert c["deflate"] is False and c["snappy"] is False and c["tls"] is False
        assert c["user_agent"] == "test-consumer/2.0"
        assert "pub_counts" not in c and "authed" not in c and "auth_identity" not in c

        (p,) = stats["producers"]
        assert p["client_id"] == "producer-1"
        assert p["user_agent"] == "test-producer/1.0"
        assert p["state"] == 0
        assert p["pub_counts"] == [{"topic": "orders", "count": 4}]

        assert set(stats["memory"]) == {"heap_objects", "heap_idle_bytes", "heap_in_use_bytes",
                                        "heap_released_bytes", "gc_pause_usec_100", "gc_pause_usec_99",
                                        "gc_pause_usec_95", "next_gc_bytes", "gc_total_runs"}
        assert stats["memory"]["heap_in_use_bytes"] > 0
        await producer.aclose()
        await consumer.aclose()


async def test_stats_filters(start_daemon):
    async with start_daemon() as d:
        producer, consumer = await traffic(d)
        await request(d.addresses.http, "POST", "/topic/create?topic=zeta")

        stats = await get_json(d, "/stats?format=json&topic=orders")
        assert [t["topic_name"] for t in stats["topics"]] == ["orders"]
        assert stats["producers"][0]["pub_counts"] == [{"topic": "orders", "count": 4}]

        stats = await get_json(d, "/stats?format=json&topic=zeta")
        assert stats["topics"][0]["channels"] == []
        assert "pub_counts" not in stats["producers"][0]  # its only topic is filtered out

        stats = await get_json(d, "/stats?format=json&topic=orders&channel=billing")
        assert [c["channel_name"] for c in stats["topics"][0]["channels"]] == ["billing"]

        stats = await get_json(d, "/stats?format=json&channel=audit")
        assert [t["topic_name"] for t in stats["topics"]] == ["orders"]  # zeta has no such channel

        stats = await get_json(d, "/stats?format=json&topic=nope")
        assert stats["topics"] is None and stats["producers"] is None

        stats = await get_json(d, "/stats?format=json&channel=nope")
        assert stats["topics"] == []

        stats = await get_json(d, "/stats?format=json&include_clients=false")
        billing = stats["topics"][0]["channels"][1]
        assert billing["clients"] is None and billing["client_count"] == 1
        assert stats["producers"] is None

        for value in ("0", "false"):
            stats = await get_json(d, f"/stats?format=json&include_mem={value}")
            assert "memory" not in stats
        for value in ("1", "true", "yes", ""):
            stats = await get_json(d, f"/stats?format=json&include_mem={value}&include_clients={value}")
            assert "memory" in stats and stats["producers"] is not None

        reply = await request(d.addresses.http, "GET", "/stats?format=json&topic=%zz")
        assert (reply.status, reply.body) == (400, b'{"message":"INVALID_REQUEST"}')
        await producer.aclose()
        await consumer.aclose()


async def test_stats_text_format(start_daemon):
    async with start_daemon(PERCENTILES) as d:
        producer, consumer = await traffic(d)
        for target in ("/stats", "/stats?format=text", "/stats?format=anything"):
            reply = await request(d.addresses.http, "GET", target)
            assert reply.status == 200
            assert reply.headers["content-type"] == "text/plain; charset=utf-8"
            text = reply.text
            assert text.startswith("nsqd v1.3.0 (built w/")
            assert "\nHealth: OK\n" in text
            assert "\nMemory:\n   heap_objects" in text
            assert "\nTopics:\n   [orders         ] depth: 0     be-depth: 0     msgs: 4        e2e%: " in text
            assert "   *P [audit                    ] depth: 3     be-depth: 0     inflt: 0    def: 1 " in text
            assert "      [billing                  ] depth: 0     be-depth: 0     inflt: 2    def: 1    re-q: 1 " in text
            assert "        [V2 conshost:" in text and "test-consumer/2.0" in text
            assert "state: 3 inflt: 2    rdy: 3    fin: 1        re-q: 1        msgs: 4 " in text
            assert "\nProducers:\n   [V2 prodhost:" in text and "msgs: 4        topics: orders=4 connected: " in text
        reply = await request(d.addresses.http, "GET", "/stats?include_mem=false&include_clients=false")
        assert "Memory:" not in reply.text and "Producers: None" in reply.text
        reply = await request(d.addresses.http, "GET", "/stats?topic=nope")
        assert "\nTopics: None\n\nProducers: None\n" in reply.text
        await producer.aclose()
        await consumer.aclose()


async def test_stats_and_metrics_agree(start_daemon):
    async with start_daemon(PERCENTILES) as d:
        producer, consumer = await traffic(d)
        stats = await get_json(d, "/stats?format=json")
        reply = await request(d.addresses.http, "GET", "/metrics")
        assert reply.status == 200
        assert reply.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        metrics = metric_samples(reply.text)

        for t in stats["topics"]:
            key = (("topic", t["topic_name"]),)
            assert metrics[("nsq_topic_depth", key)] == t["depth"]
            assert metrics[("nsq_topic_backend_depth", key)] == t["backend_depth"]
            assert metrics[("nsq_topic_message_count", key)] == t["message_count"]
            assert metrics[("nsq_topic_message_bytes", key)] == t["message_bytes"]
            assert metrics[("nsq_topic_channel_count", key)] == len(t["channels"])
            assert metrics[("nsq_topic_paused", key)] == int(t["paused"])
            p99 = t["e2e_processing_latency"]["percentiles"][0]["value"]
            assert metrics[("nsq_topic_e2e_processing_latency_99", key)] == p99
            for c in t["channels"]:
                key = (("channel", c["channel_name"]), ("topic", t["topic_name"]))
                for field, names in {
                    "depth": ["nsq_topic_channel_depth", "nsq_channel_depth"],
                    "backend_depth": ["nsq_topic_channel_backend_depth", "nsq_channel_backend_depth"],
                    "in_flight_count": ["nsq_topic_channel_in_flight_count", "nsq_channel_in_flight_count",
                                        "nsq_channel_inflight_count"],
                    "deferred_count": ["nsq_topic_channel_deferred_count", "nsq_channel_deferred_count"],
                    "message_count": ["nsq_topic_channel_message_count", "nsq_channel_message_count"],
                    "requeue_count": ["nsq_topic_channel_requeue_count", "nsq_channel_requeue_count"],
                    "timeout_count": ["nsq_topic_channel_timeout_count", "nsq_channel_timeout_count"],
                    "client_count": ["nsq_topic_channel_clients", "nsq_channel_client_count"],
                }.items():
                    for name in names:
                        assert metrics[(name, key)] == c[field], (name, key)
                percentiles = c["e2e_processing_latency"]["percentiles"]
                assert metrics[("nsq_topic_channel_e2e_processing_latency_99", key)] == percentiles[0]["value"]
                assert metrics[("nsq_topic_channel_e2e_processing_latency_95", key)] == percentiles[1]["value"]
                for client in c["clients"]:
                    labels = dict(key)
                    labels.update(client_id=client["client_id"], hostname=client["hostname"], version="V2",
                                  remote_address=client["remote_address"], deflate="false", snappy="false",
                                  tls="false")
                    ckey = tuple(sorted(labels.items()))
                    assert metrics[("nsq_client_ready_count", ckey)] == client["ready_count"]
                    assert metrics[("nsq_client_in_flight_count", ckey)] == client["in_flight_count"]
                    assert metrics[("nsq_client_finish_count", ckey)] == client["finish_count"]
        assert metrics[("nsq_server_topic_count", ())] == len(stats["topics"])
        assert metrics[("nsq_mem_gc_runs", ())] >= stats["memory"]["gc_total_runs"]
        await producer.aclose()
        await consumer.aclose()


async def test_metrics_without_percentiles_has_no_latency_gauges(daemon):
    await request(daemon.addresses.http, "POST", "/pub?topic=t", b"x")
    text = (await request(daemon.addresses.http, "GET", "/metrics")).text
    assert 'nsq_topic_message_count{topic="t"} 1.0' in text
    assert "nsq_topic_e2e_processing_latency_99" not in text
    stats = await get_json(daemon, "/stats?format=json")
    assert stats["topics"][0]["e2e_processing_latency"] == {"count": 0, "percentiles": None}


@pytest.mark.parametrize("target", ["/stats?format=json", "/metrics"])
async def test_stats_of_many_topics(daemon, target):
    for i in range(50):
        await request(daemon.addresses.http, "POST", f"/topic/create?topic=t{i:02d}")
    reply = await request(daemon.addresses.http, "GET", target)
    assert reply.status == 200
    if target.startswith("/stats"):
        assert [t["topic_name"] for t in reply.json()["topics"]] == [f"t{i:02d}" for i in range(50)]


async def test_fin_latency_histogram_counts_every_fin(daemon):
    await request(daemon.addresses.http, "POST", "/topic/create?topic=t")
    await request(daemon.addresses.http, "POST", "/channel/create?topic=t&channel=c")
    assert (await request(daemon.addresses.http, "POST", "/mpub?topic=t", b"a\nb\nc\nd\ne")).status == 200
    consumer = await subscriber(daemon, "t", "c", rdy=5)
    for msg in await consumer.read_messages(5):
        await consumer.send(encode_fin(msg.id))
    channel = daemon.broker.topics["t"].channels["c"]
    await wait_for(lambda: channel.e2e.count == 5)
    text = (await request(daemon.addresses.http, "GET", "/metrics")).text
    values = metric_samples(text)
    key = (("channel", "c"), ("topic", "t"))
    assert values[("nsq_topic_channel_e2e_processing_latency_seconds_count", key)] == 5
    assert values[("nsq_topic_channel_e2e_processing_latency_seconds_bucket", (key[0], ("le", "+Inf"), key[1]))] == 5
    assert 0 < values[("nsq_topic_channel_e2e_processing_latency_seconds_sum", key)] < 60
    await consumer.aclose()
