"""Exactly-once copies with the Spark connector: the sink's ``key`` column against a real pynsqd.

The streaming source delivers at least once and the sink publishes at least once;
keyed with ``concat(nsqd, '/', id)`` (the source message's node and id), every
message published again (a replayed micro-batch, a message redelivered after its
lease timed out) is a duplicate the broker does not store. The copies here are
killed (the query's whole process group, or the broker) at random points while
they run, restarted, and the sink topic is then read with the plain V2 test client:
each message once.
"""

from __future__ import annotations

import json
import random
import re
import socket
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from tests.support.processes import BrokerProcess
from tests.support.spark_queries import EXACTLY_ONCE_KEY, kill_group, run_copy_process
from tests.support.waiting import wait_sync
from tests.system.test_spark import (  # noqa: F401  (fixtures, shared with test_spark)
    DEADLINE_S,
    WORKER_PATH,
    address,
    bodies_of,
    consume,
    create_channel,
    nsqd,
    publish,
    real_nsqd,
    spark,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def topic_stats(broker: BrokerProcess, topic: str, channel: str | None = None) -> dict:
    """What the broker's ``/stats`` says of ``topic`` (and only its ``channel``, when given)."""
    url = f"http://{broker.http[0]}:{broker.http[1]}/stats?format=json&topic={topic}"
    with urllib.request.urlopen(url + ("" if channel is None else f"&channel={channel}"), timeout=10) as response:
        (stats,) = json.load(response)["topics"]
    return stats


def channel_stats(broker: BrokerProcess, topic: str, channel: str) -> dict:
    """What the broker's ``/stats`` says of ``topic``/``channel``."""
    (stats,) = topic_stats(broker, topic, channel)["channels"]
    return stats


def wait_for(condition, what: str, log: Path, timeout: float = DEADLINE_S) -> None:
    """Return once ``condition()`` holds; fails naming ``what``, with the end of the copy's log.
    (The broker and Spark are other processes: /stats is the only witness.)"""
    wait_sync(condition, timeout, report=lambda: f"{what}\n" + log.read_text(errors="replace")[-3000:])


def copied(broker: BrokerProcess, sink: str, at_least: int):
    """A condition: the sink's channel ``check`` holds ``at_least`` messages."""
    return lambda: channel_stats(broker, sink, "check")["depth"] >= at_least


def drained(broker: BrokerProcess, source: str, sink: str, count: int):
    """A condition: the copy is done, every source message finished and ``count`` in the sink."""
    def done() -> bool:
        stats = channel_stats(broker, source, "spark")
        return ((stats["depth"], stats["in_flight_count"], stats["deferred_count"]) == (0, 0, 0)
                and channel_stats(broker, sink, "check")["depth"] >= count)
    return done


def kill_points(count: int, kills: int, rng: random.Random) -> list[int]:
    """``kills`` increasing message counts of the sink, one in each of ``kills`` equal stretches
    of the first 80% of ``count``, so that every run copies something before it dies."""
    stretch = count * 8 // 10 // kills
    return [index * stretch + rng.randrange(stretch // 4, stretch) for index in range(kills)]


def assert_each_once(got: list[bytes], expected: list[bytes], log: Path) -> None:
    counts = Counter(got)
    lost = [body for body in expected if body not in counts]
    twice = {body: n for body, n in counts.items() if n > 1}
    assert not lost and not twice and len(got) == len(expected), (
        f"{len(lost)} lost, {len(twice)} more than once (e.g. {list(twice.items())[:3]}), "
        f"{len(got)} read of {len(expected)}\n" + log.read_text(errors="replace")[-3000:])


def test_killed_keyed_copy_restarts_from_checkpoint_and_copies_each_message_once(nsqd, tmp_path, record_property):  # noqa: F811
    count, kills = 20_000, 3
    rng = random.Random()
    seed = rng.randrange(1 << 32)
    rng.seed(seed)
    record_property("seed", seed)
    expected = bodies_of("once", count)
    create_channel(nsqd, "once_in", "spark")
    create_channel(nsqd, "once_out", "check")
    publish(nsqd, "once_in", expected)
    checkpoint, log = tmp_path / "checkpoint", tmp_path / "copy.log"
    points = kill_points(count, kills, rng)

    for point in points:
        copy = run_copy_process(address(nsqd), "once_in", "once_out", checkpoint, log, worker_path=WORKER_PATH,
                                key=EXACTLY_ONCE_KEY)
        try:
            wait_for(copied(nsqd, "once_out", point), f"{point} messages copied", log)
        finally:
            kill_group(copy)
    last = run_copy_process(address(nsqd), "once_in", "once_out", checkpoint, log, worker_path=WORKER_PATH,
                            key=EXACTLY_ONCE_KEY)
    try:
        wait_for(drained(nsqd, "once_in", "once_out", count), "the copy finished", log)
    finally:
        kill_group(last)
    got = consume(nsqd, "once_out", "check", expect=count)
    assert_each_once(got, expected, log)
    # every stored message holds its key; what a killed run had published and leased came back,
    # was published again and dropped (none, for a run killed between two micro-batches)
    sink = topic_stats(nsqd, "once_out")
    assert sink["keyed_count"] - sink["duplicate_count"] == sink["keys_held"] == count
    record_property("duplicates", sink["duplicate_count"])
    print(f"keyed copy killed at {points} (seed {seed}): {count} messages once each, "
          f"{sink['duplicate_count']} duplicates dropped by the broker")


def free_port_pair() -> tuple[int, int]:
    """Two free ports below Linux's ephemeral range (32768 and up), so that no client's own
    port takes one while the broker is down between a kill and its restart."""
    rng = random.Random()
    while True:
        ports = rng.randrange(20_000, 32_000), rng.randrange(20_000, 32_000)
        if ports[0] == ports[1]:
            continue
        held = []
        try:
            for port in ports:
                probe = socket.socket()
                held.append(probe)
                probe.bind(("127.0.0.1", port))
            return ports
        except OSError:
            continue
        finally:
            for probe in held:
                probe.close()


def test_keyed_copy_through_broker_crashes_copies_each_message_once(tmp_path, record_property):
    count, crashes = 20_000, 2
    rng = random.Random()
    seed = rng.randrange(1 << 32)
    rng.seed(seed)
    record_property("seed", seed)
    tcp, http = free_port_pair()
    flags = ("--durable", f"--tcp-address=127.0.0.1:{tcp}", f"--http-address=127.0.0.1:{http}")
    broker = BrokerProcess(tmp_path / "data", *flags).start()
    checkpoint, log = tmp_path / "checkpoint", tmp_path / "copy.log"
    copy = None
    try:
        expected = bodies_of("crash", count)
        create_channel(broker, "crash_in", "spark")
        create_channel(broker, "crash_out", "check")
        publish(broker, "crash_in", expected)
        copy = run_copy_process(address(broker), "crash_in", "crash_out", checkpoint, log,
                                worker_path=WORKER_PATH, key=EXACTLY_ONCE_KEY, restarts=crashes * 2)
        points = kill_points(count, crashes, rng)
        for point in points:
            wait_for(copied(broker, "crash_out", point), f"{point} messages copied", log)
            broker.kill()
            broker = BrokerProcess(tmp_path / "data", *flags).start()
            assert broker.tcp == ("127.0.0.1", tcp)
        wait_for(drained(broker, "crash_in", "crash_out", count), "the copy finished", log)
        kill_group(copy)
        copy = None
        got = consume(broker, "crash_out", "check", expect=count)
        duplicates = topic_stats(broker, "crash_out")["duplicate_count"]  # counted since the broker started
    finally:
        if copy is not None:
            kill_group(copy)
        broker.kill()
    assert_each_once(got, expected, log)
    restarts = log.read_text(errors="replace").count("restarting from its checkpoint")
    record_property("query_restarts", restarts)
    record_property("duplicates_after_last_crash", duplicates)
    print(f"keyed copy, broker killed at {points} (seed {seed}): {count} messages once each, "
          f"query restarted {restarts} times, {duplicates} duplicates dropped since the last crash")


def test_a_key_column_publishes_each_key_once_and_null_keys_every_time(spark, nsqd):  # noqa: F811
    create_channel(nsqd, "keyed_sink", "check")
    rows = [(f"body-{i}", f"key-{i}") for i in range(300)] + [("unkeyed", None)]
    frame = spark.createDataFrame(rows, "body string, key string").repartition(2)
    for _ in range(2):
        frame.write.format("nsq").option("nsqd", address(nsqd)).option("topic", "keyed_sink") \
            .option("batchSize", "50").mode("append").save()
    got = consume(nsqd, "keyed_sink", "check", expect=302)
    assert sorted(got) == sorted([f"body-{i}".encode() for i in range(300)] + [b"unkeyed"] * 2)


def test_an_empty_key_fails_the_write_naming_the_limit(spark, nsqd):  # noqa: F811
    frame = spark.createDataFrame([("body", "")], "body string, key string")
    with pytest.raises(Exception, match=re.escape("a 'key' must be 1 to 128 bytes (a string's UTF-8) or null")):
        frame.write.format("nsq").option("nsqd", address(nsqd)).option("topic", "keyed_empty") \
            .mode("append").save()


def test_against_nsqd_a_key_column_fails_clearly_and_publishes_nothing(spark, real_nsqd):  # noqa: F811
    frame = spark.createDataFrame([("body", "key")], "body string, key string")
    with pytest.raises(Exception, match=re.escape(
            f"nsq data source: the 'key' column needs keyed publishes, which {address(real_nsqd)} "
            "does not offer (nsqd has none")):
        frame.write.format("nsq").option("nsqd", address(real_nsqd)).option("topic", "keyed_nsqd") \
            .mode("append").save()
    url = f"http://{real_nsqd.http[0]}:{real_nsqd.http[1]}/stats?format=json&topic=keyed_nsqd"
    with urllib.request.urlopen(url, timeout=10) as response:
        assert not json.load(response)["topics"]  # refused before a PUB named the topic (nsqd says null)
