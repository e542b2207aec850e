"""Priorities through Spark: a DataFrame's ``priority`` column against a real pynsqd.

The sink publishes each row with its priority (a null one with the broker's default);
the topic's channel then delivers in (priority, publish order) order, which a plain V2
client checks, one message at a time, and the batch reader gives each message's
priority back in its ``priority`` column.
"""

from __future__ import annotations

import pytest
import trio

from broker.protocol import encode_fin, encode_rdy, encode_sub
from tests.support.processes import BrokerProcess
from tests.support.v2client import connect
from tests.system.test_spark import (  # noqa: F401  (fixtures, shared with test_spark)
    DEADLINE_S,
    address,
    create_channel,
    nsqd,
    spark,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

#: pynsqd's --default-priority: what a row with a null priority is published with.
DEFAULT = 1 << 31
#: The rows' priorities, in publish order: ties, nulls, both ends of the range, the default itself.
PRIORITIES = [5, None, 0, 5, 4294967295, None, 0, DEFAULT, 7, None, 2147483647, 5, 1, 4294967295, 0, None]


def consume_in_order(broker: BrokerProcess, topic: str, channel: str, count: int) -> list[bytes]:
    """The bodies of ``count`` messages in the order ``channel`` delivers them: RDY 1, each
    FIN'd before the next comes; then nothing more arrives."""

    async def run():
        client = await connect(broker.tcp, timeout=DEADLINE_S)
        await client.send(encode_sub(topic, channel))
        await client.expect_response()
        await client.send(encode_rdy(1))
        bodies = []
        while len(bodies) < count:
            message = await client.read_message()
            await client.send(encode_fin(message.id))
            bodies.append(message.body)
        await client.expect_quiet()
        await client.aclose()
        return bodies

    return trio.run(run)


def test_a_priority_column_orders_delivery_and_reads_back_as_the_priority_column(spark, nsqd):  # noqa: F811
    topic = "prioritised"
    create_channel(nsqd, topic, "check")
    create_channel(nsqd, topic, "spark")
    rows = [(f"m{index:02d}", priority) for index, priority in enumerate(PRIORITIES)]
    # one partition, so one task publishes the rows in this order, four per MPUB
    frame = spark.createDataFrame(rows, "body string, priority bigint").coalesce(1)
    frame.write.format("nsq").option("nsqd", address(nsqd)).option("topic", topic) \
        .option("batchSize", "4").mode("append").save()

    ranked = sorted(range(len(rows)), key=lambda i: (DEFAULT if PRIORITIES[i] is None else PRIORITIES[i], i))
    assert consume_in_order(nsqd, topic, "check", len(rows)) == [rows[i][0].encode() for i in ranked]

    read = (spark.read.format("nsq").option("nsqd", address(nsqd)).option("topic", topic)
            .option("channel", "spark").option("drainTimeoutMs", "300").load())
    got = sorted((bytes(row.body).decode(), row.priority) for row in read.select("body", "priority").collect())
    assert got == [(body, DEFAULT if priority is None else priority) for body, priority in rows]
