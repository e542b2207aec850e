"""Benchmark the Spark connector: rows per second source -> sink, and one message's latency.

Starts a fresh broker (``python -m broker`` on a temporary data path, or the
command given with ``--broker-cmd``) and a local Spark session, then measures:

- throughput: ``--count`` messages of ``--size`` bytes are published to a topic,
  then a streaming query (Trigger.AvailableNow, ``maxMessagesPerTrigger``
  ``--per-trigger``) copies them to another topic. Reported: rows per second over
  the query's batches, with and without the first batch (Spark's warm-up), and
  the wall time of the whole query.
- latency: a query with a 0-second trigger copies one topic to another; after a
  warm-up, ``--probes`` messages are published one at a time and the time until
  each arrives on the sink topic is recorded.

Usage (from the repository root)::

    python tests/bench/bench_spark.py
    python tests/bench/bench_spark.py --count 200000 --per-trigger 20000 --json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKER_PATH = os.pathsep.join([str(ROOT), str(ROOT / "spark")])
for entry in (str(ROOT / "spark"), str(ROOT)):
    if entry not in sys.path:
        # run as a script from a checkout: import the connector without installing it
        sys.path.insert(0, entry)

from broker.protocol import (  # noqa: E402
    FRAME_TYPE_MESSAGE,
    decode_message,
    encode_fin,
    encode_mpub,
    encode_pub,
    encode_rdy,
    encode_sub,
)
from pyspark_nsq.connection import Connection  # noqa: E402
from pyspark_nsq.options import Address  # noqa: E402

_LISTEN = re.compile(rb"(TCP|HTTP): listening on (\S+)")


def start_broker(command: list[str], data_path: Path, log_path: Path) -> tuple[subprocess.Popen, Address]:
    """The broker process and its TCP address, parsed from its log."""
    log = open(log_path, "wb")
    process = subprocess.Popen(
        [*command, f"--data-path={data_path}", "--tcp-address=127.0.0.1:0",
         "--http-address=127.0.0.1:0"],
        stdout=log, stderr=log, stdin=subprocess.DEVNULL,
    )
    log.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = dict(_LISTEN.findall(log_path.read_bytes()))
        if b"TCP" in found:
            host, _, port = found[b"TCP"].decode().rpartition(":")
            return process, Address(host.strip("[]"), int(port))
        if process.poll() is not None:
            break
        time.sleep(0.05)
    process.kill()
    raise RuntimeError("broker did not start:\n" + log_path.read_text(errors="replace"))


def publish(address: Address, topic: str, bodies: list[bytes], chunk: int = 500) -> None:
    conn = Connection.open(address, {})
    try:
        for start in range(0, len(bodies), chunk):
            conn.send(encode_mpub(topic, bodies[start:start + chunk]))
            conn.read_response()
    finally:
        conn.close()


class Probe:
    """A consumer of the sink topic, read synchronously by the latency loop."""

    def __init__(self, address: Address, topic: str):
        self.conn = Connection.open(address, {})
        self.conn.send(encode_sub(topic, "probe"))
        self.conn.read_response()
        self.conn.send(encode_rdy(100))

    def wait_message(self, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for frame in self.conn.read_frames(deadline - time.monotonic()):
                if frame.frame_type == FRAME_TYPE_MESSAGE:
                    message = decode_message(frame.data)
                    self.conn.send(encode_fin(message.id))
                    return message.body
        raise TimeoutError("no message on the sink topic")


def stream(spark, address: Address, source: str, sink: str, checkpoint: str, trigger: dict,
           **options):
    reader = (spark.readStream.format("nsq").option("nsqd", str(address))
              .option("topic", source).option("channel", "bench"))
    for key, value in options.items():
        reader = reader.option(key, value)
    return (reader.load().select("body").writeStream.format("nsq")
            .option("nsqd", str(address)).option("topic", sink)
            .option("checkpointLocation", checkpoint).trigger(**trigger).start())


def measure_throughput(spark, address: Address, workdir: Path, count: int, size: int,
                       per_trigger: int, in_flight: int) -> dict:
    body = b"x" * size
    publish(address, "tput_in", [body] * count)
    started = time.monotonic()
    query = stream(spark, address, "tput_in", "tput_out", str(workdir / "tput"),
                   {"availableNow": True}, maxMessagesPerTrigger=str(per_trigger),
                   maxInFlight=str(in_flight))
    query.awaitTermination()
    wall = time.monotonic() - started
    batches = [(p["numInputRows"], p["durationMs"]["triggerExecution"] / 1000)
               for p in query.recentProgress if p["numInputRows"]]
    rows = sum(n for n, _ in batches)
    busy = sum(s for _, s in batches)
    warm = batches[1:]
    return {
        "messages": count,
        "size": size,
        "rows": rows,
        "batches": len(batches),
        "query_wall_s": round(wall, 2),
        "rows_per_s": round(rows / busy) if busy else 0,
        "rows_per_s_after_first_batch": round(sum(n for n, _ in warm) / sum(s for _, s in warm))
        if warm else 0,
        "rows_per_s_wall": round(rows / wall),
        "max_in_flight": in_flight,
        "max_messages_per_trigger": per_trigger,
        "batch_ms": [{k: v for k, v in p["durationMs"].items() if v}
                     for p in query.recentProgress if p["numInputRows"]][1:4],
    }


def measure_latency(spark, address: Address, workdir: Path, probes: int) -> dict:
    publish(address, "lat_out", [b"create"])
    probe = Probe(address, "lat_out")
    probe.wait_message(10)
    query = stream(spark, address, "lat_in", "lat_out", str(workdir / "lat"),
                   {"processingTime": "0 seconds"})
    conn = Connection.open(address, {})
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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100_000, help="messages for throughput")
    parser.add_argument("--size", type=int, default=100, help="message body size in bytes")
    parser.add_argument("--per-trigger", type=int, default=20_000, help="maxMessagesPerTrigger")
    parser.add_argument("--in-flight", type=int, default=20_000, help="maxInFlight")
    parser.add_argument("--probes", type=int, default=20, help="latency samples")
    parser.add_argument("--broker-cmd", default=f"{shlex.quote(sys.executable)} -m broker")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [WORKER_PATH,
                                                             os.environ.get("PYTHONPATH")]))
    from pyspark.sql import SparkSession

    with tempfile.TemporaryDirectory(prefix="bench_spark_") as tmp:
        workdir = Path(tmp)
        broker, address = start_broker(shlex.split(args.broker_cmd), workdir / "data",
                                       workdir / "broker.log")
        try:
            spark = (SparkSession.builder.master("local[2]").appName("bench_spark")
                     .config("spark.ui.enabled", "false")
                     .config("spark.ui.showConsoleProgress", "false")
                     .config("spark.sql.shuffle.partitions", "2").getOrCreate())
            spark.sparkContext.setLogLevel("ERROR")
            result = {
                "throughput": measure_throughput(spark, address, workdir, args.count, args.size,
                                                 args.per_trigger, args.in_flight),
                "latency": measure_latency(spark, address, workdir, args.probes),
                "cpus": os.cpu_count(),
                "host": socket.gethostname(),
            }
            spark.stop()
        finally:
            broker.send_signal(signal.SIGTERM)
            try:
                broker.wait(30)
            except subprocess.TimeoutExpired:
                broker.kill()
    if args.json:
        print(json.dumps(result))
        return
    tput, lat = result["throughput"], result["latency"]
    print(f"throughput  {tput['rows']} x {tput['size']} B in {tput['batches']} batches: "
          f"{tput['rows_per_s']} rows/s over batches, {tput['rows_per_s_after_first_batch']} "
          f"rows/s after the first, {tput['rows_per_s_wall']} rows/s wall "
          f"({tput['query_wall_s']} s incl. query start)")
    print(f"latency     {lat['probes']} probes, 0 s trigger: p50 {lat['p50_ms']} ms, "
          f"p90 {lat['p90_ms']} ms, min {lat['min_ms']} ms, max {lat['max_ms']} ms")


if __name__ == "__main__":
    main()
