"""The nsq Spark data source against a real pynsqd process and a local[2] Spark session.

One broker process and one Spark session serve the whole module. Messages are
published and checked with the plain V2 test client, not with the connector, so
that what the connector reads and writes is checked by an independent peer.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import trio

from broker.protocol import (
    FRAME_TYPE_MESSAGE,
    decode_message,
    encode_cls,
    encode_fin,
    encode_nop,
    encode_rdy,
    encode_req,
    encode_sub,
)
from pyspark_nsq import SOURCE_SCHEMA, NsqDataSource
from tests.support.http_client import create_channel as http_create_channel
from tests.support.http_client import request
from tests.support.paths import REPO, nsq_bin
from tests.support.processes import BrokerProcess
from tests.support.spark_queries import start_copy
from tests.support.v2client import connect, publish_batch
from tests.support.waiting import wait_sync
from tests.support.wiretap import wiretap

pytestmark = [pytest.mark.spark, pytest.mark.slow]

#: What the Python workers Spark starts need on their path to import the connector.
WORKER_PATH = os.pathsep.join([str(REPO), str(REPO / "spark")])
#: Upper bound for anything a test waits for (Spark's first batch alone takes seconds).
DEADLINE_S = 120


@pytest.fixture(scope="module")
def nsqd(tmp_path_factory):
    """One pynsqd process (python -m broker) for the module."""
    broker = BrokerProcess(tmp_path_factory.mktemp("nsqd") / "data").start()
    try:
        yield broker
    finally:
        try:
            broker.terminate()
        except subprocess.TimeoutExpired:
            broker.kill()


@pytest.fixture(scope="module")
def real_nsqd(tmp_path_factory):
    """nsq 1.3.0's own nsqd, which has no lease extension."""
    programs = nsq_bin()
    if programs is None:
        pytest.skip("nsq 1.3.0's nsqd not found (set NSQ_BIN or provide ../shared/nsq/bin)")
    broker = BrokerProcess(tmp_path_factory.mktemp("real_nsqd") / "data",
                           program=[str(programs / "nsqd")]).start()
    yield broker
    broker.kill()


@pytest.fixture(scope="module")
def spark():
    """One local[2] session; its workers import the connector from this checkout."""
    from pyspark.sql import SparkSession

    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPARK_LOCAL_IP", "127.0.0.1")
        env.setenv("PYSPARK_PYTHON", sys.executable)
        env.setenv("PYTHONPATH", os.pathsep.join(filter(None, [WORKER_PATH,
                                                               os.environ.get("PYTHONPATH")])))
        session = (
            SparkSession.builder.master("local[2]")
            .appName("test_spark")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate()
        )
        session.sparkContext.setLogLevel("ERROR")
        try:
            yield session
        finally:
            session.stop()


def address(broker: BrokerProcess) -> str:
    host, port = broker.tcp
    return f"{host}:{port}"


def create_channel(broker: BrokerProcess, topic: str, channel: str) -> None:
    """Create ``topic`` and ``channel`` over HTTP, so the channel gets every later message."""
    trio.run(http_create_channel, broker.http, topic, channel)


def publish(broker: BrokerProcess, topic: str, bodies: list[bytes]) -> None:
    """MPUB ``bodies`` in chunks with the plain test client."""
    trio.run(lambda: publish_batch(broker, topic, *bodies, per_mpub=1000))


def consume(broker: BrokerProcess, topic: str, channel: str, *, expect: int,
            linger: float | None = None, timeout: float = DEADLINE_S) -> list[bytes]:
    """FIN and return bodies until ``expect`` arrived (or ``timeout``), then look for duplicates.

    With ``linger=None`` (for a producer that has finished) it reads on until the broker's
    channel holds nothing more; with a number of seconds (for a producer that still runs) it
    reads on that long; with 0 it stops at once.
    On the way out every message still in flight to this consumer is REQ'd, so the
    next consumer gets it at once rather than after msg_timeout.
    """

    async def receive(client, bodies):
        frame = await client.read_frame(skip_heartbeats=False)
        if frame.frame_type == FRAME_TYPE_MESSAGE:
            message = decode_message(frame.data)
            bodies.append(message.body)
            await client.send(encode_fin(message.id))
        elif frame.data == b"_heartbeat_":
            await client.send(encode_nop())
        else:
            raise AssertionError(f"unexpected frame {frame}")

    async def channel_is_empty() -> bool:
        reply = await request(broker.http, "GET", f"/stats?format=json&topic={topic}&channel={channel}")
        (stats,) = reply.json()["topics"][0]["channels"]
        return (stats["depth"], stats["in_flight_count"], stats["deferred_count"]) == (0, 0, 0)

    async def run():
        client = await connect(broker.tcp, timeout=timeout)
        await client.identify(msg_timeout=60000)
        await client.send(encode_sub(topic, channel))
        await client.expect_response()
        await client.send(encode_rdy(2500))
        bodies = []
        with trio.move_on_after(timeout):
            while len(bodies) < expect:
                await receive(client, bodies)
        if linger is None:
            with trio.fail_after(timeout):
                while True:
                    # Every FIN sent before a barrier is applied once it is answered.
                    arrived = await client.sync()
                    for message in arrived:
                        await client.send(encode_fin(message.id))
                    bodies += [message.body for message in arrived]
                    if not arrived and await channel_is_empty():
                        break
        elif linger:
            with trio.move_on_after(linger):
                while True:
                    await receive(client, bodies)
        await client.send(encode_rdy(0) + encode_cls())
        while (frame := await client.read_frame()).data != b"CLOSE_WAIT":
            if frame.frame_type == FRAME_TYPE_MESSAGE:
                await client.send(encode_req(decode_message(frame.data).id, 0))
        await client.aclose()
        return bodies

    return trio.run(run)


def bodies_of(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}-{index:06d}".encode() for index in range(count)]


# -- registration and options -------------------------------------------------


def test_format_nsq_is_found_without_registration(spark, nsqd):
    # Spark registers DefaultSource of every importable pyspark_<name> module.
    frame = (spark.read.format("nsq").option("nsqd", address(nsqd)).option("topic", "t")
             .option("channel", "c").load())
    assert frame.schema == SOURCE_SCHEMA


def test_explicit_registration(spark):
    spark.dataSource.register(NsqDataSource)
    assert NsqDataSource.name() == "nsq"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topic": "t", "channel": "c"}, "option 'nsqd' is required"),
        ({"nsqd": "NSQD", "channel": "c"}, "option 'topic' is required"),
        ({"nsqd": "NSQD", "topic": "t"}, "option 'channel' is required"),
        ({"nsqd": "localhost", "topic": "t", "channel": "c"}, "option 'nsqd' must be a comma"),
        ({"nsqd": "NSQD", "topic": "t", "channel": "c", "maxMesagesPerTrigger": "5"},
         "option 'maxmesagespertrigger' is unknown"),
        ({"nsqd": "NSQD", "topic": "t", "channel": "c", "msgTimeoutMs": "10"},
         "option 'msgTimeoutMs' must be an integer in 1000..900000"),
    ],
)
def test_bad_read_options_fail_at_load(spark, nsqd, options, message):
    reader = spark.readStream.format("nsq")
    for key, value in options.items():
        reader = reader.option(key, value.replace("NSQD", address(nsqd)))
    with pytest.raises(Exception, match=message):
        reader.load()


def test_option_of_the_other_reader_fails_when_the_query_starts(spark, nsqd):
    query = (spark.readStream.format("nsq").option("nsqd", address(nsqd)).option("topic", "t")
             .option("channel", "c").option("maxMessages", "5").load()
             .writeStream.format("noop").start())
    with pytest.raises(Exception, match="option 'maxmessages' is unknown to the streaming source"):
        query.awaitTermination(DEADLINE_S)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"nsqd": "NSQD"}, "option 'topic' is required when the DataFrame has no 'topic' column"),
        ({"topic": "t"}, "option 'nsqd' is required"),
        ({"nsqd": "NSQD", "topic": "t", "channel": "c"}, "option 'channel' is unknown to the writer"),
        ({"nsqd": "NSQD", "topic": "t", "batchSize": "0"}, "option 'batchSize' must be an integer"),
        ({"nsqd": "NSQD", "topic": "no spaces"}, "option 'topic' has an invalid name"),
    ],
)
def test_bad_write_options_fail_before_writing(spark, nsqd, options, message):
    writer = spark.createDataFrame([("x",)], "body string").write.format("nsq").mode("append")
    for key, value in options.items():
        writer = writer.option(key, value.replace("NSQD", address(nsqd)))
    with pytest.raises(Exception, match=message):
        writer.save()


def test_writing_without_a_body_column_fails(spark, nsqd):
    frame = spark.createDataFrame([("x",)], "value string")
    with pytest.raises(Exception, match="needs a 'body' column"):
        frame.write.format("nsq").option("nsqd", address(nsqd)).option("topic", "t") \
            .mode("append").save()


def test_unreachable_nsqd_fails_the_write(spark):
    frame = spark.createDataFrame([("x",)], "body string")
    with pytest.raises(Exception, match="E_CONNECTION cannot connect"):
        frame.write.format("nsq").option("nsqd", "127.0.0.1:1").option("topic", "t") \
            .mode("append").save()


# -- batch --------------------------------------------------------------------


def test_batch_write_then_batch_read(spark, nsqd):
    count = 3000
    expected = bodies_of("batch", count)
    frame = spark.createDataFrame([(body.decode(),) for body in expected], "body string")
    frame.repartition(3).write.format("nsq").option("nsqd", address(nsqd)) \
        .option("topic", "batch_rw").option("batchSize", "400").mode("append").save()

    read = (spark.read.format("nsq").option("nsqd", address(nsqd)).option("topic", "batch_rw")
            .option("channel", "reader").option("maxMessages", str(count + 100))
            .option("drainTimeoutMs", "500").load().cache())
    rows = read.collect()
    assert sorted(row.body for row in rows) == expected
    assert {(row.topic, row.nsqd, row.attempts) for row in rows} == {
        ("batch_rw", address(nsqd), 1)}
    assert len({row.id for row in rows}) == count
    assert all(row.timestamp is not None for row in rows)

    # Everything read was FIN'd: the channel is empty now.
    again = (spark.read.format("nsq").option("nsqd", address(nsqd)).option("topic", "batch_rw")
             .option("channel", "reader").option("drainTimeoutMs", "500").load())
    assert again.count() == 0


def test_batch_read_stops_at_max_messages_and_leaves_the_rest(spark, nsqd):
    publish(nsqd, "bounded", bodies_of("bounded", 50))
    read = (spark.read.format("nsq").option("nsqd", address(nsqd)).option("topic", "bounded")
            .option("channel", "c").option("maxMessages", "20").option("drainTimeoutMs", "500")
            .load())
    first = [row.body for row in read.collect()]
    assert len(first) == 20
    rest = consume(nsqd, "bounded", "c", expect=30)
    assert sorted(first + rest) == bodies_of("bounded", 50)


def test_topic_column_routes_rows(spark, nsqd):
    for topic in ("route_a", "route_b"):
        create_channel(nsqd, topic, "check")
    rows = [("route_a" if i % 3 else "route_b", f"r{i}") for i in range(30)]
    spark.createDataFrame(rows, "topic string, body string").write.format("nsq") \
        .option("nsqd", address(nsqd)).mode("append").save()
    got_a = consume(nsqd, "route_a", "check", expect=20)
    got_b = consume(nsqd, "route_b", "check", expect=10)
    assert sorted(got_a) == sorted(f"r{i}".encode() for i in range(30) if i % 3)
    assert sorted(got_b) == sorted(f"r{i}".encode() for i in range(30) if not i % 3)


def test_defer_delays_delivery(spark, nsqd):
    create_channel(nsqd, "deferred", "check")
    started = time.monotonic()
    spark.createDataFrame([(b"later",)], "body binary").write.format("nsq") \
        .option("nsqd", address(nsqd)).option("topic", "deferred").option("defer", "1500") \
        .mode("append").save()
    assert consume(nsqd, "deferred", "check", expect=1, linger=0) == [b"later"]
    assert time.monotonic() - started >= 1.5


# -- streaming ----------------------------------------------------------------


def start_pipeline(spark, nsqd, source: str, sink: str, checkpoint: Path, *, trigger: dict,
                   **source_options):
    """Copy topic ``source`` (read on channel ``spark``) to ``sink`` with a streaming query."""
    return start_copy(spark, address(nsqd), source, sink, str(checkpoint), channel="spark", trigger=trigger,
                      **source_options)


def copy_backlog_available_now(spark, nsqd, prefix: str, count: int, checkpoint: Path,
                               max_per_trigger: int) -> tuple[list[bytes], object]:
    """Publish ``count`` bodies to ``<prefix>_in`` and copy them to ``<prefix>_out`` (which has a
    channel ``check``) with an ``availableNow`` query; asserts that the query ends without an
    error. Returns the bodies published and the finished query."""
    expected = bodies_of(prefix, count)
    create_channel(nsqd, f"{prefix}_out", "check")
    publish(nsqd, f"{prefix}_in", expected)
    query = start_pipeline(spark, nsqd, f"{prefix}_in", f"{prefix}_out", checkpoint,
                           trigger={"availableNow": True}, maxMessagesPerTrigger=str(max_per_trigger),
                           drainTimeoutMs="500")
    assert query.awaitTermination(DEADLINE_S)
    assert query.exception() is None
    return expected, query


def test_stream_topic_to_topic_without_loss_or_duplicates(spark, nsqd, tmp_path):
    count = 4000
    expected = bodies_of("stream", count)
    create_channel(nsqd, "stream_out", "check")
    publish(nsqd, "stream_in", expected[: count // 2])
    query = start_pipeline(spark, nsqd, "stream_in", "stream_out", tmp_path / "checkpoint",
                           trigger={"processingTime": "0 seconds"}, maxMessagesPerTrigger="700",
                           maxInFlight="3000")  # two connections
    try:
        publish(nsqd, "stream_in", expected[count // 2:])
        # The pipeline still runs: only time shows that it writes no duplicates.
        got = consume(nsqd, "stream_out", "check", expect=count, linger=2.0)
    finally:
        query.stop()
    assert len(got) == count
    assert sorted(got) == expected
    assert max(p["numInputRows"] for p in query.recentProgress) <= 700


def test_available_now_reads_the_backlog_and_stops(spark, nsqd, tmp_path):
    count = 1500
    expected, query = copy_backlog_available_now(spark, nsqd, "now", count, tmp_path / "checkpoint", 600)
    batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(batches) == count and max(batches) <= 600
    assert sorted(consume(nsqd, "now_out", "check", expect=count)) == expected


def test_against_nsqd_the_driver_side_path_copies_everything(spark, real_nsqd, tmp_path):
    count = 3000
    expected, _ = copy_backlog_available_now(spark, real_nsqd, "real", count, tmp_path / "checkpoint", 1000)
    assert sorted(consume(real_nsqd, "real_out", "check", expect=count)) == expected
    # nsqd FIN'd every message the driver held: nothing of the channel is left
    assert consume(real_nsqd, "real_in", "spark", expect=1, linger=0, timeout=2) == []


# -- connections named in /stats ----------------------------------------------


def channel_clients(broker: BrokerProcess, topic: str, channel: str) -> list[dict]:
    """The clients of ``topic``/``channel`` as the broker's ``/stats`` lists them."""
    with urllib.request.urlopen(f"http://{broker.http[0]}:{broker.http[1]}/stats?format=json&topic={topic}"
                                f"&channel={channel}", timeout=10) as response:
        topics = json.load(response)["topics"]
    return [client for t in topics for c in t["channels"] for client in c["clients"]]


def test_stats_names_each_partitions_connection_by_query_batch_and_partition(spark, nsqd, tmp_path):
    count = 12_000  # two partitions: the source splits a backlog from 10,000 messages on
    create_channel(nsqd, "named_in", "spark")
    create_channel(nsqd, "named_out", "check")
    publish(nsqd, "named_in", bodies_of("named", count))
    # paused, the channel still counts its messages as available, but delivers none: each
    # partition's connection waits (drainTimeoutMs) where /stats can see it
    post_http(nsqd, "/channel/pause?topic=named_in&channel=spark")
    query = start_pipeline(spark, nsqd, "named_in", "named_out", tmp_path / "checkpoint",
                           trigger={"availableNow": True}, drainTimeoutMs=str(DEADLINE_S * 1000))
    try:
        pattern = re.compile(r"stream (\w+) batch (\d+) partition (\d+)")

        def both_named() -> list[dict] | None:  # the executors connect in their own time; /stats is the only witness
            named = [c for c in channel_clients(nsqd, "named_in", "spark") if pattern.fullmatch(c["client_id"])]
            return named if len(named) >= 2 else None

        named = wait_sync(both_named, DEADLINE_S, poll=0.1, report=lambda: str(channel_clients(nsqd, "named_in", "spark")))
        # the plan of the batch: in the checkpoint before its tasks run
        offset = json.loads((tmp_path / "checkpoint" / "offsets" / "0").read_text().splitlines()[2])
        assert sorted(c["client_id"] for c in named) == [
            f"stream {offset['query']} batch {offset['batch']} partition {index}" for index in range(2)]
        assert len({(c["hostname"], c["user_agent"]) for c in named}) == 1  # only the name tells them apart
        assert "stream driver" in {c["client_id"] for c in channel_clients(nsqd, "named_in", "spark")}
        post_http(nsqd, "/channel/unpause?topic=named_in&channel=spark")
        assert query.awaitTermination(DEADLINE_S)
    finally:
        query.stop()
    assert sorted(consume(nsqd, "named_out", "check", expect=count)) == bodies_of("named", count)


def post_http(broker: BrokerProcess, path: str) -> None:
    """POST ``path`` to the broker's HTTP API; asserts 200."""
    http_request = urllib.request.Request(f"http://{broker.http[0]}:{broker.http[1]}{path}", method="POST")
    with urllib.request.urlopen(http_request, timeout=10) as response:
        assert response.status == 200


@contextlib.contextmanager
def tapped(target: tuple[str, int]):
    """A :func:`~tests.support.wiretap.wiretap` in front of ``target``, served by trio in a thread
    of its own, so Spark keeps this test's thread (its data sources are found from there)."""
    started = threading.Event()
    running: dict = {}

    async def serve() -> None:
        async with wiretap(target) as tap:
            running.update(tap=tap, stop=trio.Event(), token=trio.lowlevel.current_trio_token())
            started.set()
            await running["stop"].wait()

    thread = threading.Thread(target=trio.run, args=(serve,), daemon=True)
    thread.start()
    assert started.wait(30)
    try:
        yield running["tap"]
    finally:
        trio.from_thread.run_sync(running["stop"].set, trio_token=running["token"])
        thread.join(30)


def test_sink_tasks_name_their_micro_batch_and_partition(spark, nsqd, tmp_path):
    # the sink's connections close with their tasks: the IDENTIFYs on the wire show their names
    publish(nsqd, "named_sink_in", bodies_of("sink", 10))
    with tapped(nsqd.tcp) as tap:
        through_tap = f"{tap.address[0]}:{tap.address[1]}"
        query = (spark.readStream.format("nsq").option("nsqd", address(nsqd)).option("topic", "named_sink_in")
                 .option("channel", "spark").option("drainTimeoutMs", "500").load()
                 .select("body").writeStream.format("nsq").option("nsqd", through_tap)
                 .option("topic", "named_sink_out").option("checkpointLocation", str(tmp_path / "checkpoint"))
                 .trigger(availableNow=True).start())
        assert query.awaitTermination(DEADLINE_S)
        (spark.createDataFrame([("x",)], "body string").coalesce(1).write.format("nsq")
         .option("nsqd", through_tap).option("topic", "named_sink_out").mode("append").save())
        seen = tap.seen()
    names = {name.decode() for name in re.findall(rb'"client_id":\s*"([^"]+)"', seen)}
    assert names == {"write batch 0 partition 0", "write partition 0"}
