"""Damaged disk queue files under a real pynsqd: it starts, says what it lost, and loses nothing else.

One broker (default mode, and ``--durable``) fills four channels' queues (small segments,
``--mem-queue-size=0``), part of one is consumed, and it stops. Then each queue gets one
kind of damage: a checkpoint of random bytes (after part of the queue was consumed), a
segment of random bytes, and a directory in place of a checkpoint and of a segment (what a
confused restore or a file system repair leaves). A broker started on the directory must
deliver every message of every queue but those of the damaged segments, name each loss in
its log, and set the damaged files aside (``.bad``). A checkpoint lost after consumption may
bring consumed messages back (duplicates), never lose one. (Bytes flipped inside a segment:
``test_diskqueue_resync_live.py``.)
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import trio

from broker.protocol import encode_fin, encode_mpub, encode_rdy
from diskqueue.format import meta_filename, segment_filename
from tests.support.draining import drain
from tests.support.http_client import create_channel, request
from tests.support.v2client import connect, subscriber
from tests.support.waiting import wait_until

COUNT = 100
#: About 28 messages per segment.
SEGMENT = 4096
CONSUMED = 40


def _bodies(topic: str) -> list[bytes]:
    return [f"{topic}-{i:04d}-".encode().ljust(100, b"x") for i in range(COUNT)]


def _in_file(path: Path, bodies: list[bytes]) -> list[bytes]:
    data = path.read_bytes()
    return [body for body in bodies if body in data]


def _garbage(path: Path, size: int) -> None:
    path.write_bytes(random.Random(str(path.name)).randbytes(size))


def _directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


async def _copied_depths(address: tuple[str, int]) -> dict[str, int]:
    """Each topic's channel ``c`` depth, or -1 while the topic still holds messages not copied to it."""
    topics = (await request(address, "GET", "/stats?format=json&channel=c")).json()["topics"]
    return {t["topic_name"]: t["channels"][0]["depth"] if not t["depth"] else -1 for t in topics}


async def _drain(address: tuple[str, int], topic: str, want: set[bytes]) -> set[bytes]:
    """Everything the channel ``topic:c`` delivers until ``want`` has come, and what else was ready."""
    consumer = await subscriber(address, topic, "c", rdy=COUNT, timeout=20)
    got: set[bytes] = set()
    await drain(consumer, lambda: want <= got, on_message=lambda _, msg: got.add(msg.body))
    got.update(m.body for m in await consumer.sync())
    await consumer.aclose()
    return got


@pytest.mark.parametrize("mode", ["default", "durable"])
async def test_damaged_queue_files_cost_only_what_they_held(broker_process, mode: str) -> None:
    flags = ("--mem-queue-size=0", f"--max-bytes-per-file={SEGMENT}") + (("--durable",) if mode == "durable" else ())
    proc = broker_process(*flags)
    bodies = {topic: _bodies(topic) for topic in ("a", "b", "d", "e")}
    with trio.fail_after(60):
        publisher = await connect(proc.tcp)
        for topic, sent in bodies.items():
            await create_channel(proc.http, topic, "c")
            await publisher.send(encode_mpub(topic, sent))
            await publisher.expect_response(b"OK")
        consumer = await subscriber(proc, "a", "c", rdy=CONSUMED)  # a:c: the first CONSUMED messages, FIN'd
        consumed = await consumer.read_messages(CONSUMED)
        await consumer.send(encode_rdy(0))
        for msg in consumed:
            await consumer.send(encode_fin(msg.id))
        await consumer.expect_quiet()
        assert {m.body for m in consumed} == set(bodies["a"][:CONSUMED])
        # durable mode copies a topic's messages to its channels after the publish is answered:
        # stop only once every channel holds its copy, so that each channel has files to damage
        async def every_channel_copied() -> bool:
            return await _copied_depths(proc.http) == {"a": COUNT - CONSUMED, "b": COUNT, "d": COUNT, "e": COUNT}

        await wait_until(every_channel_copied, timeout=60, poll=0.02)
    assert proc.terminate() == 0

    data = proc.data_path
    _garbage(data / meta_filename("a:c"), 80)
    lost_b = _in_file(data / segment_filename("b:c", 1), bodies["b"])
    _garbage(data / segment_filename("b:c", 1), (data / segment_filename("b:c", 1)).stat().st_size)
    _directory(data / meta_filename("d:c"))
    lost_e = _in_file(data / segment_filename("e:c", 2), bodies["e"])
    _directory(data / segment_filename("e:c", 2))
    assert len(lost_b) > 20 and len(lost_e) > 20

    want = {"a": set(bodies["a"][CONSUMED:]), "b": set(bodies["b"]) - set(lost_b), "d": set(bodies["d"]),
            "e": set(bodies["e"]) - set(lost_e)}
    restarted = broker_process(*flags)
    with trio.fail_after(60):
        got = {topic: await _drain(restarted.tcp, topic, want[topic]) for topic in bodies}
    assert restarted.terminate() == 0
    # the consumed part of a may come back (its checkpoint is gone); the others lose exactly their damaged segment
    assert want["a"] <= got["a"] <= set(bodies["a"])
    assert {topic: got[topic] == want[topic] for topic in "bde"} == {"b": True, "d": True, "e": True}

    log = restarted.log_text()
    assert "Traceback" not in log
    assert "DISKQUEUE(a:c): checkpoint unreadable" in log
    assert f"DISKQUEUE(b:c): {len(lost_b)} record(s) lost" in log
    assert f"DISKQUEUE(d:c): checkpoint unreadable (read {data / meta_filename('d:c')}: is a directory)" in log
    assert "DISKQUEUE(e:c): segment 000002: not a regular file" in log
    assert f"DISKQUEUE(e:c): {len(lost_e)} record(s) lost" in log
    for damaged in (meta_filename("a:c"), segment_filename("b:c", 1), meta_filename("d:c"),
                    segment_filename("e:c", 2)):
        assert (data / (damaged + ".bad")).exists(), damaged
