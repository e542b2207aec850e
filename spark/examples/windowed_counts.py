"""Count JSON events per kind in event-time windows: an nsq topic in, an nsq topic out.

Each message on the source topic is one JSON event::

    {"time": "2024-05-01T12:00:03.250Z", "kind": "click", "amount": 2.5}

Events are grouped into tumbling windows of event time. A watermark bounds how
late an event may arrive; once it passes the end of a window, that window's
counts are final and one JSON message per (window, kind) is published::

    {"start": "...", "end": "...", "kind": "click", "events": 42, "amount": 97.5}

The last windows of a burst of events therefore wait until newer events move
the watermark; ``publish_events.py --drain`` publishes one such event at the end.

Run it against a local pynsqd (see spark/README.md, "Example pipeline"):

    python spark/examples/windowed_counts.py --nsqd 127.0.0.1:4150 \\
        --checkpoint /tmp/windowed-counts

Ctrl-C stops the query cleanly, prints one line and exits with status 130.
Starting it again with the same checkpoint continues where it stopped: a message
is FIN'd only once its batch is committed, so nothing is lost; a batch
interrupted by the stop is published again.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time

from pyspark import SparkConf, SparkContext
from pyspark.java_gateway import launch_gateway
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, StringType, StructField, StructType, TimestampType

EVENT = StructType(
    [
        StructField("time", TimestampType()),
        StructField("kind", StringType()),
        StructField("amount", DoubleType()),
    ]
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nsqd", default="127.0.0.1:4150", help="nsqd TCP address(es)")
    parser.add_argument("--source-topic", default="events")
    parser.add_argument("--channel", default="windowed_counts")
    parser.add_argument("--sink-topic", default="event_counts")
    parser.add_argument("--checkpoint", required=True, help="Spark checkpoint directory")
    parser.add_argument("--window", default="10 seconds", help="window length (event time)")
    parser.add_argument("--watermark", default="5 seconds", help="allowed lateness")
    parser.add_argument("--trigger", default="2 seconds", help="processing-time trigger")
    return parser.parse_args(argv)


def build_query(spark: SparkSession, args: argparse.Namespace):
    """The streaming query, not yet started."""
    events = (
        spark.readStream.format("nsq")
        .option("nsqd", args.nsqd)
        .option("topic", args.source_topic)
        .option("channel", args.channel)
        .option("maxMessagesPerTrigger", "10000")
        .load()
        .select(F.from_json(F.col("body").cast("string"), EVENT).alias("event"))
        .select("event.*")
        .where(F.col("time").isNotNull() & F.col("kind").isNotNull())
    )
    counts = (
        events.withWatermark("time", args.watermark)
        .groupBy(F.window("time", args.window), "kind")
        .agg(F.count(F.lit(1)).alias("events"), F.round(F.sum("amount"), 2).alias("amount"))
    )
    out = counts.select(
        F.to_json(
            F.struct(
                F.date_format("window.start", "yyyy-MM-dd'T'HH:mm:ss.SSSXXX").alias("start"),
                F.date_format("window.end", "yyyy-MM-dd'T'HH:mm:ss.SSSXXX").alias("end"),
                "kind",
                "events",
                "amount",
            )
        ).alias("body")
    )
    return (
        out.writeStream.format("nsq")
        .outputMode("append")
        .option("nsqd", args.nsqd)
        .option("topic", args.sink_topic)
        .option("checkpointLocation", args.checkpoint)
        .trigger(processingTime=args.trigger)
    )


#: Seconds Ctrl-C waits for the micro-batch under way before stopping the query.
STOP_WAIT = 60.0


def spark_session() -> SparkSession:
    """A local Spark session whose JVM runs in a session of its own.

    Ctrl-C in a terminal signals the whole foreground process group. Spark's Python
    workers, started by the JVM, would each die of it with a traceback; out of that
    group, only this driver sees it and stops the query in order.
    """
    conf = (SparkConf().setAppName("nsq-windowed-counts")
            .set("spark.sql.shuffle.partitions", "2").set("spark.sql.session.timeZone", "UTC"))
    SparkContext(conf=conf, gateway=launch_gateway(conf, popen_kwargs={"start_new_session": True}))
    return SparkSession.builder.getOrCreate()


def main(argv=None) -> int:
    args = parse_args(argv)
    spark = spark_session()
    # Spark's INFO lines of every micro-batch would bury the query's own; and one finishing
    # between Ctrl-C and the stop below would follow the "stopped" line
    spark.sparkContext.setLogLevel("WARN")
    # after the SparkContext, which installs its own handler (cancel the jobs, raise KeyboardInterrupt)
    interrupted = threading.Event()
    signal.signal(signal.SIGINT, lambda signum, frame: interrupted.set())
    query = build_query(spark, args).start()
    while query.isActive and not interrupted.wait(1.0):
        pass
    if not interrupted.is_set():
        query.awaitTermination()  # raises the reason the query failed
        return 0
    spark.sparkContext.setLogLevel("ERROR")  # the stop warns of jobs it finds already finished
    # stopping in the middle of a micro-batch aborts its write (it is published again on the
    # next start): let the batch under way finish first, if it does within a while
    deadline = time.monotonic() + STOP_WAIT
    while query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.05)
    query.stop()
    spark.stop()
    print("windowed_counts.py: stopped; start it again with the same --checkpoint to continue", file=sys.stderr)
    return 130


if __name__ == "__main__":
    sys.exit(main())
