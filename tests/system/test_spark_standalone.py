"""The connector on a Spark standalone cluster (``spark://``), not only ``local[N]``.

A master and two one-core workers, each its own JVM started from pyspark's
``bin/spark-class`` on 127.0.0.1; the driver is this test process. The executors'
Python workers import the connector from this checkout (``PYTHONPATH`` of the
workers, which their executors inherit). A batch write, a streaming copy and a
batch read each run as tasks on both executors, and every message arrives once.
"""

from __future__ import annotations

import os
import sys
from collections import Counter

import pytest

from tests.support.paths import REPO
from tests.support.spark_queries import start_copy
from tests.support.spark_standalone import StandaloneCluster, java_missing
from tests.support.waiting import wait_sync
from tests.system.test_spark import DEADLINE_S, WORKER_PATH, address, create_channel, nsqd  # noqa: F401

pytestmark = [pytest.mark.spark, pytest.mark.slow,
              pytest.mark.skipif(java_missing() is not None, reason=java_missing() or "")]

#: Enough for two input partitions per micro-batch (the source splits from 10,000 on).
COUNT = 12_000


@pytest.fixture(scope="module")
def cluster_spark(tmp_path_factory):
    """A session on a fresh standalone cluster of two workers; the cluster's JVMs are killed after."""
    from pyspark.sql import SparkSession

    env = dict(os.environ, PYSPARK_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join(filter(None, [WORKER_PATH, os.environ.get("PYTHONPATH")])))
    cluster = StandaloneCluster(tmp_path_factory.mktemp("standalone"), env)
    session = None
    try:
        cluster.start()
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
            patch.setenv("PYSPARK_PYTHON", sys.executable)
            patch.setenv("PYTHONPATH", env["PYTHONPATH"])
            session = (SparkSession.builder.master(cluster.url).appName("test_spark_standalone")
                       .config("spark.ui.enabled", "false")
                       .config("spark.ui.showConsoleProgress", "false")
                       .config("spark.executor.memory", "512m").config("spark.executor.cores", "1")
                       .config("spark.cores.max", "2").config("spark.sql.shuffle.partitions", "2")
                       .config("spark.executorEnv.PYTHONPATH", env["PYTHONPATH"])
                       .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
                       .getOrCreate())
            session.sparkContext.setLogLevel("ERROR")
            # executors register with the driver in their own time
            wait_sync(lambda: executor_count(session) >= 2, DEADLINE_S, poll=0.2, report=cluster.logs)
            yield session
    finally:
        if session is not None:
            session.stop()
        cluster.stop()


def executor_count(session) -> int:
    """How many executors have registered with the driver."""
    return session.sparkContext._jsc.sc().getExecutorIds().size()


def bodies(count: int) -> list[str]:
    return [f"standalone-{index:06d}" for index in range(count)]


def test_executors_import_this_checkouts_connector(cluster_spark):
    files = (cluster_spark.sparkContext.parallelize(range(4), 4)
             .map(lambda _: __import__("pyspark_nsq").__file__).collect())
    assert {str(REPO / "spark" / "pyspark_nsq" / "__init__.py")} == set(files)


def test_write_stream_copy_and_read_lose_and_duplicate_nothing(cluster_spark, nsqd, tmp_path):  # noqa: F811
    spark, broker = cluster_spark, address(nsqd)
    expected = bodies(COUNT)
    create_channel(nsqd, "standalone_out", "check")
    (spark.createDataFrame([(body,) for body in expected], "body string").repartition(4)
     .write.format("nsq").option("nsqd", broker).option("topic", "standalone_in").mode("append").save())

    query = start_copy(spark, broker, "standalone_in", "standalone_out", str(tmp_path / "checkpoint"),
                       channel="spark", trigger={"availableNow": True}, drainTimeoutMs="2000")
    assert query.awaitTermination(DEADLINE_S)
    assert query.exception() is None
    assert sum(p["numInputRows"] for p in query.recentProgress) == COUNT

    rows = (spark.read.format("nsq").option("nsqd", broker).option("topic", "standalone_out")
            .option("channel", "check").option("maxMessages", str(2 * COUNT)).option("drainTimeoutMs", "2000")
            .load().collect())
    got = Counter(bytes(row.body).decode() for row in rows)
    lost = set(expected) - set(got)
    duplicated = {body: n for body, n in got.items() if n > 1}
    assert (len(lost), len(duplicated), len(rows)) == (0, 0, COUNT)
