"""Importing nsqd's disk queues (``broker/storage/nsqdimport.py``) on hand-made nsqd files.

nsqd's files are written as go-diskqueue v1.1.0 writes them (``tests/support/nsqd_files.py``;
the system test ``tests/system/test_nsqd_import.py`` has real nsqd read the same kinds of
files). Crashes are simulated with the power-cut recorder (``tests/support/powercut.py``):
every change the import makes is recorded, and the import is run again on the directory a
kill (or a power cut) at each point of that record would leave.
"""

from __future__ import annotations

import errno
import logging
import random
from pathlib import Path

import pytest

from broker.config.options import parse_args
from broker.core.message import decode
from broker.storage import nsqdimport
from broker.storage.datadir import DataDirectory
from broker.storage.nsqdimport import NsqdImportError, import_nsqd_queues
from broker.storage.queuestore import QueueStore
from tests.support.diskfaults import FaultyDisk
from tests.support.nsqd_files import nsqd_payload, write_nsqd_queue
from tests.support.powercut import Disk, Recorder, first_seed, write_directory


def store(path: Path) -> tuple[QueueStore, int]:
    options = parse_args([f"--data-path={path}", "--max-bytes-per-file=4096"])
    return QueueStore(path, options), options.max_msg_size


async def run_import(path: Path) -> list[nsqdimport.ImportedQueue]:
    queues, max_msg_size = store(path)
    return await import_nsqd_queues(path, queues, max_msg_size)


async def pynsqd_records(path: Path, name: str) -> list[bytes]:
    """Every record of pynsqd's queue ``name``, oldest first (read without consuming them)."""
    queues, _ = store(path)
    queue = queues.open(name)
    try:
        return queue.peek_many(1_000_000)
    finally:
        await queue.close()


def claimed_files(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if ".nsqd-import." in p.name)


async def test_each_queue_resumes_at_nsqds_read_cursor(tmp_path, caplog):
    caplog.set_level(logging.INFO, "pynsqd.import")
    topic = [[nsqd_payload(i, "t") for i in range(5)]]
    channel = [[nsqd_payload(i, "c") for i in range(k, k + 4)] for k in (0, 4, 8)]
    write_nsqd_queue(tmp_path, "t", topic)
    # nsqd had read the first segment and one record of the second
    write_nsqd_queue(tmp_path, "t:c", channel, read=(1, 4 + len(channel[1][0])))

    done = await run_import(tmp_path)

    assert [(q.name, q.messages) for q in done] == [("t", 5), ("t:c", 7)]
    assert await pynsqd_records(tmp_path, "t") == topic[0]
    assert await pynsqd_records(tmp_path, "t:c") == channel[1][1:] + channel[2]
    msg = decode((await pynsqd_records(tmp_path, "t:c"))[0])
    assert (msg.id, msg.timestamp, msg.attempts, msg.body) == (b"%016x" % 0xA005, 1_700_000_000_000_005_000, 0, b"c-5")
    assert claimed_files(tmp_path) == []
    assert "nsqd import: queue t: imported 5 messages" in caplog.text
    assert "nsqd import: queue t:c: imported 7 messages" in caplog.text
    assert await run_import(tmp_path) == []  # pynsqd's own checkpoints are never taken for nsqd's
    assert await pynsqd_records(tmp_path, "t") == topic[0]


@pytest.mark.parametrize("damage, kept", [
    pytest.param(b"\x00\x00\x00\x40" + b"x" * 10, 3, id="record-cut-short"),
    pytest.param(b"\x7f\xff\xff\xff" + b"x" * 40, 3, id="impossible-size"),
    pytest.param(b"\x00\x00\x00\x05hello", 3, id="too-small"),
    pytest.param(b"\x00\x00", 3, id="length-cut-short"),
])
async def test_damaged_segment_keeps_what_is_readable_and_is_renamed_bad(tmp_path, caplog, damage, kept):
    caplog.set_level(logging.INFO, "pynsqd.import")
    segments = [[nsqd_payload(i, "d") for i in range(k, k + 3)] for k in (0, 3)]
    after = [nsqd_payload(99, "d")]  # written after the damage in the same file: nsqd never reads it
    tail = damage + len(after[0]).to_bytes(4, "big") + after[0]
    write_nsqd_queue(tmp_path, "d", segments, tails={0: tail})

    done = await run_import(tmp_path)

    assert await pynsqd_records(tmp_path, "d") == segments[0][:kept] + segments[1]
    assert done[0].messages == kept + 3 and len(done[0].damaged) == 1
    bad = tmp_path / "d.diskqueue.000000.dat.bad"
    assert bad.read_bytes().endswith(tail)  # set aside whole, for inspection
    assert claimed_files(tmp_path) == []
    assert "d.diskqueue.000000.dat" in caplog.text and "saved as d.diskqueue.000000.dat.bad" in caplog.text
    assert any(r.levelno == logging.WARNING for r in caplog.records)


async def test_missing_segment_and_negative_timestamp_are_skipped(tmp_path, caplog):
    segments = [[nsqd_payload(i, "m") for i in range(k, k + 2)] for k in (0, 2, 4)]
    forged = b"\xff" + nsqd_payload(50, "m")[1:]  # a negative timestamp: not a message nsqd wrote
    segments[2].insert(1, forged)
    write_nsqd_queue(tmp_path, "m", segments)
    (tmp_path / "m.diskqueue.000001.dat").unlink()

    done = await run_import(tmp_path)

    assert await pynsqd_records(tmp_path, "m") == segments[0] + [segments[2][0], segments[2][2]]
    assert done[0].damaged == ["m.diskqueue.000001.dat: segment file is missing"]
    assert "negative timestamp" in caplog.text


async def test_a_kill_or_power_cut_anywhere_in_the_import_loses_and_duplicates_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(nsqdimport, "_BATCH", 7)  # many appends, each a point to crash after
    origin = tmp_path / "origin"
    origin.mkdir()
    topic = [[nsqd_payload(i, "t") for i in range(k, k + 20)] for k in (0, 20)]
    channel = [[nsqd_payload(i, "c") for i in range(k, k + 25)] for k in (0, 25, 50)]
    write_nsqd_queue(origin, "t", topic, read=(0, 4 + len(topic[0][0])))
    write_nsqd_queue(origin, "t:c", channel, tails={1: b"\x00\x00\x00\x01garbage"})
    want = {"t": topic[0][1:] + topic[1], "t:c": channel[0] + channel[1] + channel[2]}

    recorder = Recorder(origin)
    with recorder.installed():
        await run_import(origin)
    assert {name: await pynsqd_records(origin, name) for name in want} == want
    assert len(recorder.ops) > 40

    rng = random.Random(first_seed())
    disk = Disk(recorder.initial)
    for point in range(len(recorder.ops) + 1):
        disk.advance(recorder.ops, point)
        for mode in ("kept", "random"):
            files, choices = disk.power_cut(rng, mode)
            where = write_directory(tmp_path / f"{point}-{mode}", files)
            await run_import(where)
            got = {name: await pynsqd_records(where, name) for name in want}
            assert got == want, (point, mode, choices, recorder.trace(point, 12))
            assert claimed_files(where) == [], (point, mode)
            assert sorted(p.name for p in where.glob("*.bad")) == ["t:c.diskqueue.000001.dat.bad"], (point, mode)


async def test_a_full_disk_stops_the_start_and_the_next_start_carries_on(tmp_path):
    segments = [[nsqd_payload(i, "f") for i in range(k, k + 30)] for k in (0, 30)]
    write_nsqd_queue(tmp_path, "f", segments)
    options = parse_args([f"--data-path={tmp_path}", "--max-bytes-per-file=2048"])
    disk = FaultyDisk(lambda name: name.startswith("f.diskqueue.0"))  # pynsqd's segments, not nsqd's
    disk.fail(errno.ENOSPC)
    directory = DataDirectory(options)
    directory.lock()
    try:
        with disk.installed(), pytest.raises(NsqdImportError, match="importing nsqd's queues failed"):
            await directory.import_nsqd_queues()
        assert claimed_files(tmp_path)  # nsqd's files are kept until pynsqd's queue holds them
        await directory.import_nsqd_queues()
    finally:
        directory.unlock()
    assert await pynsqd_records(tmp_path, "f") == segments[0] + segments[1]
    assert claimed_files(tmp_path) == []
