"""Print the messages queued in a channel of an nsq topic, with Spark's batch reader.

    python spark/examples/show_topic.py --nsqd 127.0.0.1:4150 --topic event_counts

Reading consumes: the messages shown are FIN'd. Use a channel of its own (the
default ``show``) so that other consumers of the topic still get every message.
"""

from __future__ import annotations

import argparse

from pyspark.sql import SparkSession
from pyspark.sql import functions as F


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nsqd", default="127.0.0.1:4150")
    parser.add_argument("--topic", default="event_counts")
    parser.add_argument("--channel", default="show")
    parser.add_argument("--max", default="1000", help="most messages to read")
    args = parser.parse_args(argv)

    spark = SparkSession.builder.appName("nsq-show-topic").getOrCreate()
    (
        spark.read.format("nsq")
        .option("nsqd", args.nsqd)
        .option("topic", args.topic)
        .option("channel", args.channel)
        .option("maxMessages", args.max)
        .load()
        .select("timestamp", "attempts", F.col("body").cast("string").alias("body"))
        .orderBy("timestamp")
        .show(int(args.max), truncate=False)
    )


if __name__ == "__main__":
    main()
