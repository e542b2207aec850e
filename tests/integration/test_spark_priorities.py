"""The connector's priorities against an in-process pynsqd, without Spark: what the sink's
publisher sends (with keys too) comes back in (priority, publish order) order, its
priority cut off into the ``priority`` column, on each of the source's read paths."""

from __future__ import annotations

import trio

from pyspark_nsq.batch_reader import DrainPartition, NsqBatchReader
from pyspark_nsq.lease_partition import LeasePartition
from pyspark_nsq.options import Address, BatchReadOptions
from pyspark_nsq.publisher import Publisher
from pyspark_nsq.subscription import Subscription
from tests.support.http_client import request
from tests.support.waiting import wait_for

#: The broker's --default-priority in these tests: what a row without one is delivered with.
DEFAULT = 100
#: (body, key, priority) as the sink's rows give them: the last is a duplicate of the first's key.
ROWS = [(b"a", b"k1", 5), (b"b", None, None), (b"c", b"k2", 0), (b"d", None, 5), (b"e", b"k3", 101),
        (b"dup", b"k1", 0)]
#: What the channel then delivers, in order: the duplicate was not stored.
EXPECTED = [(b"c", 0), (b"a", 5), (b"d", 5), (b"b", DEFAULT), (b"e", 101)]


async def _in_thread(fn, *args):
    with trio.fail_after(30):
        return await trio.to_thread.run_sync(fn, *args)


async def _publish_rows(daemon, topic: str) -> Publisher:
    """Create ``topic`` and its channel ``c``, then publish :data:`ROWS` as a sink task does."""
    for path in (f"/topic/create?topic={topic}", f"/channel/create?topic={topic}&channel=c"):
        assert (await request(daemon.addresses.http, "POST", path)).status == 200
    publisher = Publisher([Address(*daemon.addresses.tcp)], batch_size=2, keyed=True, prioritised=True)

    def run():
        try:
            publisher.publish(topic, [body for body, _, _ in ROWS], [key for _, key, _ in ROWS],
                              [priority for _, _, priority in ROWS])
            publisher.flush()
        finally:
            publisher.close()

    await _in_thread(run)
    return publisher


async def test_a_leased_read_gives_each_message_its_priority_in_delivery_order(start_daemon):
    async with start_daemon(f"--default-priority={DEFAULT}") as daemon:
        publisher = await _publish_rows(daemon, "t")
        assert (publisher.published, publisher.duplicates) == (len(ROWS), 1)
        partition = LeasePartition(Address(*daemon.addresses.tcp), "t", 10, "q.1.0")
        batches = await _in_thread(lambda: list(partition.read("c", 60_000, 300, finish=True)))
        rows = [row for batch in batches
                for row in zip(batch.column("body").to_pylist(), batch.column("priority").to_pylist())]
        assert rows == EXPECTED


async def test_the_drain_and_a_subscription_cut_the_priority_off_too(start_daemon):
    async with start_daemon(f"--default-priority={DEFAULT}") as daemon:
        await _publish_rows(daemon, "drained")
        await _publish_rows(daemon, "held")
        address = Address(*daemon.addresses.tcp)
        options = BatchReadOptions.parse({"nsqd": str(address), "topic": "drained", "channel": "c",
                                          "maxMessages": "10", "drainTimeoutMs": "300"})
        reader = NsqBatchReader(options)
        batches = await _in_thread(lambda: list(reader.read(DrainPartition(address, "drained", 10))))
        assert [row for batch in batches for row in zip(batch.column("body").to_pylist(),
                                                        batch.column("priority").to_pylist())] == EXPECTED

        subscription = Subscription(address, "held", "c", max_in_flight=10, msg_timeout_ms=60_000)
        await _in_thread(subscription.start)
        try:
            # the subscription's own thread fills the inbox
            await wait_for(lambda: len(subscription.inbox) >= len(EXPECTED), timeout=10)
            received = list(subscription.inbox)
            subscription.fin([message.id for message in received])
        finally:
            await _in_thread(subscription.close)
        assert subscription.prioritised
        assert [(m.body, m.priority) for m in received] == EXPECTED
