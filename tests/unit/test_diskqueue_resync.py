"""Damage in the middle of a segment costs exactly the damaged records, counted exactly."""

from __future__ import annotations

import logging
import random
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from diskqueue import DiskQueue
from diskqueue.check import check
from diskqueue.format import HEADER_SIZE, RECORD_HEADER_SIZE, segment_filename
from tests.support.diskqueues import flip, read_all, record_spans
from tests.support.paths import REPO

NAME = "q"
COUNT = 3000


def bodies(seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [b"%06d:" % i + rng.randbytes(rng.randrange(0, 120)) for i in range(COUNT)]


async def write_queue(path: Path, sent: list[bytes]) -> Path:
    q = DiskQueue(NAME, path)
    q.put_many(sent)
    await q.close()
    return path / segment_filename(NAME, 0)


def where(seed: int, spans: list[tuple[int, int]]) -> list[int]:
    """Flip offsets around the middle: inside a payload, on a header, across a boundary."""
    middle = spans[len(spans) // 2]
    rng = random.Random(seed)
    return [middle[0], middle[0] + 3, middle[0] + 9, middle[1] - 4, rng.randrange(HEADER_SIZE, spans[-1][1] - 8)]


@pytest.mark.parametrize("seed", range(4))
async def test_eight_flipped_bytes_cost_only_the_records_they_touch(
    tmp_path: Path, seed: int, caplog: pytest.LogCaptureFixture
) -> None:
    sent = bodies(seed)
    with trio.fail_after(60):
        segment = await write_queue(tmp_path / "pristine", sent)
        spans = record_spans(segment)
        assert len(spans) == COUNT
        for case, at in enumerate(where(seed, spans)):
            path = tmp_path / f"case{case}"
            segment = await write_queue(path, sent)
            flip(segment, at)
            touched = {i for i, (start, end) in enumerate(spans) if start < at + 8 and at < end}

            report = check(path, NAME)
            assert report.records_lost == len(touched) and not report.lost_unknown, report.format()
            assert report.records == COUNT - len(touched) and not report.ok
            cli = subprocess.run([sys.executable, "-m", "diskqueue", str(path)], capture_output=True,
                                 text=True, cwd=REPO, timeout=60)
            assert cli.returncode == 1
            assert f"records lost: {len(touched)}\n" in cli.stdout + "\n"

            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="diskqueue"):
                q = DiskQueue(NAME, path)
                got = read_all(q, 500)
                assert got == [body for i, body in enumerate(sent) if i not in touched]
                assert q.statistics().records_lost == len(touched) and q.depth == 0
                await q.close()
            assert f"{len(touched)} record(s) lost to damage in segment 000000" in caplog.text
            assert (path / (segment_filename(NAME, 0) + ".bad")).exists()


async def test_a_zeroed_run_across_records_is_read_past(tmp_path: Path) -> None:
    sent = bodies(7)
    with trio.fail_after(30):
        segment = await write_queue(tmp_path, sent)
        spans = record_spans(segment)
        at, end = spans[1000][0] + 5, spans[1040][0] + 6  # into the checksum of record 1040
        with open(segment, "r+b") as f:
            f.seek(at)
            f.write(bytes(end - at))
        touched = {i for i, (s, e) in enumerate(spans) if s < end and at < e}
        assert check(tmp_path, NAME).records_lost == len(touched) == 41
        q = DiskQueue(NAME, tmp_path)
        kept = [body for i, body in enumerate(sent) if i not in touched]
        assert q.peek_many(COUNT) == kept  # a peek reads past the damage as reading does
        assert read_all(q, 500) == kept
        assert q.statistics().records_lost == 41
        await q.close()


async def test_damage_in_the_write_segment_is_read_past(tmp_path: Path) -> None:
    with trio.fail_after(30):
        q = DiskQueue(NAME, tmp_path)
        q.put_many([b"a" * 50] * 10 + [b"b" * 50] * 10)
        flip(tmp_path / segment_filename(NAME, 0), HEADER_SIZE + 58 * 10 + 20)  # the 11th payload
        got = q.read_many(100)
        assert got == [b"a" * 50] * 10 + [b"b" * 50] * 9
        q.put(b"later")
        assert q.read_many(5) == [b"later"]
        assert q.statistics().records_lost == 1 and q.depth == 0
        await q.close()


async def test_a_damaged_length_that_reaches_the_end_exactly_does_not_skip_the_records_it_covers(tmp_path) -> None:
    """The first record's length turned from 2 into 13 points exactly at the end of the segment:
    no record follows to vouch for it, so the scan finds the intact last record and keeps it."""
    sent = [b"\0\0", b"\0\0\0"]
    segment = await write_queue(tmp_path, sent)
    data = bytearray(segment.read_bytes())
    assert len(data) == HEADER_SIZE + 2 * RECORD_HEADER_SIZE + 5
    data[HEADER_SIZE + 3] = 13  # the length's low byte: the record would end where the segment does
    segment.write_bytes(bytes(data))

    report = check(tmp_path, NAME)
    q = DiskQueue(NAME, tmp_path)
    try:
        assert read_all(q, 500) == [b"\0\0\0"]
        assert q.statistics().records_lost == 1
    finally:
        await q.close()
    assert (report.records, report.records_lost) == (1, 1)
