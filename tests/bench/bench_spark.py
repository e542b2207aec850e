"""Benchmark the Spark connector: streaming copy, batch read, sink, latency.

Starts a fresh broker (``python -m broker`` on a temporary data path, or the
command given with ``--broker-cmd``) and a local Spark session per master in
``--masters``, then measures with the connector's **default options**:

- copy: ``--count`` messages of ``--size`` bytes are queued on a topic, then a
  streaming query (default trigger) copies them to another topic. Polling the
  sink topic's message count in ``/stats`` times the first and the last message
  out: rows/s between them.
  Run once per master (``local[1]``, ``local[2]``) to show scaling with cores.
- keyed copy: the same, right after it on the same master, with the exactly-once
  recipe's key (``concat(nsqd, '/', id)``) as the sink's ``key`` column: keyed
  publishes, which the broker checks against the keys it holds (pynsqd only).
- batch read: ``--count`` messages drained by ``spark.read`` into the noop sink.
- sink: ``--count`` rows of ``--size`` bytes written with ``df.write``.
  Both are timed after an untimed run of ``WARM_UP_ROWS`` (Spark's first start of
  its Python workers).
- latency: a query with a 0-second trigger copies one topic to another; after a
  warm-up, ``--probes`` messages are published one at a time and the time until
  each arrives on the sink topic is recorded.

Usage (from the repository root)::

    python -m tests.bench.bench_spark
    python -m tests.bench.bench_spark --count 200000 --masters 'local[1],local[2]' --json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from broker.protocol import (
    FRAME_TYPE_MESSAGE,
    decode_message,
    encode_fin,
    encode_mpub,
    encode_pub,
    encode_rdy,
    encode_sub,
)
from pyspark_nsq.dial import dial
from pyspark_nsq.options import Address
from tests.support.processes import stop_process
from tests.support.spark_queries import EXACTLY_ONCE_KEY, start_copy

ROOT = Path(__file__).resolve().parents[2]

_LISTEN = re.compile(rb"(TCP|HTTP): listening on (\S+)")


def start_broker(command: list[str], data_path: Path,
                 log_path: Path) -> tuple[subprocess.Popen, Address, str]:
    """The broker process, its TCP address and its HTTP ``host:port``, parsed from its log."""
    log = open(log_path, "wb")
    process = subprocess.Popen(
        [*command, f"--data-path={data_path}", "--tcp-address=127.0.0.1:0",
         "--http-address=127.0.0.1:0"],
        stdout=log, stderr=log, stdin=subprocess.DEVNULL,
        cwd=data_path.parent,  # not a checkout: $PYTHONPATH says which broker runs
    )
    log.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = dict(_LISTEN.findall(log_path.read_bytes()))
        if b"TCP" in found and b"HTTP" in found:
            host, _, port = found[b"TCP"].decode().rpartition(":")
            return process, Address(host.strip("[]"), int(port)), found[b"HTTP"].decode()
        if process.poll() is not None:
            break
        time.sleep(0.05)
    process.kill()
    raise RuntimeError("broker did not start:\n" + log_path.read_text(errors="replace"))


def publish(address: Address, topic: str, bodies: list[bytes], chunk: int = 500) -> None:
    conn = dial(address, {})
    try:
        for start in range(0, len(bodies), chunk):
            conn.send(encode_mpub(topic, bodies[start:start + chunk]))
            conn.read_response()
    finally:
        conn.close()


class Probe:
    """A consumer of the sink topic, read synchronously by the latency loop."""

    def __init__(self, address: Address, topic: str):
        self.conn = dial(address, {})
        self.conn.send(encode_sub(topic, "probe"))
        self.conn.read_response()
        self.conn.send(encode_rdy(100))

    def wait_message(self, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for frame_type, payload in self.conn.read(deadline - time.monotonic()):
                if frame_type == FRAME_TYPE_MESSAGE:
                    message = decode_message(payload)
                    self.conn.send(encode_fin(message.id))
                    return message.body
        raise TimeoutError("no message on the sink topic")


class TopicCounter:
    """Polls the broker's ``/stats`` on a thread for a topic's message count and notes
    when the first message and the ``expect``-th were published to it. No consumer
    reads the topic, so the broker does no more work than the pipeline gives it."""

    def __init__(self, http: str, topic: str, expect: int, interval: float = 0.01):
        self.expect = expect
        self.count = 0
        self.first: float | None = None
        self.last: float | None = None
        self._url = f"http://{http}/stats?format=json&topic={topic}"
        self._interval = interval
        self._stopped = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop polling (the thread ends after its current poll)."""
        self._stopped = True

    def _run(self) -> None:
        while self.count < self.expect and not self._stopped:
            with urllib.request.urlopen(self._url, timeout=10) as answer:
                topics = json.load(answer)["topics"]
            now = time.monotonic()
            count = topics[0]["message_count"] if topics else 0
            if count and self.first is None:
                self.first = now
            if count > self.count:
                self.count, self.last = count, now
            time.sleep(self._interval)

    def wait(self, timeout: float, query=None) -> None:
        """Return once ``expect`` messages were counted; raises TimeoutError after ``timeout``
        seconds, and RuntimeError as soon as ``query`` (the streaming query that publishes
        them, if any) has stopped."""
        deadline = time.monotonic() + timeout
        while self._thread.is_alive() and time.monotonic() < deadline:
            self._thread.join(0.5)
            if query is not None and not query.isActive:
                raise RuntimeError(f"the query stopped: {query.exception()}")
        if self.count < self.expect:
            raise TimeoutError(f"only {self.count} of {self.expect} messages reached the sink")


def measure_copy(spark, address: Address, http: str, workdir: Path, count: int, size: int,
                 tag: str, key: str | None = None) -> dict:
    """Streaming copy of a queued backlog with default options (and ``key`` as the sink's
    ``key`` column, when given); rows/s first to last row out."""
    source, sink = f"copy_in_{tag}", f"copy_out_{tag}"
    publish(address, source, [b"x" * size] * count)
    watch = TopicCounter(http, sink, count)
    started = time.monotonic()
    query = start_copy(spark, str(address), source, sink, str(workdir / f"copy_{tag}"), channel="bench",
                       trigger={"processingTime": "0 seconds"}, key=key)
    try:
        watch.wait(600, query)
        deadline = time.monotonic() + 30
        while (sum(p["numInputRows"] for p in query.recentProgress) < count
               and time.monotonic() < deadline):
            time.sleep(0.1)  # the last batch's progress is reported after its commit
    finally:
        watch.stop()
        query.stop()
    assert watch.first is not None and watch.last is not None
    batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    return {
        "rows": watch.count,
        "rows_per_s": round(watch.count / max(watch.last - watch.first, 1e-9)),
        "first_row_after_s": round(watch.first - started, 2),
        "batches": batches,
    }


#: Rows of the untimed warm-up run before a timed batch read or write, so that the
#: timing leaves out Spark's first start of its Python workers.
WARM_UP_ROWS = 10_000


def measure_batch_read(spark, address: Address, count: int, size: int) -> dict:
    """``spark.read`` of a queued backlog into the noop sink (after an untimed warm-up)."""
    def read(rows: int) -> float:
        publish(address, "read_in", [b"r" * size] * rows)
        frame = (spark.read.format("nsq").option("nsqd", str(address)).option("topic", "read_in")
                 .option("channel", "bench").option("maxMessages", str(rows)).load())
        started = time.monotonic()
        frame.write.format("noop").mode("overwrite").save()
        return time.monotonic() - started

    read(WARM_UP_ROWS)
    elapsed = read(count)
    return {"rows": count, "rows_per_s": round(count / elapsed), "seconds": round(elapsed, 2)}


def measure_sink(spark, address: Address, http: str, count: int, size: int) -> dict:
    """``df.write`` of cached rows to a topic (after an untimed warm-up)."""
    def write(rows: int, topic: str) -> float:
        frame = spark.range(rows).selectExpr(f"repeat('s', {size}) AS body").cache()
        frame.count()
        started = time.monotonic()
        frame.write.format("nsq").option("nsqd", str(address)).option("topic", topic) \
            .mode("append").save()
        elapsed = time.monotonic() - started
        frame.unpersist()
        return elapsed

    write(WARM_UP_ROWS, "sink_warm_up")
    watch = TopicCounter(http, "sink_out", count)
    elapsed = write(count, "sink_out")
    watch.wait(60)
    return {"rows": count, "rows_per_s": round(count / elapsed), "seconds": round(elapsed, 2)}


def measure_latency(spark, address: Address, workdir: Path, probes: int) -> dict:
    publish(address, "lat_out", [b"create"])
    probe = Probe(address, "lat_out")
    probe.wait_message(10)
    query = start_copy(spark, str(address), "lat_in", "lat_out", str(workdir / "lat"), channel="bench",
                       trigger={"processingTime": "0 seconds"})
    conn = dial(address, {})
    try:
        # Warm-up: the first batches pay for Spark's worker start.
        for index in range(3):
            conn.send(encode_pub("lat_in", b"warm-%d" % index))
            conn.read_response()
            probe.wait_message(120)
        samples = []
        for index in range(probes):
            started = time.perf_counter()
            conn.send(encode_pub("lat_in", b"probe-%d" % index))
            conn.read_response()
            probe.wait_message(60)
            samples.append(time.perf_counter() - started)
    finally:
        conn.close()
        query.stop()
    samples.sort()
    return {
        "probes": probes,
        "p50_ms": round(statistics.median(samples) * 1000, 1),
        "p90_ms": round(samples[int(0.9 * (len(samples) - 1))] * 1000, 1),
        "min_ms": round(samples[0] * 1000, 1),
        "max_ms": round(samples[-1] * 1000, 1),
    }


def session(master: str):
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(master).appName("bench_spark")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=200_000, help="messages per measurement")
    parser.add_argument("--size", type=int, default=100, help="message body size in bytes")
    parser.add_argument("--masters", default="local[1],local[2]",
                        help="Spark masters for the streaming copy, comma-separated; the last "
                             "one also runs the batch read, sink and latency measurements")
    parser.add_argument("--probes", type=int, default=20, help="latency samples")
    parser.add_argument("--broker-cmd", default=f"{shlex.quote(sys.executable)} -m broker")
    parser.add_argument("--checkout", type=Path, default=ROOT,
                        help="the checkout whose broker and connector run (default: this one), "
                             "to compare two versions side by side with the same benchmark")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    checkout = args.checkout.resolve()
    worker_path = os.pathsep.join([str(checkout), str(checkout / "spark")])
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [worker_path,
                                                             os.environ.get("PYTHONPATH")]))
    masters = [m.strip() for m in args.masters.split(",") if m.strip()]
    result: dict = {"checkout": str(checkout), "count": args.count, "size": args.size, "copy": {},
                    "copy_keyed": {}, "cpus": os.cpu_count(), "host": socket.gethostname()}
    with tempfile.TemporaryDirectory(prefix="bench_spark_") as tmp:
        workdir = Path(tmp)
        broker, address, http = start_broker(shlex.split(args.broker_cmd), workdir / "data",
                                       workdir / "broker.log")
        try:
            for index, master in enumerate(masters):
                spark = session(master)
                tag = re.sub(r"\W", "", master)
                result["copy"][master] = measure_copy(spark, address, http, workdir, args.count,
                                                      args.size, tag)
                try:
                    result["copy_keyed"][master] = measure_copy(spark, address, http, workdir, args.count, args.size,
                                                                f"{tag}_keyed", key=EXACTLY_ONCE_KEY)
                except RuntimeError as exc:  # a broker (nsqd) or a connector (--checkout) without keys
                    result["copy_keyed"][master] = {"error": str(exc).splitlines()[0][:300]}
                if index == len(masters) - 1:
                    result["master"] = master
                    result["batch_read"] = measure_batch_read(spark, address, args.count, args.size)
                    result["sink"] = measure_sink(spark, address, http, args.count, args.size)
                    result["latency"] = measure_latency(spark, address, workdir, args.probes)
                spark.stop()
        finally:
            stop_process(broker, 30)
    if args.json:
        print(json.dumps(result))
        return
    for master, copy in result["copy"].items():
        keyed = result["copy_keyed"][master]
        print(f"copy        {master}: {copy['rows']} x {args.size} B, {copy['rows_per_s']} rows/s "
              f"first to last row out, batches {copy['batches']}")
        if "error" in keyed:
            print(f"keyed copy  {master}: not measured: {keyed['error']}")
        else:
            print(f"keyed copy  {master}: {keyed['rows']} x {args.size} B, {keyed['rows_per_s']} rows/s "
                  f"({keyed['rows_per_s'] / max(copy['rows_per_s'], 1):.2f} of the copy's), "
                  f"batches {keyed['batches']}")
    print(f"batch read  {result['master']}: {result['batch_read']['rows_per_s']} rows/s")
    print(f"sink        {result['master']}: {result['sink']['rows_per_s']} rows/s")
    lat = result["latency"]
    print(f"latency     {lat['probes']} probes, 0 s trigger: p50 {lat['p50_ms']} ms, "
          f"p90 {lat['p90_ms']} ms, min {lat['min_ms']} ms, max {lat['max_ms']} ms")


if __name__ == "__main__":
    main()
