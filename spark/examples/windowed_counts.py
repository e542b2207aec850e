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

It creates its channel before Spark starts, so events published from then on are
counted, and prints ``windowed_counts.py: ready: ...`` once the query is subscribed.
Ctrl-C stops the query cleanly, prints one line and exits with status 130.
Starting it again with the same checkpoint continues where it stopped: a message
is FIN'd only once its batch is committed, so nothing is lost; a batch
interrupted by the stop is published again.
"""

from __future__ import annotations

import argparse
import sys

from pyspark import SparkConf
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, StringType, StructField, StructType, TimestampType
from streaming_example import create_channel, run_until_ctrl_c, spark_session

PROG = "windowed_counts.py"

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


def main(argv=None) -> int:
    args = parse_args(argv)
    create_channel(PROG, args.nsqd, args.source_topic, args.channel)
    spark = spark_session(SparkConf().setAppName("nsq-windowed-counts")
                          .set("spark.sql.shuffle.partitions", "2").set("spark.sql.session.timeZone", "UTC"))
    query = build_query(spark, args).start()
    return run_until_ctrl_c(PROG, spark, query, f"counting topic {args.source_topic} (channel {args.channel}) "
                                                f"into topic {args.sink_topic}")


if __name__ == "__main__":
    sys.exit(main())
