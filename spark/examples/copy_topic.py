"""Copy one nsq topic to another with a Spark Structured Streaming query, until Ctrl-C.

    python spark/examples/copy_topic.py --nsqd 127.0.0.1:4150 --checkpoint /tmp/copy-checkpoint

Reads topic ``events`` through channel ``spark`` and publishes every body to topic
``events_copy``. It creates its channel before Spark starts, so messages published
from then on are copied, and prints ``copy_topic.py: ready: ...`` once the query is
subscribed. Ctrl-C lets the micro-batch under way finish, stops the query (the
messages it held go back to the broker), prints one line and exits with status 130;
started again with the same checkpoint, it continues.

``--key`` publishes each message keyed by the nsqd it was read from and its id (a
pynsqd extension): the sink topic stores a key once within the broker's
``--dedup-window``, so a message copied again (a batch Spark retries or replays, a
message the channel delivers again, a second copy of the same messages) is not
stored twice. ``--trigger available-now`` copies what the channel holds when the
query starts, then prints how many messages it copied and exits with status 0.
"""

from __future__ import annotations

import argparse
import sys

from pyspark import SparkConf
from streaming_example import create_channel, run_until_ctrl_c, spark_session

PROG = "copy_topic.py"
#: The ``--trigger`` that copies what the channel holds, then ends the query.
AVAILABLE_NOW = "available-now"
#: The key of ``--key``: a message id is unique on its nsqd, but several nodes of a cluster
#: may share a node id (the default one comes from the host name), hence the address too.
KEY = "concat(nsqd, '/', id)"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--nsqd", default="127.0.0.1:4150", help="nsqd TCP address(es) (default %(default)s)")
    parser.add_argument("--source-topic", default="events", help="topic to read (default %(default)s)")
    parser.add_argument("--channel", default="spark", help="channel to read through (default %(default)s)")
    parser.add_argument("--sink-topic", default="events_copy", help="topic to publish to (default %(default)s)")
    parser.add_argument("--checkpoint", required=True, help="Spark checkpoint directory")
    parser.add_argument("--key", action="store_true",
                        help=f"publish each message keyed by {KEY} (pynsqd only): the sink topic stores "
                             "each message once, however often it is copied within the broker's --dedup-window")
    parser.add_argument("--trigger", default="0 seconds",
                        help=f"processing-time trigger (default: back to back), or {AVAILABLE_NOW}: copy what "
                             "the channel holds now, then exit")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    create_channel(PROG, args.nsqd, args.source_topic, args.channel)
    spark = spark_session(SparkConf().setAppName("nsq-copy-topic"))
    events = (spark.readStream.format("nsq")
              .option("nsqd", args.nsqd).option("topic", args.source_topic).option("channel", args.channel)
              .load())
    rows = events.selectExpr("body", f"{KEY} AS key") if args.key else events.select("body")
    writer = (rows.writeStream.format("nsq")
              .option("nsqd", args.nsqd).option("topic", args.sink_topic)
              .option("checkpointLocation", args.checkpoint))
    if args.trigger == AVAILABLE_NOW:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=args.trigger)
    query = writer.start()
    what = f"topic {args.source_topic} (channel {args.channel}) to topic {args.sink_topic}"
    status = run_until_ctrl_c(PROG, spark, query, f"copying {what}" + (", keyed" if args.key else ""))
    if status == 0:  # available-now: the query copied what the channel held and ended
        copied = sum(progress["numInputRows"] for progress in query.recentProgress)
        spark.stop()
        print(f"copied {copied} messages of {what}" + (f", keyed by {KEY}" if args.key else ""))
    return status


if __name__ == "__main__":
    sys.exit(main())
