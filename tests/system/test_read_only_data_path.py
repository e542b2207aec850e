"""A read-only data path, at start and while running (real ``pynsqd`` processes; mounting needs root).

At start, a read-only ``--data-path`` is refused with nsqd's FATAL line
(``failed to persist metadata - open <data>/nsqd.dat.tmp: read-only file system``; nsqd's
temporary file has a random number in its name), before anything in it is read or
changed. While running, the file system turns read-only as the kernel makes it after an
I/O error: an ext4 image aborted with ``mount -o remount,abort`` (a tmpfs cannot be
remounted read-only while pynsqd holds files open for writing). Then publishes are refused,
``/ping`` says why, consumers still get everything that was accepted, the shutdown names
what it could not write, and with ``--durable`` every acknowledged message is delivered
after the file system is mounted again.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import trio

from broker.protocol import FRAME_TYPE_ERROR, encode_fin, encode_pub
from diskqueue import DiskQueue
from tests.support.http_client import request
from tests.support.mounts import abort_ext4, ext4_image, remount, reset_ext4, tmpfs
from tests.support.paths import nsq_bin
from tests.support.processes import BrokerProcess, run_to_exit
from tests.support.v2client import connect, publish, subscriber

COUNT = 300


def _snapshot(data: Path) -> dict[str, tuple[int, int, int]]:
    return {entry.name: (entry.stat().st_ino, entry.stat().st_size, entry.stat().st_mtime_ns)
            for entry in sorted(data.iterdir())}


async def test_a_read_only_data_path_is_refused_at_start_with_nsqds_line(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", "4m") as disk:
        empty = disk / "empty"
        empty.mkdir()
        used = disk / "used"  # a data directory with a topic and its messages
        used.mkdir()
        queue = DiskQueue("orders", used)
        queue.put_many([b"m%d" % i for i in range(10)])
        await queue.close()
        (used / "nsqd.dat").write_bytes(b'{"topics":[{"channels":[],"name":"orders","paused":false}],'
                                        b'"version":"1.3.0"}')
        before = _snapshot(used)
        remount(disk, read_only=True)

        for data in (empty, used):
            run = run_to_exit(data)
            assert (run.status, run.fatal_lines) == (
                1, [f"failed to persist metadata - open {data}/nsqd.dat.tmp: read-only file system"]), run.output
            assert "Traceback" not in run.output
        assert _snapshot(used) == before
        missing = run_to_exit(disk / "missing")  # pynsqd creates a missing data path; nsqd does not
        assert (missing.status, missing.fatal_lines) == (
            1, [f"failed to instantiate nsqd - failed to lock data-path: mkdir {disk}/missing: read-only file system"])

        nsqd = nsq_bin()
        if nsqd is not None:
            said = run_to_exit(used, program=[str(nsqd / "nsqd")])
            assert said.status == 1
            assert [re.sub(r"nsqd\.dat\.\d+\.tmp", "nsqd.dat.tmp", line) for line in said.fatal_lines] == \
                [f"failed to persist metadata - open {used}/nsqd.dat.tmp: read-only file system"]


@pytest.mark.parametrize("mode", ["default", "durable"])
async def test_a_data_path_turning_read_only_refuses_publishes_and_loses_nothing_accepted(
        tmp_path: Path, mode: str) -> None:
    flags = ["--mem-queue-size=0", "--sync-timeout=200ms"] + (["--durable"] if mode == "durable" else [])
    with ext4_image(tmp_path / "disk") as disk, trio.fail_after(90):
        proc = BrokerProcess(disk / "data", *flags, log_path=tmp_path / "broker.log").start()
        try:
            await request(proc.http, "POST", "/topic/create?topic=t")
            for channel in ("c", "idle"):
                await request(proc.http, "POST", f"/channel/create?topic=t&channel={channel}")
            accepted = [b"t-%04d" % i for i in range(COUNT)]
            await publish(proc, "t", *accepted)

            abort_ext4(disk)
            publisher = await connect(proc.tcp)
            await publisher.send(encode_pub("t", b"refused"))
            frame = await publisher.read_frame()
            assert frame.frame_type == FRAME_TYPE_ERROR
            assert re.fullmatch(rb"E_PUB_FAILED PUB failed (write|open) \S+/t\.diskqueue\.\d{6}\.dat: "
                                rb"read-only file system", frame.data), frame.data
            await publisher.expect_closed()  # fatal, as in nsqd
            reply = await request(proc.http, "POST", "/pub?topic=t", b"refused too")
            assert (reply.status, reply.body) == (503, b'{"message":"EXITING"}')
            ping = await request(proc.http, "GET", "/ping")
            assert ping.status == 500 and ping.body.startswith(b"NOK - ")
            assert ping.body.endswith(b"read-only file system"), ping.body

            # everything accepted is still delivered: the disk still reads
            consumer = await subscriber(proc, "t", "c", rdy=COUNT)
            received = await consumer.read_messages(COUNT)
            assert sorted(m.body for m in received) == accepted
            kept = received[-50:]  # still in flight at the shutdown
            for msg in received[:-50]:
                await consumer.send(encode_fin(msg.id))
            await consumer.sync()
            status = proc.terminate()
        finally:
            proc.kill()
        log = proc.log_text()
        assert "Traceback" not in log
        if mode == "default":
            # The in-flight messages could not be written back, nor the copies "idle" was handed
            # when "c" got a subscriber (until then the topic held one copy for both, in its own
            # queue; without --durable nothing is synced before its OK): said, counted, and the
            # exit status says so.
            assert status == 1
            assert re.search(rf"ERROR: channel t:c: {len(kept)} ready messages could not be written to disk: "
                             r"(write|open) \S+: read-only file system", log), log
            assert re.search(rf"ERROR: channel t:idle: {COUNT} ready messages could not be written to disk: "
                             r"(write|open) \S+: read-only file system", log), log
            assert re.search(rf"FATAL: shutdown incomplete: {len(kept) + COUNT} messages could not be written to "
                             r"disk; the metadata file could not be written \(open \S+/nsqd\.dat\.tmp: read-only "
                             r"file system\) \(see the errors above\)$", log.strip().splitlines()[-1]), log
            return

        # --durable: every OK'd message is on stable storage; mounted again, all are delivered
        # (the FINs after the abort could not be committed: those come again, as duplicates)
        assert re.search(r"ERROR: channel t:c: the disk refused the final writes .*read-only file system", log), log
        reset_ext4(disk)
        again = BrokerProcess(disk / "data", *flags, log_path=tmp_path / "again.log").start()
        try:
            for channel in ("c", "idle"):
                consumer = await subscriber(again, "t", channel, rdy=COUNT)
                delivered = {m.body for m in await consumer.read_messages(COUNT)}
                assert delivered == set(accepted), channel
            assert again.terminate() == 0
        finally:
            again.kill()
