"""The Spark connector finds its nsqd nodes through nsqlookupd (option ``lookupd``).

One real nsqlookupd and two pynsqd processes registered with it; the connector is given
only the lookupd's HTTP address.
"""

from __future__ import annotations

import json
import urllib.request
from collections import Counter

import pytest

from tests.support.nsq_programs import NsqProgram, nsq_bin_missing
from tests.support.processes import BrokerProcess
from tests.support.waiting import wait_sync
from tests.system.test_spark import DEADLINE_S, create_channel, publish, spark  # noqa: F401  (spark is a fixture)

pytestmark = [pytest.mark.spark, pytest.mark.slow,
              pytest.mark.skipif(nsq_bin_missing() is not None, reason=nsq_bin_missing() or "")]


@pytest.fixture(scope="module")
def lookupd(tmp_path_factory):
    program = NsqProgram("nsqlookupd", tmp_path_factory.mktemp("lookupd") / "lookupd.log",
                         "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                         "--broadcast-address=127.0.0.1").start()
    yield program
    program.kill()


@pytest.fixture(scope="module")
def nodes(lookupd, tmp_path_factory):
    root = tmp_path_factory.mktemp("nodes")
    started = []
    try:
        for n in range(2):
            started.append(BrokerProcess(root / f"node{n}", f"--lookupd-tcp-address={lookupd.address('TCP')}",
                                         "--broadcast-address=127.0.0.1", f"--node-id={200 + n}",
                                         log_path=root / f"node{n}.log").start())
        yield started
    finally:
        for node in started:
            node.kill()


def topic_message_count(node: BrokerProcess, topic: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{node.http[1]}/stats?format=json&topic={topic}", timeout=10) as r:
        topics = json.loads(r.read())["topics"]
    return topics[0]["message_count"] if topics else 0


def node_address(node: BrokerProcess) -> str:
    return f"127.0.0.1:{node.tcp[1]}"


def test_batch_read_drains_every_producer_lookupd_lists(spark, lookupd, nodes):  # noqa: F811
    for n, node in enumerate(nodes):
        create_channel(node, "found", "spark")
        publish(node, "found", [f"node{n}-{i}".encode() for i in range(5)])
    rows = (spark.read.format("nsq").option("lookupd", lookupd.address("HTTP"))
            .option("topic", "found").option("channel", "spark").load().collect())
    assert Counter(bytes(row.body).decode() for row in rows) == Counter(
        f"node{n}-{i}" for n in range(2) for i in range(5))
    assert {row.nsqd for row in rows} == {node_address(node) for node in nodes}


def test_batch_read_of_a_topic_no_node_has_is_empty(spark, lookupd, nodes):  # noqa: F811
    frame = (spark.read.format("nsq").option("lookupd", lookupd.address("HTTP"))
             .option("topic", "nowhere").option("channel", "spark").load())
    assert frame.count() == 0


def test_writer_publishes_to_the_registered_nodes(spark, lookupd, nodes):  # noqa: F811
    bodies = [f"row-{i}" for i in range(40)]
    (spark.createDataFrame([(b,) for b in bodies], "body string").repartition(4)
     .write.format("nsq").mode("append").option("lookupd", lookupd.address("HTTP")).option("topic", "written")
     .save())
    counts = [topic_message_count(node, "written") for node in nodes]
    assert sum(counts) == len(bodies) and all(counts), counts  # the tasks spread over both nodes
    rows = (spark.read.format("nsq").option("lookupd", lookupd.address("HTTP"))
            .option("topic", "written").option("channel", "check").load().collect())
    assert Counter(bytes(row.body).decode() for row in rows) == Counter(bodies)


def test_lookupd_and_nsqd_together_are_refused(spark, lookupd, nodes):  # noqa: F811
    with pytest.raises(Exception, match="option 'lookupd' cannot be given with 'nsqd'"):
        (spark.read.format("nsq").option("lookupd", lookupd.address("HTTP")).option("nsqd", node_address(nodes[0]))
         .option("topic", "t").option("channel", "c").load())


def test_the_stream_subscribes_to_a_node_that_starts_producing_while_it_runs(spark, lookupd, nodes, tmp_path):  # noqa: F811
    first, second = nodes
    create_channel(first, "grow", "spark")
    publish(first, "grow", [b"first-0", b"first-1"])
    query = (spark.readStream.format("nsq").option("lookupd", lookupd.address("HTTP"))
             .option("topic", "grow").option("channel", "spark").load()
             .select("body").writeStream.format("memory").queryName("grown")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(processingTime="500 milliseconds").start())
    try:
        def seen() -> Counter:
            return Counter(bytes(row.body).decode() for row in spark.sql("select body from grown").collect())

        # Spark's micro-batches are observable only by polling the sink
        wait_sync(lambda: seen() == Counter(["first-0", "first-1"]), DEADLINE_S, poll=0.2, report=lambda: str(seen()))
        # the second node has the topic only now; lookupd learns it, the source then subscribes
        create_channel(second, "grow", "spark")
        publish(second, "grow", [b"second-0"])
        wait_sync(lambda: "second-0" in seen(), DEADLINE_S, poll=0.2, report=lambda: str(seen()))
        assert seen() == Counter(["first-0", "first-1", "second-0"])
    finally:
        query.stop()
