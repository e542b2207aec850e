"""Preallocated segments (``DiskQueue(preallocate=N)``, the broker's ``--durable`` queues): the
segment being written is extended ahead of its data, and every file ends with its data
again once rolled or closed; the zero bytes a kill or a power cut leaves behind are read
as the end of the data, never as damage, and nothing is lost."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
import trio

from diskqueue import DiskQueue, DiskQueueIOError, fileops
from diskqueue.format import HEADER_SIZE, RECORD_HEADER_SIZE, segment_filename
from tests.support.diskfaults import FaultyDisk
from tests.support.diskqueues import read_all, records

NAME = "q"
PREALLOCATE = 4096
SEGMENT = 2000


def open_queue(path: Path, **options) -> DiskQueue:
    return DiskQueue(NAME, path, max_bytes_per_file=SEGMENT, preallocate=PREALLOCATE, **options)


def segment(path: Path, number: int) -> Path:
    return path / segment_filename(NAME, number)


def data_end(count: int) -> int:
    """Where ``count`` records of :func:`records` end in a segment."""
    return HEADER_SIZE + count * (RECORD_HEADER_SIZE + len(records(1)[0]))


def per_segment() -> int:
    """How many records of :func:`records` a segment of :data:`SEGMENT` bytes holds."""
    return (SEGMENT - HEADER_SIZE) // (RECORD_HEADER_SIZE + len(records(1)[0]))


@pytest.fixture
def warnings(caplog):
    """The warnings (and worse) the disk queue logs during the test."""
    caplog.set_level(logging.INFO, logger="diskqueue")
    return lambda: [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


async def test_the_segment_being_written_runs_ahead_and_every_file_ends_with_its_data_again(tmp_path, warnings):
    q = open_queue(tmp_path)
    q.put_many(records(3))
    # the segment is extended ahead of its three records, up to the segment size
    assert segment(tmp_path, 0).stat().st_size == SEGMENT
    q.put_many(records(per_segment(), 3))  # rolls into segment 1
    assert segment(tmp_path, 0).stat().st_size == data_end(per_segment())
    assert segment(tmp_path, 1).stat().st_size == SEGMENT
    await q.sync()
    await q.close()
    assert segment(tmp_path, 1).stat().st_size == data_end(3)
    q = open_queue(tmp_path)
    assert read_all(q) == records(per_segment() + 3)
    await q.close()
    assert warnings() == []


async def test_a_kill_leaves_a_zero_filled_rest_that_is_read_as_the_end(tmp_path, warnings, caplog):
    live, copy = tmp_path / "live", tmp_path / "copy"
    q = open_queue(live)
    q.put_many(records(per_segment() + 5))
    await q.sync()
    shutil.copytree(live, copy)  # what kill -9 leaves: every write in the page cache, nothing cut off
    assert segment(copy, 1).stat().st_size == SEGMENT
    await q.close()
    q = open_queue(copy)
    assert read_all(q) == records(per_segment() + 5)
    assert segment(copy, 1).stat().st_size == data_end(5)
    q.put_many(records(1, 1000))  # written after the data, not after the zeros
    await q.close()
    q = open_queue(copy)
    assert read_all(q) == records(1, 1000)  # what was read before was consumed
    await q.close()
    assert warnings() == []
    assert any("interrupted write" in r.getMessage() for r in caplog.records)
    assert not list(copy.glob("*.bad"))


async def test_an_older_segment_whose_cut_did_not_reach_the_disk_loses_nothing(tmp_path, warnings, caplog):
    q = open_queue(tmp_path)
    q.put_many(records(4))
    await q.sync()
    checkpoint = {p.name: p.read_bytes() for p in tmp_path.glob("*.meta.dat")}
    q.put_many(records(2 * per_segment(), 4))
    await q.close()
    # a power cut after the roll, before the next sync made the cut (and a later checkpoint)
    # stable: the older checkpoint, and the segment at its preallocated size again
    for name, data in checkpoint.items():
        (tmp_path / name).write_bytes(data)
    os.truncate(segment(tmp_path, 0), SEGMENT)
    q = open_queue(tmp_path)
    assert segment(tmp_path, 0).stat().st_size == data_end(per_segment())
    assert q.depth == 2 * per_segment() + 4
    assert read_all(q) == records(2 * per_segment() + 4)
    await q.close()
    assert warnings() == []
    assert any("zero byte(s) after the last record" in r.getMessage() for r in caplog.records)
    assert not list(tmp_path.glob("*.bad"))


async def test_zeros_where_the_next_segment_says_records_were_are_damage(tmp_path, warnings):
    """The rule above holds only when the next segment starts right after the last record
    found: zeros over records that were written are a loss, counted and reported."""
    q = open_queue(tmp_path)
    q.put_many(records(2 * per_segment()))
    await q.close()
    with open(segment(tmp_path, 0), "r+b") as file:
        file.seek(data_end(per_segment() - 2))
        file.write(bytes(2 * (RECORD_HEADER_SIZE + len(records(1)[0]))))
    q = open_queue(tmp_path)
    assert read_all(q) == records(per_segment() - 2) + records(per_segment(), per_segment())
    await q.close()
    assert any("2 record(s) lost" in w for w in warnings())


async def test_a_file_system_without_preallocation_writes_as_before(tmp_path, warnings):
    def refuse(fd: int, offset: int, length: int) -> None:
        raise OSError(95, "Operation not supported")

    previous = fileops.substitute({"fallocate": refuse})
    try:
        q = open_queue(tmp_path)
        q.put_many(records(3))
        assert segment(tmp_path, 0).stat().st_size == data_end(3)
        await q.sync()
        await q.close()
        q = open_queue(tmp_path)
        assert read_all(q) == records(3)
        await q.close()
    finally:
        fileops.substitute(previous)
    assert warnings() == []


async def test_a_roll_that_cannot_cut_the_rest_off_refuses_the_write_and_loses_nothing(tmp_path):
    failing = True

    def ftruncate(fd: int, size: int) -> None:
        if failing:
            raise OSError(5, "Input/output error")
        real(fd, size)

    real = fileops.ftruncate
    previous = fileops.substitute({"ftruncate": ftruncate})
    try:
        q = open_queue(tmp_path)
        q.put_many(records(per_segment() - 1))
        with pytest.raises(DiskQueueIOError) as raised:
            q.put_many(records(3, per_segment() - 1))
        assert raised.value.accepted == 1  # the one that fitted before the roll
        assert "truncate" in str(raised.value)
        failing = False
        q.put_many(records(2, per_segment()))
        await q.sync()
        await q.close()
    finally:
        fileops.substitute(previous)
    q = open_queue(tmp_path)
    assert read_all(q) == records(per_segment() + 2)
    await q.close()


async def test_a_full_disk_refuses_the_extension_and_the_write_alike(tmp_path):
    disk = FaultyDisk()
    with disk.installed(), trio.fail_after(10):
        q = open_queue(tmp_path)
        q.put_many(records(2))
        await q.sync()
        disk.fail(28)  # ENOSPC
        with pytest.raises(DiskQueueIOError):
            q.put_many(records(per_segment(), 2))  # needs a new segment: nothing can be reserved
        disk.fail(None)
        q.put_many(records(1, 100))
        await q.sync()
        await q.close()
    q = open_queue(tmp_path)
    got = read_all(q)
    await q.close()
    assert got[:2] == records(2) and got[-1] == records(1, 100)[0]


async def test_an_extension_refused_half_way_is_cut_off_with_the_rest(tmp_path, warnings):
    """A file system may extend the file part of the way before it refuses (a disk that fills
    during the extension): the part is cut off at the roll like a whole one."""
    def half_then_refuse(fd: int, offset: int, length: int) -> None:
        os.posix_fallocate(fd, offset, length // 2)
        raise OSError(28, "No space left on device")

    previous = fileops.substitute({"fallocate": half_then_refuse})
    try:
        q = open_queue(tmp_path)
        q.put_many(records(per_segment() + 2))  # rolls into segment 1
        assert segment(tmp_path, 0).stat().st_size == data_end(per_segment())
        await q.close()
        assert segment(tmp_path, 1).stat().st_size == data_end(2)
    finally:
        fileops.substitute(previous)
    q = open_queue(tmp_path)
    assert read_all(q) == records(per_segment() + 2)
    await q.close()
    assert warnings() == []
