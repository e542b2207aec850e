"""What the long-running examples share: their channels created first, a Spark session
that Ctrl-C leaves alone, a ready line, and a quiet stop on Ctrl-C.

A channel gets only the messages published after it exists. Spark takes half a
minute to start on a small machine, so each example creates its channel (a SUB
over TCP creates it, and it stays when the connection closes) before it starts
Spark: events published meanwhile wait in the channel instead of going only to
the topic's other channels. Once the query has run its first trigger, the
connector is subscribed and the example prints its ready line.
"""

from __future__ import annotations

import signal
import sys
import threading
import time

from pyspark import SparkConf, SparkContext
from pyspark.java_gateway import launch_gateway
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from broker.client import Address, NsqError, connect
from broker.protocol import encode_cls, encode_sub

#: Seconds Ctrl-C waits for the micro-batch under way before stopping the query.
STOP_WAIT = 60.0
#: How often the examples look for Ctrl-C and for the query's first trigger.
POLL_S = 0.2


def create_channel(prog: str, nsqd: str, topic: str, channel: str) -> None:
    """Create ``topic`` and ``channel`` on every nsqd of ``nsqd`` (comma-separated ``host:port``)
    by subscribing once, and say so on stderr. When an nsqd cannot be reached, says so in one
    line and exits with status 1 (SystemExit)."""
    for item in nsqd.split(","):
        host, _, port = item.strip().rpartition(":")
        try:
            conn = connect(Address(host.strip("[]"), int(port)), {}, user_agent=prog)
            try:
                conn.send(encode_sub(topic, channel))
                conn.read_response()
                conn.send(encode_cls())
                conn.read_response()
            finally:
                conn.close()
        except NsqError as exc:
            print(f"{prog}: cannot create channel {channel} of topic {topic}: {exc}", file=sys.stderr)
            raise SystemExit(1) from exc
    print(f"{prog}: channel {channel} of topic {topic} created on {nsqd}; events published from now on "
          "are kept for this query", file=sys.stderr, flush=True)


def spark_session(conf: SparkConf) -> SparkSession:
    """A Spark session whose JVM runs in a session of its own.

    Ctrl-C in a terminal signals the whole foreground process group. Spark's Python
    workers, started by the JVM, would each die of it with a traceback; out of that
    group, only this driver sees it and stops the query in order.
    """
    # the console progress bar would share a line with the example's own
    conf = conf.set("spark.ui.showConsoleProgress", "false")
    SparkContext(conf=conf, gateway=launch_gateway(conf, popen_kwargs={"start_new_session": True}))
    spark = SparkSession.builder.getOrCreate()
    # Spark's INFO lines of every micro-batch would bury the example's own
    spark.sparkContext.setLogLevel("WARN")
    return spark


def run_until_ctrl_c(prog: str, spark: SparkSession, query: StreamingQuery, ready: str) -> int:
    """Print ``prog: ready: <ready>`` once ``query`` has run its first trigger, then wait for
    Ctrl-C; stop the query and Spark in order and print one line. Returns the exit status:
    130 after Ctrl-C, 0 when the query ended by itself. Raises the query's error when it failed.
    """
    # after the SparkContext, which installs its own handler (cancel the jobs, raise KeyboardInterrupt)
    interrupted = threading.Event()
    signal.signal(signal.SIGINT, lambda signum, frame: interrupted.set())
    said_ready = False
    while query.isActive and not interrupted.wait(POLL_S):
        if not said_ready and (query.lastProgress is not None
                               or query.status["message"].startswith("Waiting")):
            print(f"{prog}: ready: {ready}; Ctrl-C to stop", file=sys.stderr, flush=True)
            said_ready = True
    if not interrupted.is_set():
        query.awaitTermination()  # raises the reason the query failed
        return 0
    spark.sparkContext.setLogLevel("ERROR")  # the stop warns of jobs it finds already finished
    # stopping in the middle of a micro-batch aborts its write (it is published again on the
    # next start): let the batch under way finish first, if it does within a while
    deadline = time.monotonic() + STOP_WAIT
    while query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(POLL_S / 4)
    query.stop()
    spark.stop()
    print(f"{prog}: stopped; start it again with the same --checkpoint to continue", file=sys.stderr, flush=True)
    return 130
