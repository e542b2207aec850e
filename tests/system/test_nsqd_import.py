"""pynsqd started on the data directory nsq 1.3.0's nsqd left: every queued message is delivered once.

nsqd fills topics and channels (spilled with ``--mem-queue-size=0``, held in memory until its
graceful exit, deferred, in flight at its exit, a topic with no channel, a paused channel,
several segment files), then stops on SIGTERM. nsqd itself is the oracle: started on a copy
of the directory, the messages it delivers (id, body, timestamp, attempts) are exactly the
ones pynsqd must deliver from the original.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest
import trio

from broker.protocol import encode_dpub, encode_fin, encode_mpub, encode_rdy, encode_sub
from tests.support.http_client import request
from tests.support.nsq_programs import nsq_bin, nsq_bin_missing
from tests.support.processes import BrokerProcess
from tests.support.v2client import V2Client, connect

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


async def _create_channel(address: tuple[str, int], topic: str, channel: str) -> None:
    await _post(address, f"/topic/create?topic={topic}")
    await _post(address, f"/channel/create?topic={topic}&channel={channel}")


async def _mpub(client: V2Client, topic: str, bodies: list[bytes]) -> None:
    await client.send(encode_mpub(topic, bodies))
    await client.expect_response(b"OK")


async def _fill_nsqd(tmp_path: Path, data: Path) -> tuple[Delivery, dict[bytes, int]]:
    """Run nsqd twice on ``data``; what every channel must deliver, and the attempts of the
    messages that were in flight at its exit."""
    want: Delivery = {}
    # 1: everything spilled to disk as it is published
    nsqd = _nsqd(data, tmp_path / "nsqd1.log", "--mem-queue-size=0").start()
    try:
        await _create_channel(nsqd.http, "spilled", "c")
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
            await _create_channel(nsqd.http, "mixed", channel)
        await _create_channel(nsqd.http, "paused", "p")
        await _post(nsqd.http, "/channel/pause?topic=paused&channel=p")
        await _post(nsqd.http, "/topic/create?topic=nochan")
        client = await connect(nsqd.tcp)
        mixed = [b"mixed-%d" % i for i in range(60)]
        await _mpub(client, "mixed", mixed)
        deferred = [b"deferred-%d" % i for i in range(3)]
        for body in deferred:
            await client.send(encode_dpub("mixed", 3_600_000, body))
            await client.expect_response(b"OK")
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
        holder = await connect(nsqd.tcp)
        await holder.send(encode_sub("mixed", "c1"))
        await holder.expect_response(b"OK")
        await holder.send(encode_rdy(4))
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
    got: dict[tuple[str, str], list] = {}
    for (topic, channel), bodies in want.items():
        client = await connect(address, timeout=10.0)
        await client.send(encode_sub(topic, channel))
        await client.expect_response(b"OK")
        await client.send(encode_rdy(len(bodies) + 10))
        messages = await client.read_messages(len(bodies))
        for msg in messages:
            await client.send(encode_fin(msg.id))
        extra = await client.sync()
        got[topic, channel] = messages + extra
        await client.aclose()
    with trio.fail_after(10):
        while True:
            stats = (await request(http, "GET", "/stats?format=json")).json()
            left = [(t["topic_name"], t["depth"], [(c["channel_name"], c["depth"], c["in_flight_count"],
                                                     c["deferred_count"]) for c in t["channels"]])
                    for t in stats["topics"]]
            if all(depth == 0 and all(c[1:] == (0, 0, 0) for c in chans) for _, depth, chans in left):
                break
            await trio.sleep(0.05)
    return got


def _key(msg) -> tuple[bytes, bytes, int, int]:
    return (msg.id, msg.body, msg.timestamp, msg.attempts)


async def test_pynsqd_delivers_everything_nsqd_left_queued(tmp_path):
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

    pynsqd = BrokerProcess(data, log_path=tmp_path / "pynsqd.log").start()
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
    again = BrokerProcess(data, log_path=tmp_path / "again.log").start()
    try:
        stats = (await request(again.http, "GET", "/stats?format=json")).json()
        assert [t["depth"] for t in stats["topics"]] == [0] * len(stats["topics"])
        assert all(c["depth"] == 0 for t in stats["topics"] for c in t["channels"])
    finally:
        assert again.terminate() == 0
    assert "nsqd import" not in again.log_text()
