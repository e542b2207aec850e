"""Streaming queries of the Spark connector, shared by the Spark system tests and the Spark benchmark.

:func:`start_copy` starts a copy in the caller's Spark session. :func:`run_copy_process`
runs one in a process group of its own (the driver, its JVM and its Python workers),
which a test kills whole with :func:`kill_group` and starts again from the checkpoint;
the process's code is :func:`copy_process_main`.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["EXACTLY_ONCE_KEY", "start_copy", "run_copy_process", "kill_group", "copy_process_main"]

#: The key of the exactly-once copy: a message id is unique on its nsqd, but several nodes
#: of a cluster may share a node id (the default one comes from the host name), so the id
#: is qualified with the address of the nsqd it came from.
EXACTLY_ONCE_KEY = "concat(nsqd, '/', id)"


def start_copy(spark: Any, nsqd: str, source: str, sink: str, checkpoint: str, *, channel: str,
               trigger: dict, key: str | None = None, sink_lookupd: str | None = None, **source_options: str) -> Any:
    """Start a streaming query that copies the bodies of topic ``source`` (read on ``channel``)
    to topic ``sink``, both on the broker at ``nsqd`` (``host:port``); with ``sink_lookupd``
    (an nsqlookupd's HTTP ``host:port``) the sink publishes to the nodes it lists instead.

    ``key`` is an SQL expression over the source's columns published as the ``key`` column
    (:data:`EXACTLY_ONCE_KEY`), None for an unkeyed copy. ``source_options`` are more options
    of the source (``maxMessagesPerTrigger="700"``), ``trigger`` the keywords of
    ``DataStreamWriter.trigger``. Returns the running ``StreamingQuery``; the caller stops it.
    """
    reader = (spark.readStream.format("nsq").option("nsqd", nsqd)
              .option("topic", source).option("channel", channel))
    for name, value in source_options.items():
        reader = reader.option(name, value)
    rows = reader.load()
    rows = rows.select("body") if key is None else rows.selectExpr("body", f"{key} AS key")
    return (rows.writeStream.format("nsq")
            .option(*(("nsqd", nsqd) if sink_lookupd is None else ("lookupd", sink_lookupd))).option("topic", sink)
            .option("checkpointLocation", checkpoint).trigger(**trigger).start())


def run_copy_process(nsqd: str, source: str, sink: str, checkpoint: Path, log: Path, *, worker_path: str,
                     key: str | None = None, restarts: int = 0, sink_lookupd: str | None = None) -> subprocess.Popen:
    """:func:`copy_process_main` in a process group of its own, so a test can SIGKILL all of it.

    It reads ``source`` on channel ``spark`` 4,000 messages per micro-batch with a 3-second
    ``msgTimeoutMs`` (what a killed query leased comes back soon), writes to ``sink`` with
    ``key`` (see :func:`start_copy`; to the nodes ``sink_lookupd`` lists, when given), and appends its output to ``log``. ``restarts``: how
    many times it starts the query again from its checkpoint after it fails (the broker
    went away), once the broker accepts connections again. ``worker_path`` goes first on
    ``PYTHONPATH``, for the driver and for the Python workers Spark starts.
    """
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join(filter(None, [worker_path, os.environ.get("PYTHONPATH")])))
    argv = [nsqd, source, sink, str(checkpoint), f"--restarts={restarts}"]
    if key is not None:
        argv.append(f"--key={key}")
    if sink_lookupd is not None:
        argv.append(f"--sink-lookupd={sink_lookupd}")
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-c", "import sys; from tests.support.spark_queries import copy_process_main; "
                                   "copy_process_main(sys.argv[1:])", *argv],
            env=env, stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True,
        )


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL a process started with ``start_new_session`` and everything in its group (the
    pipeline, its JVM and its Python workers)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(30)


#: How long the copy process waits for the broker to accept connections again before a restart.
_BROKER_BACK_S = 120.0


def copy_process_main(argv: list[str]) -> None:
    """The copy process of :func:`run_copy_process`: a ``local[2]`` session and one query,
    started again from its checkpoint after a failure, ``--restarts`` times at most."""
    from pyspark.errors import StreamingQueryException
    from pyspark.sql import SparkSession

    parser = argparse.ArgumentParser()
    parser.add_argument("nsqd")
    parser.add_argument("source")
    parser.add_argument("sink")
    parser.add_argument("checkpoint")
    parser.add_argument("--key")
    parser.add_argument("--restarts", type=int, default=0)
    parser.add_argument("--sink-lookupd")
    args = parser.parse_args(argv)
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    host, _, port = args.nsqd.rpartition(":")
    for run in range(args.restarts + 1):
        query = start_copy(spark, args.nsqd, args.source, args.sink, args.checkpoint, channel="spark",
                           trigger={"processingTime": "0 seconds"}, key=args.key, sink_lookupd=args.sink_lookupd,
                           maxMessagesPerTrigger="4000", msgTimeoutMs="3000")
        print(f"copy: query started (run {run + 1})", flush=True)
        try:
            query.awaitTermination()
            return
        except StreamingQueryException as exc:
            if run == args.restarts:
                raise
            print(f"copy: query failed ({str(exc).splitlines()[0][:200]}); restarting from its checkpoint",
                  flush=True)
        _wait_for_listener(host.strip("[]"), int(port))


def _wait_for_listener(host: str, port: int) -> None:
    """Return once ``host:port`` accepts a TCP connection; raises TimeoutError after a while."""
    deadline = time.monotonic() + _BROKER_BACK_S
    while True:
        try:
            socket.create_connection((host, port), 1.0).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on {host}:{port}") from None
            time.sleep(0.1)  # another process: only trying tells when it listens
