"""The connector's leased reads against an in-process pynsqd, without Spark."""

from __future__ import annotations

import json
import re

import pytest
import trio
from pyspark.sql.streaming.datasource import ReadAllAvailable

from pyspark_nsq.batch_reader import NsqBatchReader
from pyspark_nsq.lease_control import LeaseControl
from pyspark_nsq.lease_partition import LeasePartition
from pyspark_nsq.leased_source import LeasedSource
from pyspark_nsq.options import Address, BatchReadOptions, SourceOptions
from pyspark_nsq.partitioning import allocate, split
from pyspark_nsq.stream_reader import open_source
from tests.support.v2client import publish_batch, subscriber
from tests.support.wiretap import wiretap


def _address(daemon) -> Address:
    return Address(*daemon.addresses.tcp)


def _read(daemon, token: str, count: int, topic: str = "t") -> list[bytes]:
    partition = LeasePartition(_address(daemon), topic, count, token)
    batches = list(partition.read("c", msg_timeout_ms=60_000, drain_timeout_ms=300))
    return [body for batch in batches for body in batch.column("body").to_pylist()]


async def _in_thread(fn, *args):
    with trio.fail_after(30):
        return await trio.to_thread.run_sync(fn, *args)


async def test_a_partition_leases_what_it_reads_and_the_driver_finishes_it(daemon):
    bodies = [b"m%05d" % i for i in range(6000)]
    await publish_batch(daemon, "t", *bodies)
    control = LeaseControl(_address(daemon), "t", "c", "q.control")
    try:
        assert await _in_thread(lambda: control.offers_leases)
        assert await _in_thread(control.available) == 6000
        first = await _in_thread(_read, daemon, "q.1.0", 3500)
        second = await _in_thread(_read, daemon, "q.1.1", 3500)
        assert sorted(first + second) == bodies and len(first) == 3500
        channel = daemon.broker.topics["t"].channels["c"]
        assert (len(channel.in_flight), channel.depth) == (6000, 0)
        assert await _in_thread(control.finish, ["q.1.0", "q.1.1"]) == 6000
        assert (len(channel.in_flight), channel.depth) == (0, 0)
    finally:
        control.close()


async def test_a_retried_partition_gives_back_what_the_first_attempt_leased(daemon):
    await publish_batch(daemon, "t", *[b"%d" % i for i in range(10)])
    assert len(await _in_thread(_read, daemon, "q.2.0", 4)) == 4
    again = await _in_thread(_read, daemon, "q.2.0", 10)
    assert sorted(again, key=int) == [b"%d" % i for i in range(10)]
    control = LeaseControl(_address(daemon), "t", "c", "q.control")
    try:
        assert await _in_thread(control.finish, ["q.2.0"]) == 10
    finally:
        control.close()


async def test_credit_left_unspent_takes_no_message_out_of_sight(daemon):
    await publish_batch(daemon, "t", b"a", b"b", b"c")
    assert sorted(await _in_thread(_read, daemon, "q.3.0", 100)) == [b"a", b"b", b"c"]
    await publish_batch(daemon, "t", b"d")
    plain = await subscriber(daemon, rdy=5)
    assert (await plain.read_message()).body == b"d"


@pytest.mark.parametrize(("count", "sizes"), [
    (1, [1]), (9_999, [9_999]), (10_000, [5_000, 5_000]), (120_001, [40_001, 40_000, 40_000]),
])
def test_a_deep_backlog_is_split_over_several_partitions(count, sizes):
    assert split(count) == sizes


def test_a_limit_is_shared_in_proportion_to_what_each_nsqd_holds():
    a, b = (Address("h", 1), "t"), (Address("h", 2), "t")
    assert allocate({a: 300, b: 100}, None) == {a: 300, b: 100}
    assert allocate({a: 300, b: 100}, 101) == {a: 76, b: 25}
    assert allocate({a: 0, b: 5}, 3) == {a: 0, b: 3}


async def test_the_batch_reader_splits_the_backlog_and_finishes_what_spark_took(daemon):
    await publish_batch(daemon, "t", *[b"%d" % i for i in range(12_000)])
    host, port = daemon.addresses.tcp
    reader = NsqBatchReader(BatchReadOptions.parse({
        "nsqd": f"{host}:{port}", "topic": "t", "channel": "c", "maxMessages": "11000",
        "drainTimeoutMs": "300"}))
    partitions = await _in_thread(reader.partitions)
    assert [p.count for p in partitions] == [5500, 5500]

    def read_all():
        return [body for p in partitions for batch in reader.read(p)
                for body in batch.column("body").to_pylist()]

    bodies = await _in_thread(read_all)
    assert len(set(bodies)) == 11_000
    channel = daemon.broker.topics["t"].channels["c"]
    assert (len(channel.in_flight), channel.depth) == (0, 1000)


async def test_the_driver_touches_the_leases_of_the_batch_in_progress(daemon):
    await publish_batch(daemon, "t", *[b"%d" % i for i in range(100)])
    host, port = daemon.addresses.tcp
    options = SourceOptions.parse({"nsqd": f"{host}:{port}", "topic": "t", "channel": "c",
                                   "msgTimeoutMs": "1000", "drainTimeoutMs": "300"})
    source = await _in_thread(open_source, options)
    try:
        assert isinstance(source, LeasedSource)
        end = await _in_thread(source.latest_offset, source.initial_offset(), ReadAllAvailable())
        (partition,) = source.partitions({}, end)
        rows = await _in_thread(lambda: sum(b.num_rows for b in partition.read("c", 1000, 300)))
        assert rows == 100
        # three msg timeouts pass: touched every half of one, nothing comes back
        plain = await subscriber(daemon, rdy=100)
        with trio.move_on_after(3):
            await plain.read_message()
            raise AssertionError("a leased message timed out while its batch was in progress")
        await _in_thread(source.commit, end)
        channel = daemon.broker.topics["t"].channels["c"]
        assert (len(channel.in_flight), channel.depth) == (0, 0)
    finally:
        await _in_thread(source.stop)


async def test_a_restarted_driver_replays_its_last_batch_full_with_other_messages(daemon):
    """What spark/README.md's Guarantees say: the replay reads as many messages as the batch
    planned, from the same places, while the killed driver's leases wait for their timeout."""
    first_bodies = [b"first-%d" % i for i in range(20)]
    await publish_batch(daemon, "t", *first_bodies)
    host, port = daemon.addresses.tcp
    options = SourceOptions.parse({"nsqd": f"{host}:{port}", "topic": "t", "channel": "c", "drainTimeoutMs": "300"})
    killed = await _in_thread(open_source, options)
    restarted = None
    try:
        start = killed.initial_offset()
        end = await _in_thread(killed.latest_offset, start, ReadAllAvailable())
        # the batch's tasks lease everything; then the driver dies before the commit
        assert await _in_thread(_count_rows, killed.partitions(start, end)) == 20
        await publish_batch(daemon, "t", *[b"later-%d" % i for i in range(30)])

        restarted = await _in_thread(open_source, options)
        replayed = restarted.partitions(start, json.loads(json.dumps(end)))  # as the checkpoint hands it back
        assert [p.count for p in replayed] == [20]

        def read() -> list[bytes]:
            return [body for p in replayed for batch in p.read("c", 60_000, 300)
                    for body in batch.column("body").to_pylist()]

        bodies = await _in_thread(read)
        assert len(bodies) == 20 and all(body.startswith(b"later-") for body in bodies)
        channel = daemon.broker.topics["t"].channels["c"]
        assert (len(channel.in_flight), channel.depth) == (40, 10)  # the killed driver's 20 wait for their timeout
    finally:
        await _in_thread(killed.stop)
        if restarted is not None:
            await _in_thread(restarted.stop)


_PARTITION_TOKEN = re.compile(r"(?P<query>[0-9a-f]{12})\.(?P<batch>\d+)\.(?P<partition>\d+)\.(?P<secret>[A-Za-z0-9_-]{22})")


def _tokens_seen(tap) -> tuple[set[str], set[str]]:
    """The lease tokens the broker got: in IDENTIFY (to read under), and in LEASE FIN/REQ/TOUCH."""
    seen = tap.seen()
    taken = {m.decode() for m in re.findall(rb'"lease":\s*"([^"]+)"', seen)}
    settled = {m.decode() for m in re.findall(rb"LEASE (?:FIN|REQ|TOUCH) ([^ \n]+)", seen)}
    return {t for t in taken if not t.endswith(".control")}, settled


def _count_rows(partitions) -> int:
    return sum(batch.num_rows for p in partitions for batch in p.read("c", 60_000, 300))


async def test_the_tokens_the_broker_sees_end_in_a_random_part_no_offset_shows(daemon):
    secrets_seen, offsets = [], []
    async with wiretap(daemon.addresses.tcp) as tap:
        host, port = tap.address
        options = SourceOptions.parse({"nsqd": f"{host}:{port}", "topic": "t", "channel": "c",
                                       "drainTimeoutMs": "300"})
        for run in range(2):  # two queries, as two drivers would run them
            tap.sent.clear()
            await publish_batch(daemon, "t", *[b"%d.%d" % (run, i) for i in range(50)])
            source = await _in_thread(open_source, options)
            try:
                end = await _in_thread(source.latest_offset, source.initial_offset(), ReadAllAvailable())
                partitions = source.partitions({}, end)
                assert await _in_thread(_count_rows, partitions) == 50
                await _in_thread(source.commit, end)
            finally:
                await _in_thread(source.stop)
            taken, settled = _tokens_seen(tap)
            assert taken and taken <= settled  # the executors' tokens, finished by the driver
            parts = [_PARTITION_TOKEN.fullmatch(token) for token in taken]
            assert all(parts), taken
            secrets_seen.append({p["secret"] for p in parts})
            offsets.append(json.dumps(end))
        channel = daemon.broker.topics["t"].channels["c"]
        assert (len(channel.in_flight), channel.depth) == (0, 0)
    (first,), (second,) = secrets_seen
    assert first != second
    assert not any(secret in offset for secret in (first, second) for offset in offsets)


async def test_the_batch_readers_tokens_end_in_a_random_part(daemon):
    await publish_batch(daemon, "t", *[b"%d" % i for i in range(20)])
    async with wiretap(daemon.addresses.tcp) as tap:
        host, port = tap.address
        reader = NsqBatchReader(BatchReadOptions.parse({
            "nsqd": f"{host}:{port}", "topic": "t", "channel": "c", "drainTimeoutMs": "300"}))

        def read_all():
            return [body for p in reader.partitions() for batch in reader.read(p)
                    for body in batch.column("body").to_pylist()]

        assert len(await _in_thread(read_all)) == 20
    taken, settled = _tokens_seen(tap)
    assert taken and taken == settled and all(_PARTITION_TOKEN.fullmatch(token) for token in taken), taken
