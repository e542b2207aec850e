"""Priorities through Spark: a DataFrame's ``priority`` column against a real pynsqd.

The sink publishes each row with its priority (a null one with the broker's default);
the topic's channel then delivers in (priority, publish order) order, which a plain V2
client checks, one message at a time, and the batch reader gives each message's
priority back in its ``priority`` column.
"""

from __future__ import annotations

import pytest
import trio

from tests.support.priorities import DEFAULT
from tests.support.v2client import consume
from tests.system.test_spark import (  # noqa: F401  (fixtures, shared with test_spark)
    DEADLINE_S,
    address,
    create_channel,
    nsqd,
    spark,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

#: The rows' priorities, in publish order: ties, nulls, both ends of the range, the default itself.
PRIORITIES = [5, None, 0, 5, 4294967295, None, 0, DEFAULT, 7, None, 2147483647, 5, 1, 4294967295, 0, None]


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
    # RDY 1, each finished before the next comes: the order the channel delivers in; then nothing more
    in_order = trio.run(lambda: consume(nsqd, topic, "check", len(rows), rdy=1, quiet=True, timeout=DEADLINE_S))
    assert in_order == [rows[i][0].encode() for i in ranked]

    read = (spark.read.format("nsq").option("nsqd", address(nsqd)).option("topic", topic)
            .option("channel", "spark").option("drainTimeoutMs", "300").load())
    got = sorted((bytes(row.body).decode(), row.priority) for row in read.select("body", "priority").collect())
    assert got == [(body, DEFAULT if priority is None else priority) for body, priority in rows]
