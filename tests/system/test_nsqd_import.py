"""pynsqd started on the data directory nsq 1.3.0's nsqd left: every queued message is delivered once.

nsqd fills topics and channels (spilled with ``--mem-queue-size=0``, held in memory until its
graceful exit, deferred, in flight at its exit, a topic with no channel, a paused channel,
several segment files), then stops on SIGTERM. nsqd itself is the oracle: started on a copy
of the directory, the messages it delivers (id, body, timestamp, attempts) are exactly the
ones pynsqd must deliver from the original.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from broker.core.message import RECORD_OVERHEAD
from broker.protocol import encode_dpub, encode_mpub
from tests.support.draining import drain
from tests.support.http_client import create_channel, request
from tests.support.nsq_programs import nsq_bin, nsq_bin_missing
from tests.support.nsqd_files import nsqd_payload, segment_bytes, write_nsqd_metadata, write_nsqd_queue
from tests.support.processes import BrokerProcess, broker_args, stop_process
from tests.support.v2client import V2Client, connect, subscriber
from tests.support.waiting import wait_until

pytestmark = pytest.mark.skipif(nsq_bin_missing() is not None, reason=nsq_bin_missing() or "")

#: What each channel must deliver: (topic, channel) -> bodies. "nochan/late" is created only
#: after the move: its messages waited in the topic's own queue.
Delivery = dict[tuple[str, str], list[bytes]]


def _nsqd(data: Path, log: Path, *flags: str) -> BrokerProcess:
    folder = nsq_bin()
    assert folder is not None
    return BrokerProcess(data, *flags, log_path=log, program=[str(folder / "nsqd")])


async def _post(address: tuple[str, int], target: str) -> None:
    reply = await request(address, "POST", target)
    assert reply.status == 200, (target, reply.status, reply.body)


async def _mpub(client: V2Client, topic: str, bodies: list[bytes]) -> None:
    await client.send(encode_mpub(topic, bodies))
    await client.expect_response(b"OK")


async def _dpub_each(client: V2Client, topic: str, bodies: list[bytes], defer_ms: int = 3_600_000) -> None:
    for body in bodies:
        await client.send(encode_dpub(topic, defer_ms, body))
        await client.expect_response(b"OK")


async def _fill_nsqd(tmp_path: Path, data: Path) -> tuple[Delivery, dict[bytes, int]]:
    """Run nsqd twice on ``data``; what every channel must deliver, and the attempts of the
    messages that were in flight at its exit."""
    want: Delivery = {}
    # 1: everything spilled to disk as it is published
    nsqd = _nsqd(data, tmp_path / "nsqd1.log", "--mem-queue-size=0").start()
    try:
        await create_channel(nsqd.http, "spilled", "c")
        client = await connect(nsqd.tcp)
        bodies = [b"spilled-%d" % i for i in range(40)]
        await _mpub(client, "spilled", bodies)
        want["spilled", "c"] = bodies
        await client.aclose()
    finally:
        assert nsqd.terminate() == 0
    # 2: small memory queues and small segment files; memory is written out at the exit
    nsqd = _nsqd(data, tmp_path / "nsqd2.log", "--mem-queue-size=5", "--max-bytes-per-file=2048",
                 "--msg-timeout=60s").start()
    in_flight: dict[bytes, int] = {}
    try:
        for channel in ("c1", "c2"):
            await create_channel(nsqd.http, "mixed", channel)
        await create_channel(nsqd.http, "paused", "p")
        await _post(nsqd.http, "/channel/pause?topic=paused&channel=p")
        await _post(nsqd.http, "/topic/create?topic=nochan")
        client = await connect(nsqd.tcp)
        mixed = [b"mixed-%d" % i for i in range(60)]
        await _mpub(client, "mixed", mixed)
        deferred = [b"deferred-%d" % i for i in range(3)]
        await _dpub_each(client, "mixed", deferred)
        nochan = [b"nochan-%d" % i for i in range(25)]
        await _mpub(client, "nochan", nochan)
        paused = [b"paused-%d" % i for i in range(12)]
        await _mpub(client, "paused", paused)
        more = [b"spilled-more-%d" % i for i in range(8)]
        await _mpub(client, "spilled", more)  # memory this time, behind what run 1 spilled
        await client.aclose()
        want["mixed", "c1"] = want["mixed", "c2"] = mixed + deferred
        want["nochan", "late"] = nochan
        want["paused", "p"] = paused
        want["spilled", "c"] = want["spilled", "c"] + more
        # a consumer that takes four messages and never finishes them
        holder = await subscriber(nsqd, "mixed", "c1", rdy=4)
        for msg in await holder.read_messages(4):
            in_flight[msg.id] = msg.attempts
    finally:
        assert nsqd.terminate() == 0
    await holder.aclose()
    return want, in_flight


async def _drain(address: tuple[str, int], http: tuple[str, int], want: Delivery) -> dict[tuple[str, str], list]:
    """Subscribe to every channel of ``want``, take as many messages as it must deliver and FIN
    them; then every queue of the broker must be empty."""
    await _post(http, "/channel/unpause?topic=paused&channel=p")
    got = {(topic, channel): await _drain_many(address, topic, channel, len(bodies))
           for (topic, channel), bodies in want.items()}

    async def all_empty() -> bool:
        stats = (await request(http, "GET", "/stats?format=json")).json()
        return all(t["depth"] == 0 and all((c["depth"], c["in_flight_count"], c["deferred_count"]) == (0, 0, 0)
                                           for c in t["channels"]) for t in stats["topics"])

    await wait_until(all_empty, timeout=10)
    return got


def _key(msg) -> tuple[bytes, bytes, int, int]:
    return (msg.id, msg.body, msg.timestamp, msg.attempts)


@pytest.mark.parametrize("mode", [(), ("--durable",)], ids=["default", "durable"])
async def test_pynsqd_delivers_everything_nsqd_left_queued(tmp_path, mode):
    data = tmp_path / "data"
    want, in_flight = await _fill_nsqd(tmp_path, data)
    depths = {meta.name.removesuffix(".diskqueue.meta.dat"): int(meta.read_text().split()[0])
              for meta in data.glob("*.diskqueue.meta.dat")}
    assert {"spilled:c", "mixed:c1", "mixed:c2", "nochan", "paused:p"} <= set(depths)
    nsqds_bad = set(data.glob("*.bad"))
    oracle_data = tmp_path / "oracle"
    shutil.copytree(data, oracle_data)

    oracle = _nsqd(oracle_data, tmp_path / "oracle.log").start()
    try:
        expected = await _drain(oracle.tcp, oracle.http, want)
    finally:
        oracle.kill()

    pynsqd = BrokerProcess(data, *mode, log_path=tmp_path / "pynsqd.log").start()
    try:
        got = await _drain(pynsqd.tcp, pynsqd.http, want)
    finally:
        assert pynsqd.terminate() == 0

    for where, bodies in want.items():
        assert sorted(m.body for m in got[where]) == sorted(bodies), where
        assert Counter(m.id for m in got[where]).most_common(1)[0][1] == 1, where
        assert sorted(map(_key, got[where])) == sorted(map(_key, expected[where])), where
    # the four messages in flight at nsqd's exit come back with the attempt nsqd counted, plus this one
    redelivered = {m.id: m.attempts for m in got["mixed", "c1"] if m.id in in_flight}
    assert redelivered == {msg_id: attempts + 1 for msg_id, attempts in in_flight.items()}
    assert all(m.attempts == 1 for m in got["spilled", "c"])

    log = pynsqd.log_text()
    for name, depth in depths.items():  # one line per queue, counting what nsqd's checkpoint counts
        assert log.count(f"nsqd import: queue {name}: imported {depth} messages\n") == 1, (name, depth, log)
    assert not list(data.glob("*.nsqd-import.*"))
    assert set(data.glob("*.bad")) == nsqds_bad  # nsqd's own, if it set any aside; none of pynsqd's

    # nothing is imported twice: a restart finds pynsqd's own (empty) queues only
    again = BrokerProcess(data, *mode, log_path=tmp_path / "again.log").start()
    try:
        stats = (await request(again.http, "GET", "/stats?format=json")).json()
        assert [t["depth"] for t in stats["topics"]] == [0] * len(stats["topics"])
        assert all(c["depth"] == 0 for t in stats["topics"] for c in t["channels"])
    finally:
        assert again.terminate() == 0
    assert "nsqd import" not in again.log_text()


async def _drain_many(address: tuple[str, int], topic: str, channel: str, count: int) -> list:
    """``count`` messages of a channel, each FIN'd, and whatever else arrives with them (nothing,
    if the broker delivers each message once)."""
    client = await subscriber(address, topic, channel, rdy=2000, timeout=10.0)
    got: list = []
    await drain(client, lambda: len(got) >= count, on_message=lambda _, msg: got.append(msg))
    got.extend(await client.sync())
    await client.aclose()
    return got


def _imported_bytes(data: Path, name: str) -> int:
    """Bytes in pynsqd's segment files of queue ``name`` (nsqd's have no "PDQS" header)."""
    total = 0
    for path in data.glob(f"{name}.diskqueue.*.dat"):
        try:
            with open(path, "rb") as f:
                if f.read(4) == b"PDQS":
                    total += path.stat().st_size
        except FileNotFoundError:  # renamed under our feet
            pass
    return total


async def test_kill_9_during_the_import_loses_and_duplicates_nothing(tmp_path):
    data = tmp_path / "data"
    big = [b"big-%07d" % i for i in range(60_000)]
    quiet = [b"quiet-%06d" % i for i in range(10_000)]
    nsqd = _nsqd(data, tmp_path / "nsqd.log", "--mem-queue-size=0", "--max-bytes-per-file=1048576").start()
    try:
        await create_channel(nsqd.http, "big", "c")
        await _post(nsqd.http, "/topic/create?topic=quiet")
        client = await connect(nsqd.tcp, timeout=30.0)
        for start in range(0, len(big), 20_000):
            await _mpub(client, "big", big[start:start + 20_000])
        await _mpub(client, "quiet", quiet)
        await client.aclose()
    finally:
        assert nsqd.terminate() == 0
    full = sum(p.stat().st_size for p in data.glob("*.diskqueue.0*.dat"))  # nsqd's bytes of every queue

    # Kill pynsqd as soon as the import reaches each of these states, then start it again: once
    # nsqd's queues are claimed, after each further eighth of the backlog is copied (the queues
    # are copied side by side), and while the copied queues are retired. A start that gets
    # to listening first (the retirement is over in a moment) is stopped with SIGTERM instead:
    # a kill of a running broker may deliver again what it had moved from topic to channel.
    def copied() -> int:
        return sum(_imported_bytes(data, name) for name in ("big", "big:c", "quiet"))

    stages: list[tuple[str, Callable[[int], bool]]] = [("claimed", lambda _: any(data.glob("*.nsqd-import.meta.dat")))]
    stages += [("copying", lambda before: copied() >= before + full // 8)] * 4
    stages += [("retiring", lambda _: not any(data.glob("*.nsqd-import.meta.dat"))
                and any(data.glob("*.nsqd-import.*")))]
    progress = []
    for n, (stage, reached) in enumerate(stages):
        before = copied()
        log = tmp_path / f"killed-{n}.log"
        with open(log, "wb") as out:  # the command BrokerProcess runs, without waiting for its listeners
            proc = subprocess.Popen([sys.executable, "-m", "broker", *broker_args(data)], stdout=out, stderr=out,
                                    stdin=subprocess.DEVNULL)
        with trio.fail_after(60):
            while proc.poll() is None and not reached(before) and "TCP: listening" not in log.read_text():
                await trio.sleep(0.001)
        if "TCP: listening" in log.read_text():
            assert stop_process(proc, 30) == 0
        else:
            proc.kill()
            proc.wait(10)
        progress.append((stage, copied(), any(data.glob("*.nsqd-import.*"))))
    # the kills landed inside the import, three or more of them at different points of the copy
    mid_copy = [size for stage, size, inside in progress if stage == "copying" and inside and size > 0]
    assert len(mid_copy) >= 3 and mid_copy == sorted(set(mid_copy)), progress
    assert progress[0][2], progress

    pynsqd = BrokerProcess(data, log_path=tmp_path / "final.log").start(timeout=60)
    try:
        got_big = await _drain_many(pynsqd.tcp, "big", "c", len(big))
        got_quiet = await _drain_many(pynsqd.tcp, "quiet", "c", len(quiet))
    finally:
        assert pynsqd.terminate() == 0
    for got, bodies in ((got_big, big), (got_quiet, quiet)):
        assert len(got) == len(bodies)
        assert sorted(m.body for m in got) == bodies  # each exactly once
        assert len({m.id for m in got}) == len(bodies)
    assert not list(data.glob("*.nsqd-import.*"))


async def test_damaged_nsqd_files_are_read_as_nsqd_reads_them(tmp_path):
    data = tmp_path / "data"
    bodies = [b"damaged-%03d-" % i + b"x" * 60 for i in range(60)]
    nsqd = _nsqd(data, tmp_path / "nsqd.log", "--mem-queue-size=0", "--max-bytes-per-file=1024").start()
    try:
        await create_channel(nsqd.http, "d", "c")
        client = await connect(nsqd.tcp)
        await _mpub(client, "d", bodies)
        await client.aclose()

        async def all_on_disk() -> bool:  # every message reached the channel's files
            stats = (await request(nsqd.http, "GET", "/stats?format=json&topic=d")).json()
            return stats["topics"][0]["channels"][0]["depth"] >= len(bodies)

        await wait_until(all_on_disk, timeout=20, poll=0.01)
    finally:
        assert nsqd.terminate() == 0
    segments = sorted(data.glob("d:c.diskqueue.0*.dat"))
    assert len(segments) >= 4
    # a record cut short in the first file, an impossible size in the middle of the third
    first = segments[0].read_bytes()
    segments[0].write_bytes(first[:len(first) - 20])
    third = bytearray(segments[2].read_bytes())
    second_record = 4 + int.from_bytes(third[:4], "big")
    third[second_record:second_record + 4] = b"\x7f\xff\xff\xff"
    segments[2].write_bytes(bytes(third))
    shutil.copytree(data, tmp_path / "oracle")

    oracle = _nsqd(tmp_path / "oracle", tmp_path / "oracle.log").start()
    try:
        expected = await _drain_many(oracle.tcp, "d", "c", len(bodies) - 1 - 9)  # at least this many survive
    finally:
        oracle.kill()
    kept = sorted(m.body for m in expected)
    assert set(kept) < set(bodies)

    pynsqd = BrokerProcess(data, log_path=tmp_path / "pynsqd.log").start()
    try:
        got = await _drain_many(pynsqd.tcp, "d", "c", len(kept))
    finally:
        assert pynsqd.terminate() == 0
    assert sorted(map(_key, got)) == sorted(map(_key, expected))
    log = pynsqd.log_text()
    for path, problem in ((segments[0], "cut short by the end of the file"), (segments[2], "invalid message read size")):
        assert (data / (path.name + ".bad")).is_file(), sorted(p.name for p in data.iterdir())
        assert problem in log and f"saved as {path.name}.bad" in log
    assert not list(data.glob("*.nsqd-import.*"))


async def test_export_nsqd_hands_a_stopped_pynsqds_queues_back_to_nsqd(tmp_path):
    data, exported = tmp_path / "data", tmp_path / "for-nsqd"
    pynsqd = BrokerProcess(data, "--mem-queue-size=5", log_path=tmp_path / "pynsqd.log").start()
    try:
        for channel in ("c1", "c2"):
            await create_channel(pynsqd.http, "x", channel)
        await _post(pynsqd.http, "/topic/create?topic=solo")
        client = await connect(pynsqd.tcp)
        bodies = [b"x-%d" % i for i in range(30)]
        await _mpub(client, "x", bodies)
        deferred = [b"later-%d" % i for i in range(2)]
        await _dpub_each(client, "x", deferred)
        solo = [b"solo-%d" % i for i in range(10)]
        await _mpub(client, "solo", solo)
        await client.aclose()
        holder = await subscriber(pynsqd, "x", "c1", rdy=3)
        held = {m.id: m.attempts for m in await holder.read_messages(3)}
    finally:
        assert pynsqd.terminate() == 0
    await holder.aclose()

    done = subprocess.run([sys.executable, "-m", "broker", "export-nsqd", f"--data-path={data}", f"--to={exported}"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "nsqd export: queue x:c1: wrote 32 messages" in done.stderr

    want = {("x", "c1"): bodies + deferred, ("x", "c2"): bodies + deferred, ("solo", "late"): solo}
    nsqd = _nsqd(exported, tmp_path / "nsqd.log").start()
    try:
        got = {where: await _drain_many(nsqd.tcp, *where, len(expect)) for where, expect in want.items()}
    finally:
        assert nsqd.terminate() == 0
    for where, expect in want.items():
        assert sorted(m.body for m in got[where]) == sorted(expect), where
        assert len({m.id for m in got[where]}) == len(expect)
    assert {m.id: m.attempts for m in got["x", "c1"] if m.id in held} == {i: a + 1 for i, a in held.items()}


async def test_export_nsqd_refuses_a_durable_data_directory(tmp_path):
    data = tmp_path / "data"
    pynsqd = BrokerProcess(data, "--durable", log_path=tmp_path / "pynsqd.log").start()
    try:
        await create_channel(pynsqd.http, "x", "c")
        client = await connect(pynsqd.tcp)
        await _mpub(client, "x", [b"kept-%d" % i for i in range(5)])
        await client.aclose()
    finally:
        assert pynsqd.terminate() == 0
    done = subprocess.run([sys.executable, "-m", "broker", "export-nsqd", f"--data-path={data}",
                           f"--to={tmp_path / 'for-nsqd'}"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "written with --durable" in done.stderr, done.stderr


async def test_export_nsqd_writes_a_prioritised_channel_in_its_delivery_order(tmp_path):
    """nsqd has no priorities: a channel of a topic with priorities goes to nsqd in the order
    pynsqd would have delivered it, and nsqd reads its records (no priority prefix is left)."""
    from broker.protocol.priorities import prefix_priority

    data, exported = tmp_path / "data", tmp_path / "for-nsqd"
    priorities = [7, 2, 2 ** 31, 0, 7, 1, 2 ** 32 - 1, 2]  # 2**31: the default, no priority
    pynsqd = BrokerProcess(data, "--mem-queue-size=3", log_path=tmp_path / "pynsqd.log").start()
    try:
        await create_channel(pynsqd.http, "p", "c")
        client = await connect(pynsqd.tcp)
        await client.identify(feature_negotiation=True, priorities=True)
        await _mpub(client, "p", [prefix_priority(p, b"p-%d" % i) for i, p in enumerate(priorities)])
        await client.aclose()
    finally:
        assert pynsqd.terminate() == 0
    done = subprocess.run([sys.executable, "-m", "broker", "export-nsqd", f"--data-path={data}", f"--to={exported}"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    nsqd = _nsqd(exported, tmp_path / "nsqd.log").start()
    try:
        got = await _drain_many(nsqd.tcp, "p", "c", len(priorities))
    finally:
        assert nsqd.terminate() == 0
    order = sorted(range(len(priorities)), key=lambda i: (priorities[i], i))
    assert [m.body for m in got] == [b"p-%d" % i for i in order]


# ------------------------------------------------------- checkpoints and files nsqd reads oddly

#: Topics of one crafted data directory: (records per segment of the channel ``c``'s queue,
#: its checkpoint's text from the segments' sizes, how many messages nsqd 1.3.0 delivers).
OddQueues = dict[str, tuple[list[int], Callable[[list[int]], str], int]]

NEGATIVE: OddQueues = {
    "negative_depth": ([3000], lambda s: f"-5\n0,0\n0,{s[0]}\n", 3000),
    "negative_read_position": ([3000], lambda s: f"3000\n0,-100\n0,{s[0]}\n", 3000),
    "negative_read_file": ([3000], lambda s: f"3000\n-1,0\n0,{s[0]}\n", 3000),
    "negative_write_position": ([3000], lambda s: "3000\n0,0\n0,-1\n", 3000),
    "negative_write_file": ([3000], lambda s: f"3000\n0,0\n-1,{s[0]}\n", 3000),
    "all_negative": ([3000], lambda s: "-3000\n-1,-1\n-1,-1\n", 0),
}
PAST_THE_END: OddQueues = {
    "read_position_past_the_end": ([3000], lambda s: f"3000\n0,{s[0] + 1000}\n0,{s[0]}\n", 0),
    "write_position_past_the_end": ([3000], lambda s: f"3000\n0,0\n0,{s[0] + 1000}\n", 3000),
    "read_file_999999999": ([3000], lambda s: f"3000\n999999999,0\n0,{s[0]}\n", 0),
    "write_file_999999999": ([3000], lambda s: "3000\n0,0\n999999999,0\n", 3000),
    "read_file_past_the_write_file": ([1000, 1000, 1000], lambda s: f"3000\n2,0\n1,{s[1]}\n", 1000),
    "a_file_after_the_write_file": ([1000, 1000, 1000], lambda s: f"2000\n0,0\n1,{s[1]}\n", 2000),
}
CHECKPOINT_TEXT: OddQueues = {
    "signs_and_spaces": ([3000], lambda s: f" 3000 \n+0, +0\n0,{s[0]}\r\n", 3000),
    "write_position_not_a_number": ([1000, 1000], lambda s: "2000\n0,0\n1,abc\n", 1000),
    "text_after_the_write_position": ([1000, 1000], lambda s: f"2000\n0,0\n1,{s[1]}x\n", 2000),
    "write_position_past_int64": ([3000], lambda s: "3000\n0,0\n0,99999999999999999999\n", 0),
}
#: The second of its three segments is a directory.
A_DIRECTORY: OddQueues = {
    "a_directory_segment": ([1000, 1000, 1000], lambda s: f"3000\n0,0\n2,{s[2]}\n", 2000),
    "beside_it": ([1000], lambda s: f"1000\n0,0\n0,{s[0]}\n", 1000),
}


def _craft(data: Path, queues: OddQueues, directories: dict[str, int]) -> None:
    """``data`` as an nsqd would leave it with ``queues`` (and the segments named in
    ``directories`` made directories with a file in them)."""
    data.mkdir()
    write_nsqd_metadata(data, {topic: ["c"] for topic in queues})
    for topic, (counts, meta, _) in queues.items():
        starts = [sum(counts[:i]) for i in range(len(counts))]
        segments = [[nsqd_payload(i, topic) for i in range(s, s + n)] for s, n in zip(starts, counts)]
        sizes = [len(segment_bytes(payloads)) for payloads in segments]
        write_nsqd_queue(data, f"{topic}:c", segments, meta=meta(sizes))
        if topic in directories:
            path = data / f"{topic}:c.diskqueue.{directories[topic]:06d}.dat"
            path.unlink()
            path.mkdir()
            (path / "inside").write_bytes(b"x")


def _queue_files(data: Path, topic: str) -> dict[str, bytes | None]:
    """The channel queue's segment files (None for a directory), without the checkpoint."""
    return {p.name: None if p.is_dir() else p.read_bytes() for p in data.glob(f"{topic}:c.diskqueue.*")
            if ".meta." not in p.name}


def _records(segment: bytes) -> list[bytes]:
    found, pos = [], 0
    while pos + 4 <= len(segment):
        end = pos + 4 + int.from_bytes(segment[pos:pos + 4], "big")
        found.append(segment[pos + 4:end])
        pos = end
    return found


async def _as_nsqd_reads_them(tmp_path: Path, queues: OddQueues, directories: dict[str, int] | None = None) -> str:
    """nsqd and pynsqd on copies of one crafted directory: pynsqd delivers what nsqd delivers,
    and every segment nsqd keeps with messages it did not deliver is kept by pynsqd, byte
    for byte: damaged as ``.bad`` (nsqd's name), unread as ``.unread``. Returns pynsqd's log."""
    data, oracle_data = tmp_path / "data", tmp_path / "oracle"
    _craft(data, queues, directories or {})
    shutil.copytree(data, oracle_data, symlinks=True)
    crafted = {topic: _queue_files(data, topic) for topic in queues}

    oracle = _nsqd(oracle_data, tmp_path / "oracle.log").start()
    try:
        expected = {topic: await _drain_many(oracle.tcp, topic, "c", count) for topic, (_, _, count) in queues.items()}
    finally:
        oracle.kill()
    assert {topic: len(got) for topic, got in expected.items()} == {t: q[2] for t, q in queues.items()}

    pynsqd = BrokerProcess(data, log_path=tmp_path / "pynsqd.log").start()
    try:
        got = {topic: await _drain_many(pynsqd.tcp, topic, "c", count) for topic, (_, _, count) in queues.items()}
    finally:
        assert pynsqd.terminate() == 0
    log = pynsqd.log_text()
    for topic in queues:
        assert sorted(map(_key, got[topic])) == sorted(map(_key, expected[topic])), topic
        delivered = {m.body for m in expected[topic]}
        kept_by_pynsqd = _queue_files(data, topic)
        for name, content in _queue_files(oracle_data, topic).items():
            if name.endswith(".bad"):  # damaged: set aside by both, whole
                assert kept_by_pynsqd[name] == content, (topic, name)
            elif ".diskqueue.0" in name and content is not None and \
                    {r[RECORD_OVERHEAD:] for r in _records(content)} - delivered:
                # kept by nsqd with messages it never delivers: kept by pynsqd, not imported
                assert kept_by_pynsqd[f"{name}.unread"] == crafted[topic][name], (topic, name)
                assert f"{name} not imported" in log
    assert "FATAL" not in log and "Traceback" not in log
    assert not list(data.glob("*.nsqd-import.*"))
    return log


async def test_a_checkpoint_with_negative_numbers_is_read_as_nsqd_reads_it(tmp_path):
    log = await _as_nsqd_reads_them(tmp_path, NEGATIVE)
    assert "nsqd import: queue negative_write_position:c: imported 3000 messages" in log
    assert (tmp_path / "data" / "all_negative:c.diskqueue.000000.dat.unread").is_file()
    assert (tmp_path / "data" / "negative_read_position:c.diskqueue.000000.dat.bad").is_file()


async def test_a_checkpoint_past_the_end_or_naming_file_999999999_deletes_no_file_nsqd_keeps(tmp_path):
    log = await _as_nsqd_reads_them(tmp_path, PAST_THE_END)
    kept = sorted(p.name for p in (tmp_path / "data").glob("*.unread"))
    assert kept == ["a_file_after_the_write_file:c.diskqueue.000002.dat.unread",
                    "read_file_999999999:c.diskqueue.000000.dat.unread",
                    "read_file_past_the_write_file:c.diskqueue.000000.dat.unread",
                    "read_file_past_the_write_file:c.diskqueue.000001.dat.unread",
                    "read_position_past_the_end:c.diskqueue.000000.dat.unread"]
    assert ("nsqd import: queue read_file_999999999:c: nsqd's reader would look for one missing file after "
            "another for ever") in log


async def test_a_checkpoint_gos_fscanf_reads_oddly_is_read_as_nsqd_reads_it(tmp_path):
    log = await _as_nsqd_reads_them(tmp_path, CHECKPOINT_TEXT)
    assert ("nsqd import: queue write_position_past_int64:c: nsqd cannot read its checkpoint whole "
            '(strconv.ParseInt: parsing "99999999999999999999": value out of range)') in log
    assert sorted(p.name for p in (tmp_path / "data").glob("*.unread")) == [
        "write_position_not_a_number:c.diskqueue.000001.dat.unread",
        "write_position_past_int64:c.diskqueue.000000.dat.unread"]


async def test_a_segment_that_is_a_directory_is_set_aside_and_the_broker_starts(tmp_path):
    log = await _as_nsqd_reads_them(tmp_path, A_DIRECTORY, {"a_directory_segment": 1})
    assert (tmp_path / "data" / "a_directory_segment:c.diskqueue.000001.dat.bad" / "inside").is_file()
    assert "a_directory_segment:c.diskqueue.000001.dat: read a_directory_segment:c.diskqueue.000001.dat: " \
           "is a directory" in log
