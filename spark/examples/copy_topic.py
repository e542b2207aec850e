"""Copy one nsq topic to another with a Spark Structured Streaming query, until Ctrl-C.

    python spark/examples/copy_topic.py --nsqd 127.0.0.1:4150 --checkpoint /tmp/copy-checkpoint

Reads topic ``events`` through channel ``spark`` and publishes every body to topic
``events_copy``. It creates its channel before Spark starts, so messages published
from then on are copied, and prints ``copy_topic.py: ready: ...`` once the query is
subscribed. Ctrl-C lets the micro-batch under way finish, stops the query (the
messages it held go back to the broker), prints one line and exits with status 130;
started again with the same checkpoint, it continues.
"""

from __future__ import annotations

import argparse
import sys

from pyspark import SparkConf
from streaming_example import create_channel, run_until_ctrl_c, spark_session

PROG = "copy_topic.py"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--nsqd", default="127.0.0.1:4150", help="nsqd TCP address(es) (default %(default)s)")
    parser.add_argument("--source-topic", default="events", help="topic to read (default %(default)s)")
    parser.add_argument("--channel", default="spark", help="channel to read through (default %(default)s)")
    parser.add_argument("--sink-topic", default="events_copy", help="topic to publish to (default %(default)s)")
    parser.add_argument("--checkpoint", required=True, help="Spark checkpoint directory")
    parser.add_argument("--trigger", default="0 seconds", help="processing-time trigger (default: back to back)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    create_channel(PROG, args.nsqd, args.source_topic, args.channel)
    spark = spark_session(SparkConf().setAppName("nsq-copy-topic"))
    events = (spark.readStream.format("nsq")
              .option("nsqd", args.nsqd).option("topic", args.source_topic).option("channel", args.channel)
              .load())
    query = (events.select("body").writeStream.format("nsq")
             .option("nsqd", args.nsqd).option("topic", args.sink_topic)
             .option("checkpointLocation", args.checkpoint)
             .trigger(processingTime=args.trigger).start())
    return run_until_ctrl_c(PROG, spark, query, f"copying topic {args.source_topic} (channel {args.channel}) "
                                                f"to topic {args.sink_topic}")


if __name__ == "__main__":
    sys.exit(main())
