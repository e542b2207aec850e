"""spark/README.md's example pipeline, run as a user runs it: three scripts against a real pynsqd.

``publish_events.py`` posts JSON events over HTTP, ``windowed_counts.py`` (a Spark
Structured Streaming query, nsq in and nsq out) counts them per event-time window,
and ``show_topic.py`` prints the counts with Spark's batch reader. An extra
channel on the source topic sees every event, so the test computes the counts the
pipeline must publish and compares them with what ``show_topic.py`` prints:
after ``--drain``, every published event is in a window shown. The document's order
is kept: the streaming copy (``copy_topic.py``, channel ``spark`` of the same topic)
runs first, and events are published while ``windowed_counts.py`` still starts
Spark. Ctrl-C, as a terminal sends it to the foreground process group, stops each
query in one line, without a traceback.
``publish_events.py`` alone (no Spark) is checked for its progress lines and its
one-line failure when nsqd is down.

spark/README.md's exactly-once block (``copy_topic.py --key`` twice over the same
messages) runs as written, and again without ``--key``; the sink topic is then read
with a plain V2 client: each message once with the key, twice without.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from collections import Counter, defaultdict
from datetime import UTC, datetime

import pytest
import trio

from tests.support.paths import REPO
from tests.support.v2client import consume
from tests.support.waiting import wait_for
from tests.system.test_documented_commands import assert_prints_expected, prepare_block, shell_blocks

EXAMPLES = REPO / "spark" / "examples"
WINDOW_S, WATERMARK_S = 2, 1
RATE, SECONDS = 50, 8


def example_env() -> dict[str, str]:
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), str(REPO / "spark"), env.get("PYTHONPATH")]))
    return env


def post(http: tuple[str, int], path: str) -> None:
    request = urllib.request.Request(f"http://{http[0]}:{http[1]}{path}", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def topic_stats(http: tuple[str, int], topic: str) -> list[dict]:
    """What ``/stats`` says of ``topic``: a list of one topic, empty when there is no such topic."""
    url = f"http://{http[0]}:{http[1]}/stats?format=json&topic={topic}"
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)["topics"] or []


def topic_message_count(http: tuple[str, int], topic: str) -> int:
    return sum(t["message_count"] for t in topic_stats(http, topic))


def publish_events(*args: str) -> subprocess.CompletedProcess:
    """Run ``publish_events.py`` with ``args``; its output captured."""
    return subprocess.run([sys.executable, str(EXAMPLES / "publish_events.py"), *args], env=example_env(),
                          capture_output=True, timeout=60)


def test_publish_events_reports_progress_on_stderr(broker_process):
    broker = broker_process()
    done = publish_events("--http", f"{broker.http[0]}:{broker.http[1]}", "--rate", "20", "--seconds", "2",
                          "--progress", "1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == "published 40 events to events\n"
    assert done.stderr.decode() == ("publish_events.py: 20 events sent in 1 s (20/s)\n"
                                    "publish_events.py: 40 events sent in 2 s (20/s)\n")
    assert topic_message_count(broker.http, "events") == 40


def test_publish_events_with_nsqd_down_fails_in_one_line(tmp_path):
    with socket.socket() as unused:  # a port nothing listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    done = publish_events("--http", f"127.0.0.1:{port}", "--seconds", "1")
    assert done.returncode == 1
    assert done.stdout == b""
    assert done.stderr.decode() == (f"publish_events.py: cannot reach nsqd at "
                                    f"http://127.0.0.1:{port}/mpub?topic=events: Connection refused\n")


def test_publish_events_pointed_at_the_tcp_port_says_so(broker_process):
    """HTTP sent to the TCP port: nsqd's E_BAD_PROTOCOL and a closed connection, which the
    example names as the likely mistake instead of a bare "connection reset"."""
    broker = broker_process()
    tcp = f"{broker.tcp[0]}:{broker.tcp[1]}"
    done = publish_events("--http", tcp, "--seconds", "1")
    assert done.returncode == 1
    assert done.stderr.decode().startswith(f"publish_events.py: nsqd at http://{tcp}/mpub?topic=events did not "
                                           f"answer HTTP ("), done.stderr
    assert done.stderr.decode().endswith(f"); is {tcp} nsqd's HTTP port (4151 by default), not its TCP port "
                                         f"(4150)?\n"), done.stderr
    assert "bad protocol magic 'POST'" in broker.log_text()


def expected_counts(events: list[dict]) -> dict[tuple[str, str], tuple[int, float]]:
    """(window start, kind) -> (events, amount) for the windows the watermark has closed."""
    def millis(text: str) -> int:
        return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)

    watermark = max(millis(e["time"]) for e in events) - WATERMARK_S * 1000
    counts: dict[tuple[str, str], list] = defaultdict(lambda: [0, 0.0])
    for event in events:
        start = millis(event["time"]) // (WINDOW_S * 1000) * WINDOW_S * 1000
        if start + WINDOW_S * 1000 <= watermark:
            start_text = datetime.fromtimestamp(start / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
            entry = counts[(start_text, event["kind"])]
            entry[0] += 1
            entry[1] += event["amount"]
    return {key: (n, amount) for key, (n, amount) in counts.items()}


class Example:
    """A long-running example script in its own process group, as a shell runs a foreground job
    (Ctrl-C signals the whole group); its stderr in a file, read as it grows."""

    def __init__(self, tmp_path, script: str, *args: str):
        self.name = script
        self.log_path = tmp_path / f"{script}.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen([sys.executable, str(EXAMPLES / script), *args], env=example_env(),
                                            stdout=log, stderr=log, cwd=tmp_path, start_new_session=True)

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def wait_for_line(self, start: str, timeout: float = 180) -> str:
        """The first line of its output that starts with ``start``; fails if it exits first."""

        def found() -> str | None:  # another process's output: only polling sees it
            for line in self.text().splitlines():
                if line.startswith(start):
                    return line
            assert self.process.poll() is None, self.text()
            return None

        return await wait_for(found, timeout, poll=0.2)

    async def ctrl_c(self, timeout: float = 60) -> str:
        """SIGINT to its process group, as Ctrl-C in a terminal; what it printed after, once it exited."""
        before = self.log_path.stat().st_size
        os.killpg(self.process.pid, signal.SIGINT)
        await wait_for(lambda: self.process.poll() is not None, timeout, poll=0.2)
        return self.log_path.read_bytes()[before:].decode(errors="replace")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.deadline(1200)  # two Spark queries started one after the other, each waited for up to minutes
async def test_readme_sequence_counts_every_event_and_ctrl_c_is_quiet(broker_process, tmp_path):
    """spark/README.md's steps in order: the streaming copy first (channel ``spark`` of ``events``),
    stopped with Ctrl-C; then the pipeline, publishing as soon as ``windowed_counts.py`` has
    created its channel, while Spark still starts."""
    broker = broker_process()
    http = f"{broker.http[0]}:{broker.http[1]}"
    nsqd = f"{broker.tcp[0]}:{broker.tcp[1]}"
    env = example_env()
    copy = Example(tmp_path, "copy_topic.py", "--nsqd", nsqd, "--checkpoint", str(tmp_path / "copy-checkpoint"))
    try:
        await copy.wait_for_line("copy_topic.py: ready: copying topic events (channel spark) to topic events_copy")
        after_copy_stop = await copy.ctrl_c()
    finally:
        copy.kill()
    assert (copy.process.returncode, after_copy_stop) == (
        130, "copy_topic.py: stopped; start it again with the same --checkpoint to continue\n")
    assert "Traceback" not in copy.text()
    # which path runs, in the driver's terminal at Spark's default log level (WARN)
    assert "nsq source: the brokers offer leases; executors read the messages\n" in copy.text()

    post(broker.http, "/channel/create?topic=events&channel=audit")  # the test's own witness
    query = Example(tmp_path, "windowed_counts.py", "--nsqd", nsqd, "--checkpoint", str(tmp_path / "checkpoint"),
                    "--window", f"{WINDOW_S} seconds", "--watermark", f"{WATERMARK_S} second", "--trigger", "1 second")
    try:
        await query.wait_for_line("windowed_counts.py: channel windowed_counts of topic events created", timeout=60)
        published = await trio.run_process(
            [sys.executable, str(EXAMPLES / "publish_events.py"), "--http", http, "--rate", str(RATE),
             "--seconds", str(SECONDS), "--late", "0.5", "--seed", "7", "--drain", str(WINDOW_S + WATERMARK_S)],
            env=env, capture_stdout=True, capture_stderr=True,
        )
        assert published.stdout.decode() == f"published {RATE * SECONDS} events and the drain event to events\n"
        assert published.stderr.decode().count(" events sent in ") == SECONDS // 5
        await query.wait_for_line("windowed_counts.py: ready: counting topic events (channel windowed_counts) "
                                  "into topic event_counts; Ctrl-C to stop")
        events = [json.loads(body) for body in await consume(broker, "events", "audit", RATE * SECONDS + 1, timeout=30)]
        assert events[-1]["kind"] == "drain"
        expected = expected_counts(events)
        assert sum(n for n, _ in expected.values()) == RATE * SECONDS  # every event but the drain event


        def all_windows_counted() -> bool:
            assert query.process.poll() is None, query.text()
            return topic_message_count(broker.http, "event_counts") >= len(expected)

        await wait_for(all_windows_counted, 180, poll=1)
        after_stop = await query.ctrl_c()
    finally:
        query.kill()
    assert (query.process.returncode, after_stop) == (
        130, "windowed_counts.py: stopped; start it again with the same --checkpoint to continue\n")

    shown = await trio.run_process(
        [sys.executable, str(EXAMPLES / "show_topic.py"), "--nsqd", nsqd, "--topic", "event_counts"],
        env=env, capture_stdout=True, capture_stderr=True, cwd=tmp_path,
    )
    rows = [json.loads(m) for m in re.findall(rb'\{"start".*?\}', shown.stdout)]
    got = {(r["start"], r["kind"]): (r["events"], r["amount"]) for r in rows}
    assert len(rows) == len(got), "a window was published twice"
    assert set(got) == set(expected)
    assert sum(n for n, _ in got.values()) == RATE * SECONDS
    for key, (n, amount) in expected.items():
        assert got[key][0] == n, key
        assert got[key][1] == pytest.approx(amount, abs=0.011), key


[COPY_TWICE] = [block for block in shell_blocks("spark/README.md")
                if "copy_topic.py" in block.text and "available-now" in block.text]


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("keyed", [True, False], ids=["with-key", "without-key"])
async def test_documented_keyed_copy_run_twice_stores_each_message_once(broker_process, tmp_path, keyed):
    """spark/README.md's block, as written: the same messages copied through two channels with
    ``--key`` are stored once, the second copy's all duplicates. The block without ``--key``
    stores them twice: what the key prevents."""
    text = COPY_TWICE.text if keyed else COPY_TWICE.text.replace("--key ", "")
    assert ("--key " in text) == keyed
    count = int(re.search(r"seq -f 'order %g' (\d+)", text).group(1))
    bodies = [f"order {n}".encode() for n in range(1, count + 1)]
    broker = broker_process()
    script, env = prepare_block(text, broker, tmp_path, example_env())
    with trio.fail_after(600):
        done = await trio.run_process(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env,
                                      capture_stdout=True, capture_stderr=True, check=False)
    out, err = done.stdout.decode(), done.stderr.decode(errors="replace")
    report = f"{script}\nexit {done.returncode}\n{out}\n{err}"
    assert done.returncode == 0, report
    assert "Traceback" not in err, report
    keyed_by = ", keyed by concat(nsqd, '/', id)" if keyed else ""
    assert [line for line in out.splitlines() if line.startswith("copied ")] == [
        f"copied {count} messages of topic orders (channel {channel}) to topic orders_copy{keyed_by}"
        for channel in ("spark", "again")], report
    if keyed:
        assert_prints_expected(COPY_TWICE, out, report)

    # both channels copied everything they held
    [source] = topic_stats(broker.http, "orders")
    assert {c["channel_name"]: (c["depth"], c["in_flight_count"]) for c in source["channels"]} == {
        "spark": (0, 0), "again": (0, 0)}
    [sink] = topic_stats(broker.http, "orders_copy")
    stored = count if keyed else 2 * count
    assert sink["message_count"] == stored
    assert sink.get("duplicate_count") == (count if keyed else None)
    # a consumer of the copy gets each order once with the key (twice without), and nothing more
    got = await consume(broker, "orders_copy", "check", stored, timeout=30)
    assert Counter(got) == {body: stored // count for body in bodies}
    [sink] = topic_stats(broker.http, "orders_copy")
    assert [(c["depth"], c["in_flight_count"], c["message_count"]) for c in sink["channels"]] == [(0, 0, stored)]
