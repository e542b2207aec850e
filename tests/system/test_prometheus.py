"""A real Prometheus server scrapes a real pynsqd process on loopback; the dashboard
series are then read back through Prometheus's HTTP API.

Needs the ``prometheus`` binary (Debian package ``prometheus``; CI installs it).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import urllib.parse

import pytest

from broker.protocol import encode_fin
from tests.support.http_client import request
from tests.support.paths import DEPLOY
from tests.support.processes import stop_process
from tests.support.snapshots import MIXIN_NAMES
from tests.support.v2client import subscriber
from tests.support.waiting import wait_until

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(PROMETHEUS is None, reason="the prometheus binary is not installed"),
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def query(address, expr: str) -> list[dict]:
    reply = await request(address, "GET", "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert reply.status == 200, reply
    document = json.loads(reply.body)
    assert document["status"] == "success", document
    return document["data"]["result"]


async def generate_traffic(broker) -> None:
    """HTTP publishes to two topics, a TCP consumer that finishes everything on one channel."""
    for i in range(20):
        reply = await request(broker.http, "POST", "/pub?topic=orders", b"order %d" % i)
        assert reply.status == 200
    assert (await request(broker.http, "POST", "/mpub?topic=audit", b"a\nb\nc")).status == 200
    assert (await request(broker.http, "POST", "/channel/create?topic=audit&channel=archive")).status == 200
    consumer = await subscriber(broker, "orders", "billing", rdy=20)
    for msg in await consumer.read_messages(20):
        await consumer.send(encode_fin(msg.id))
    await consumer.aclose()


async def test_prometheus_scrapes_the_dashboard_series(broker_process, tmp_path):
    broker = broker_process("--e2e-processing-latency-percentile=0.99,0.95")
    await generate_traffic(broker)

    shutil.copy(DEPLOY / "alerts.yml", tmp_path / "alerts.yml")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "rule_files:\n  - alerts.yml\n"
        "scrape_configs:\n  - job_name: pynsqd\n    metrics_path: /metrics\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{broker.http[1]}']\n"
    )
    port = free_port()
    address = ("127.0.0.1", port)
    log = open(tmp_path / "prometheus.log", "wb")
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=log, stdin=subprocess.DEVNULL,
    )
    try:
        async def scraped() -> bool:
            """Prometheus is up, has scraped pynsqd and holds its series."""
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                result = await query(address, 'up{job="pynsqd"}')
                return bool(result and result[0]["value"][1] == "1"
                            and await query(address, "nsq_topic_channel_message_count"))
            except OSError:  # not listening yet
                return False

        await wait_until(scraped, timeout=60, poll=0.2)

        for name in MIXIN_NAMES:
            assert await query(address, name), f"{name} was not scraped"

        def by_labels(result):
            return {tuple(sorted((k, v) for k, v in r["metric"].items() if k in ("topic", "channel"))):
                    float(r["value"][1]) for r in result}

        assert by_labels(await query(address, "nsq_topic_message_count")) == {
            (("topic", "audit"),): 3.0, (("topic", "orders"),): 20.0}
        assert by_labels(await query(address, "nsq_topic_message_bytes")) == {
            (("topic", "audit"),): 3.0, (("topic", "orders"),): sum(len(b"order %d" % i) for i in range(20))}
        billing = (("channel", "billing"), ("topic", "orders"))
        archive = (("channel", "archive"), ("topic", "audit"))
        assert by_labels(await query(address, "nsq_topic_channel_message_count"))[billing] == 20.0
        assert by_labels(await query(address, "nsq_topic_channel_depth"))[archive] == 3.0
        assert by_labels(await query(address, "nsq_topic_channel_in_flight_count"))[billing] == 0.0
        assert by_labels(await query(address, "nsq_topic_channel_e2e_processing_latency_99"))[billing] > 0
        counts = await query(address, "nsq_topic_channel_e2e_processing_latency_seconds_count")
        assert by_labels(counts)[billing] == 20.0
        p99 = await query(address, "histogram_quantile(0.99, nsq_topic_channel_e2e_processing_latency_seconds_bucket)")
        assert 0 < by_labels(p99)[billing] <= 60
        # the alert expressions and the dashboards' aggregations evaluate
        assert await query(address, "sum by (topic)(nsq_topic_depth)")
        assert await query(address, "sum by (topic)(nsq_topic_channel_backend_depth)")
        assert await query(address, "rate(nsq_topic_message_count[1m])") is not None
        reply = await request(address, "GET", "/api/v1/label/job/values?match[]=nsq_topic_message_count")
        assert json.loads(reply.body)["data"] == ["pynsqd"]
        reply = await request(address, "GET", "/api/v1/rules")
        groups = json.loads(reply.body)["data"]["groups"]
        assert {rule["name"] for rule in groups[0]["rules"]} >= {"NsqTopicDepthIncreasing",
                                                                 "NsqChannelDepthIncreasing", "NsqUnhealthy"}
        assert all(rule["health"] != "err" for rule in groups[0]["rules"])
    finally:
        stop_process(proc, 10)
        log.close()


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed")
def test_deploy_files_are_valid():
    for args in (["check", "config", str(DEPLOY / "prometheus.yml")], ["check", "rules", str(DEPLOY / "alerts.yml")]):
        result = subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr


def test_grafana_dashboard_queries_exposed_series():
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    assert exprs
    names = set(MIXIN_NAMES) | {"nsq_topic_channel_e2e_processing_latency_seconds_bucket", "nsq_server_healthy",
                                "nsq_topic_channel_buried_count", "up", "process_resident_memory_bytes",
                                "process_cpu_seconds_total"}
    for expr in exprs:
        used = {token for token in _identifiers(expr) if token.startswith(("nsq_", "process_"))}
        assert used <= names, (expr, used - names)


def test_grafana_dashboard_shows_buried_messages_per_channel():
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    panel = next(p for p in dashboard["panels"] if p["title"] == "Buried messages (dead letters)")
    (target,) = panel["targets"]
    assert target["expr"].startswith("sum by (topic, channel) (nsq_topic_channel_buried_count{")
    assert target["legendFormat"] == "{{topic}}/{{channel}}"


def _identifiers(expr: str) -> set[str]:
    import re

    return set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr))


_BURIED_RULES_TEST = """
rule_files:
  - {rules}
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'nsq_topic_channel_buried_count{{job="pynsqd", instance="mq1:4151", topic="orders", channel="billing"}}'
        values: '0 3x10'
      - series: 'nsq_topic_channel_buried_count{{job="pynsqd", instance="mq1:4151", topic="orders", channel="audit"}}'
        values: '0x10'
    alert_rule_test:
      - eval_time: 4m
        alertname: NsqMessagesBuried
        exp_alerts: []
      - eval_time: 8m
        alertname: NsqMessagesBuried
        exp_alerts:
          - exp_labels:
              severity: warning
              job: pynsqd
              instance: mq1:4151
              topic: orders
              channel: billing
            exp_annotations:
              summary: Dead letters in orders/billing.
              description: >-
                Channel billing of topic orders on mq1:4151 holds 3 buried messages: they
                reached the channel's max attempts and wait for an operator. Look at them
                with GET /channel/peek?topic=orders&channel=billing&state=buried, then send
                them back with POST /channel/kick?topic=orders&channel=billing or drop them
                with POST /channel/delete_buried.
"""


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed")
def test_buried_messages_alert_names_the_channel_and_how_to_act(tmp_path):
    """A channel with buried messages for 5 minutes fires NsqMessagesBuried; one without does not."""
    tests = tmp_path / "buried_test.yml"
    tests.write_text(_BURIED_RULES_TEST.format(rules=DEPLOY / "alerts.yml"))
    result = subprocess.run([PROMTOOL, "test", "rules", str(tests)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


_REPLICATION_RULES_TEST = """
rule_files:
  - {rules}
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'nsq_replication_log_records_lost{{job="pynsqd", instance="mq1:4151"}}'
        values: '0 0 2x10'
      - series: 'nsq_replication_copies_lost{{job="pynsqd", instance="mq1:4151"}}'
        values: '0x12'
      - series: 'nsq_replication_handshakes_refused{{job="pynsqd", instance="mq2:4151"}}'
        values: '0 0 0 1x10'
    alert_rule_test:
      - eval_time: 1m
        alertname: NsqReplicationLogDamaged
        exp_alerts: []
      - eval_time: 3m
        alertname: NsqReplicationLogDamaged
        exp_alerts:
          - exp_labels: {{severity: critical, job: pynsqd, instance: "mq1:4151"}}
            exp_annotations:
              summary: Replication log damaged on mq1:4151.
              description: >-
                mq1:4151 could not read back part of its replication log (the copies
                it holds of other nodes' messages): those messages have fewer copies than
                --replicas, and a message whose other holders are lost too is lost. Check the disk
                of its data directory; its log says which records and copies.
      - eval_time: 2m
        alertname: NsqReplicationPeerRefused
        exp_alerts: []
      - eval_time: 5m
        alertname: NsqReplicationPeerRefused
        exp_alerts:
          - exp_labels: {{severity: warning, job: pynsqd, instance: "mq2:4151"}}
            exp_annotations:
              summary: A node of the cluster and mq2:4151 do not accept each other.
              description: >-
                A connection to or from mq2:4151 said it was a node of the
                replication cluster and did not prove it holds the cluster's secret, or its TLS
                certificate did not verify. Either a node has another --replication-secret-file
                or certificate, or something that is not a node tried to pass for one. Its log
                names the address.
"""


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed")
def test_replication_alerts_fire_on_a_damaged_log_and_a_refused_peer(tmp_path):
    """A replication log that lost records fires NsqReplicationLogDamaged at once; a refused
    handshake fires NsqReplicationPeerRefused; neither fires before."""
    tests = tmp_path / "replication_test.yml"
    tests.write_text(_REPLICATION_RULES_TEST.format(rules=DEPLOY / "alerts.yml"))
    result = subprocess.run([PROMTOOL, "test", "rules", str(tests)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


_COPIES_MISSING_RULES_TEST = """
rule_files:
  - {rules}
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'nsq_replication_copies_missing{{job="pynsqd", instance="mq1:4151"}}'
        values: '0 0 20x15'
      - series: 'nsq_replication_copies_missing{{job="pynsqd", instance="mq2:4151"}}'
        values: '0 500x8 0x8'
    alert_rule_test:
      - eval_time: 11m
        alertname: NsqReplicationCopiesMissing
        exp_alerts: []
      - eval_time: 13m
        alertname: NsqReplicationCopiesMissing
        exp_alerts:
          - exp_labels: {{severity: critical, job: pynsqd, instance: "mq1:4151"}}
            exp_annotations:
              summary: Messages of mq1:4151 have fewer copies than --replicas.
              description: >-
                A node that held copies of mq1:4151's messages is gone, and
                20 copies have not been made again on another node for 10 minutes:
                losing one more node may lose those messages. Usually no other node can take
                them (too few nodes up for --replicas): start one. Its log says which topics.
"""


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed")
def test_copies_missing_alert_fires_only_when_they_stay_missing(tmp_path):
    """Copies missing for 10 minutes fire NsqReplicationCopiesMissing; copies made again
    within that time (mq2) fire nothing."""
    tests = tmp_path / "copies_missing_test.yml"
    tests.write_text(_COPIES_MISSING_RULES_TEST.format(rules=DEPLOY / "alerts.yml"))
    result = subprocess.run([PROMTOOL, "test", "rules", str(tests)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
