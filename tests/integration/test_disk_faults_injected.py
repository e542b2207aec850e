"""A disk that refuses, injected: an in-process broker whose disk queues and ``nsqd.dat`` answer
``ENOSPC`` (full) or ``EROFS`` (gone read-only) while a test says so.

``tests/system/test_disk_full.py`` and ``test_read_only_data_path.py`` do this to real file
systems under a real process, where mounting is allowed (root). These tests run everywhere:
the broker's file layer (``diskqueue.fileops``) refuses through
:class:`~tests.support.diskfaults.FaultyDisk`, so the moments the disk refuses and takes
writes again are exact.
"""

from __future__ import annotations

import errno

import pytest
import trio

from broker.core.spill import REFILL_BATCH
from broker.protocol import FRAME_TYPE_ERROR, encode_fin, encode_mpub, encode_pub, encode_sub
from tests.support.diskfaults import FaultyDisk
from tests.support.http_client import request
from tests.support.publishers import KINDS, Consumer, Ledger, publish_once, publish_until
from tests.support.v2client import connect, publish, subscriber
from tests.support.waiting import wait_for


async def _ping(daemon) -> tuple[int, bytes]:
    reply = await request(daemon.addresses.http, "GET", "/ping")
    return reply.status, reply.body


@pytest.mark.parametrize("mode", ["default", "durable"])
@pytest.mark.parametrize("error, reason", [(errno.ENOSPC, b"no space left on device"),
                                           (errno.EROFS, b"read-only file system")], ids=["full", "read-only"])
async def test_every_publisher_is_refused_and_nothing_accepted_is_lost(start_daemon, mode: str, error: int,
                                                                        reason: bytes) -> None:
    disk = FaultyDisk()
    ledger = Ledger("t", 100)
    flags = ["--mem-queue-size=0"] + (["--durable"] if mode == "durable" else [])
    with disk.installed(), trio.fail_after(60):
        async with start_daemon(*flags) as d:
            tcp, http = d.addresses.tcp, d.addresses.http
            await request(http, "POST", "/topic/create?topic=t")
            await request(http, "POST", "/channel/create?topic=t&channel=c")
            for kind in KINDS:
                assert await publish_once(kind, tcp, http, ledger) is None
            consumer = await Consumer.subscribe(tcp, "t", "c")
            await consumer.drain(set(ledger.acked))

            disk.fail(error)
            await publish_until(tcp, http, ledger, refusals=3)
            for kind in ("PUB", "MPUB", "DPUB"):
                assert all(answer.startswith(b"E_%s_FAILED %s failed write " % (kind.encode(), kind.encode()))
                           and answer.endswith(b": " + reason) for answer in ledger.refused[kind])
            for kind in ("HTTP /pub", "HTTP /mpub"):
                assert set(ledger.refused[kind]) == {b'503 {"message":"EXITING"}'}
            status, body = await _ping(d)  # the last failure: a write, or a sync of a checkpoint
            assert status == 500 and body.startswith(b"NOK - ") and body.endswith(reason)

            disk.fail(None)
            for kind in KINDS:
                assert await publish_once(kind, tcp, http, ledger) is None, kind
            assert await _ping(d) == (200, b"OK")
            await consumer.drain(ledger.acked)
            assert not consumer.delivered.keys() - ledger.acked  # nothing refused was queued
            await consumer.aclose()


async def test_ping_stays_nok_until_the_disk_takes_a_write(start_daemon) -> None:
    # nsqd's health changes only with the outcome of a disk write: a publish that fits in
    # memory says nothing about the disk, which still refuses (it used to clear the error)
    disk = FaultyDisk()
    with disk.installed(), trio.fail_after(30):
        async with start_daemon("--mem-queue-size=100") as d:
            publisher = await connect(d.addresses.tcp)
            disk.fail(errno.ENOSPC)
            await publisher.send(encode_mpub("t", [b"m%d" % i for i in range(150)]))  # past memory: spills
            frame = await publisher.read_frame()
            assert frame.frame_type == FRAME_TYPE_ERROR and frame.data.startswith(b"E_MPUB_FAILED")
            publisher = await connect(d.addresses.tcp)
            await publisher.send(encode_pub("t", b"fits in memory"))
            await publisher.expect_response(b"OK")
            status, body = await _ping(d)
            assert status == 500 and body.endswith(b"no space left on device")

            disk.fail(None)
            # the write of nsqd.dat naming the new topic failed too, and is retried: its failure
            # may land late on a busy machine, so the write that clears the error comes after it
            await d.broker.wait_metadata_persisted()
            await publisher.send(encode_mpub("t", [b"m%d" % i for i in range(150)]))
            await publisher.expect_response(b"OK")
            assert await _ping(d) == (200, b"OK")


async def test_durable_publish_creating_a_topic_is_answered_once_nsqd_dat_is_written(start_daemon) -> None:
    # --durable: OK means a crash keeps the message, and a crash would forget a topic that
    # nsqd.dat does not name; while nsqd.dat cannot be written the publisher waits (nsqd,
    # not durable, answers OK at once)
    disk = FaultyDisk(lambda name: name.startswith("nsqd.dat"))
    with disk.installed(), trio.fail_after(30):
        async with start_daemon("--durable") as d:
            disk.fail(errno.ENOSPC)
            publisher = await connect(d.addresses.tcp)
            await publisher.send(encode_pub("new", b"first"))
            with trio.move_on_after(1.5) as waited:
                await publisher.read_frame()
            assert waited.cancelled_caught
            status, body = await _ping(d)
            assert (status, body.startswith(b"NOK - failed to persist metadata - write "),
                    body.endswith(b"/nsqd.dat.tmp: no space left on device")) == (500, True, True), body
            disk.fail(None)
            await publisher.expect_response(b"OK")  # the metadata writer retries every second


async def test_durable_messages_a_channel_refused_are_delivered_once_the_disk_takes_writes(start_daemon) -> None:
    # Only the channel's files refuse: the topic writes (the publisher gets OK), then
    # copying the records to the channel fails. Once the disk takes writes again, the
    # channel must get them without a restart.
    disk = FaultyDisk(lambda name: name.startswith("t:c."))
    with disk.installed(), trio.fail_after(30):
        async with start_daemon("--durable") as d:
            await request(d.addresses.http, "POST", "/topic/create?topic=t")
            await request(d.addresses.http, "POST", "/channel/create?topic=t&channel=c")
            ledger = Ledger("t", 100)
            disk.fail(errno.ENOSPC)
            for _ in range(10):
                assert await publish_once("PUB", d.addresses.tcp, d.addresses.http, ledger) is None
            await wait_for(lambda: disk.refused, timeout=5)  # the topic's pump copied, and the copy failed
            disk.fail(None)
            for _ in range(10):
                assert await publish_once("PUB", d.addresses.tcp, d.addresses.http, ledger) is None
            consumer = await Consumer.subscribe(d.addresses.tcp, "t", "c")
            consumer.client.timeout = 3
            await consumer.drain(ledger.acked)


async def test_a_channel_that_cannot_spill_holds_its_topic_back_instead_of_growing_in_memory(start_daemon) -> None:
    """Default mode: the channel's disk queue refuses, the topic's takes writes. The channel
    keeps --mem-queue-size messages in memory and the topic keeps the rest (on its disk), so
    memory stays bounded; once the channel's disk takes writes every message arrives, in order."""
    disk = FaultyDisk(lambda name: name.startswith("t:c."))
    with disk.installed(), trio.fail_after(60):
        async with start_daemon("--mem-queue-size=10") as d:
            await request(d.addresses.http, "POST", "/topic/create?topic=t")
            await request(d.addresses.http, "POST", "/channel/create?topic=t&channel=c")
            disk.fail(errno.ENOSPC)
            producer = await connect(d.addresses.tcp)
            bodies = [b"m%04d" % i for i in range(5000)]
            for start in range(0, len(bodies), 100):
                await producer.send(encode_mpub("t", bodies[start:start + 100]))
                await producer.expect_response(b"OK")
            # the pump is held back: a spill of the channel was refused, and refused again
            # when the pump tried once more (each attempt's calls run without a checkpoint)
            await wait_for(lambda: disk.refused, timeout=10)
            first_attempt = disk.refused
            await wait_for(lambda: disk.refused > first_attempt, timeout=10)
            topic = d.broker.topics["t"]
            channel = topic.channels["c"]
            # at most one more pump batch than it may hold (REFILL_BATCH from the topic's disk)
            assert len(channel.memory) <= 10 + REFILL_BATCH, len(channel.memory)
            assert topic.depth + channel.depth == len(bodies)
            disk.fail(None)
            consumer = await subscriber(d, rdy=1)
            got = []
            for _ in bodies:
                (msg,) = await consumer.read_messages(1)
                got.append(msg.body)
                await consumer.send(encode_fin(msg.id))
            assert got == bodies


@pytest.mark.parametrize("mode", ["default", "durable"])
async def test_a_channel_whose_files_cannot_be_opened_is_refused_clearly(start_daemon, mode: str, tmp_path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """Opening a channel must set its damaged checkpoint aside (a rename) on a disk that refuses every
    change: ``SUB`` gets a fatal ``E_SUB_FAILED``, ``/channel/create`` nsqd's 500, and the log one line."""
    (tmp_path / "data").mkdir()  # the damaged checkpoint is there when the broker starts
    (tmp_path / "data" / "t:blocked.diskqueue.meta.dat").write_bytes(b"\xff" * 40)
    disk = FaultyDisk(matches=lambda name: name.startswith("t:blocked"))
    disk.fail(errno.EROFS)
    flags = ["--durable"] if mode == "durable" else []
    with trio.fail_after(30), disk.installed():
        async with start_daemon(*flags) as daemon:
            await publish(daemon, "t", b"kept")
            reply = await request(daemon.addresses.http, "POST", "/channel/create?topic=t&channel=blocked")
            assert (reply.status, reply.body) == (500, b'{"message":"INTERNAL_ERROR"}')
            client = await connect(daemon.addresses.tcp)
            await client.send(encode_sub("t", "blocked"))
            await client.expect_error(b"E_SUB_FAILED SUB failed to open the channel's files")
            assert await _ping(daemon) == (500, b"NOK - " + str(daemon.broker.health_error).encode())
            consumer = await subscriber(daemon, "t", "ok", rdy=2)  # the rest of the broker serves on
            await publish(daemon, "t", b"after")
            assert [m.body for m in await consumer.read_messages(2)] == [b"kept", b"after"]
    assert disk.refused
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records if r.exc_info]
    assert "Traceback" not in caplog.text
