"""Random damage to a disk queue's files: never a crash, and the records lost are counted exactly.

The model: a record is *touched* when a byte of it changed (all records of a segment whose
header changed). With one damaged span, exactly the touched records are lost; with several,
reading may also give up a record between two close spans (resynchronising wants two valid
records in a row), but what is delivered is always the sent records in order, and what is
reported lost is exactly what was not delivered.

The queues here refuse empty records (``min_msg_size=1``), as the broker's do (its records are
at least 26 bytes): the header of an empty record is a constant (length 0, checksum
0xFFFFFFFF), which damage can forge (zero a length and flip the checksum's bytes; or flip a
run of empty records, whose flipped bytes hold the same header four bytes further on).
:func:`test_a_forged_empty_record_is_refused_by_a_minimum_size` shows both sides.
See ``test_fuzz_protocol.py`` for the longer run's command.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import tempfile
from pathlib import Path

import trio
from hypothesis import given
from hypothesis import strategies as st

from diskqueue import DiskQueue
from diskqueue.check import check
from diskqueue.checkpoint import load_checkpoint
from diskqueue.format import HEADER_SIZE, RECORD_HEADER_SIZE, meta_filename, segment_filename
from tests.support.diskqueues import read_all
from tests.support.fuzzing import FUZZ, fuzz

NAME = "q"
MAX_BYTES = 2000


def _layout(path: Path) -> list[tuple[int, int, int]]:
    """``(segment, start, end)`` of every record, read from the intact files."""
    spans = []
    number = 0
    while (file := path / segment_filename(NAME, number)).exists():
        data = file.read_bytes()
        pos = HEADER_SIZE
        while pos < len(data):
            (length,) = struct.unpack_from(">I", data, pos)
            spans.append((number, pos, pos + RECORD_HEADER_SIZE + length))
            pos += RECORD_HEADER_SIZE + length
        number += 1
    return spans


Damage = tuple[int, int, str, int]  # segment (modulo the count), offset (modulo its size), kind, length

DAMAGE = st.tuples(st.integers(0, 50), st.integers(0, 1 << 20), st.sampled_from(["flip", "zero", "junk"]),
                   st.integers(1, 40))


def _apply(path: Path, damage: list[Damage], segments: int, seed: bytes) -> dict[int, set[int]]:
    """Damage the files; returns, per segment, the offsets whose byte actually changed."""
    files = {n: path / segment_filename(NAME, n) for n in range(segments)}
    before = {n: file.read_bytes() for n, file in files.items()}
    data = {n: bytearray(raw) for n, raw in before.items()}
    for i, (which, where, kind, size) in enumerate(damage):
        buf = data[which % segments]
        at = where % len(buf)
        for k in range(at, min(len(buf), at + size)):
            buf[k] = {"flip": buf[k] ^ 0xFF, "zero": 0, "junk": seed[(i * 41 + k) % len(seed)]}[kind]
    changed = {}
    for n, buf in data.items():
        files[n].write_bytes(bytes(buf))
        diff = {k for k in range(len(buf)) if buf[k] != before[n][k]}
        if diff:
            changed[n] = diff
    return changed


async def _drain(path: Path) -> tuple[list[bytes], int, int]:
    q = DiskQueue(NAME, path, max_bytes_per_file=MAX_BYTES, min_msg_size=1, logger=logging.getLogger("fuzz.diskqueue"))
    depth_at_open = q.depth
    out = read_all(q, 37)
    lost = q.statistics().records_lost
    assert q.depth == 0
    await q.close()
    return out, lost, depth_at_open


@fuzz(150)
@given(st.lists(st.binary(min_size=1, max_size=90), min_size=1, max_size=120), st.lists(DAMAGE, min_size=1, max_size=3),
       st.binary(min_size=1, max_size=64))
def test_damage_never_crashes_and_loss_is_counted_exactly(
    payloads: list[bytes], damage: list[Damage], seed: bytes
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)

        async def write() -> None:
            q = DiskQueue(NAME, path, max_bytes_per_file=MAX_BYTES, min_msg_size=1)
            q.put_many(payloads)
            await q.close()

        trio.run(write)
        spans = _layout(path)
        segments = 1 + max(number for number, _, _ in spans)
        changed = _apply(path, damage, segments, seed)
        touched = {i for i, (number, start, end) in enumerate(spans)
                   if any(start <= k < end or k < HEADER_SIZE for k in changed.get(number, ()))}

        report = check(path, NAME, min_msg_size=1)
        got, lost, depth_at_open = trio.run(_drain, path)
        assert_subsequence(got, payloads)
        assert lost == len(payloads) - len(got)
        assert depth_at_open >= len(got)
        if not report.lost_unknown:
            assert report.records_lost == lost and report.records == len(got)
        if len(damage) == 1:
            assert got == [p for i, p in enumerate(payloads) if i not in touched]
        assert report.ok == (not touched)


def assert_subsequence(got: list[bytes], sent: list[bytes]) -> None:
    it = iter(sent)
    assert all(any(g == s for s in it) for g in got), "records delivered out of order or invented"


def test_a_forged_empty_record_is_refused_by_a_minimum_size(tmp_path: Path) -> None:
    """Zeroing the first record's header and then flipping its checksum's bytes leaves the
    header of a valid empty record: a queue that allows empty records reads one; a queue with
    a minimum size above 0 refuses the length, resynchronises and counts the record lost."""
    payloads = [b"\x00" * 3, b"\x00" * 4]

    async def write() -> None:
        q = DiskQueue(NAME, tmp_path, max_bytes_per_file=MAX_BYTES)
        q.put_many(payloads)
        await q.close()

    trio.run(write)
    segment = tmp_path / segment_filename(NAME, 0)
    data = bytearray(segment.read_bytes())
    data[HEADER_SIZE:HEADER_SIZE + RECORD_HEADER_SIZE] = bytes(4) + b"\xff" * 4
    segment.write_bytes(bytes(data))
    saved = tmp_path / "saved"
    shutil.copytree(tmp_path, saved, ignore=shutil.ignore_patterns("saved"))

    async def drain(path: Path, min_size: int) -> tuple[list[bytes], int]:
        q = DiskQueue(NAME, path, max_bytes_per_file=MAX_BYTES, min_msg_size=min_size)
        out = read_all(q, 10)
        lost = q.statistics().records_lost
        await q.close()
        return out, lost

    assert trio.run(drain, saved, 0) == ([b"", b"\x00" * 4], 0)
    assert trio.run(drain, tmp_path, 1) == ([b"\x00" * 4], 1)


@FUZZ
@given(st.binary(max_size=300))
def test_garbage_checkpoint_is_reported_not_raised(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        meta = os.path.join(tmp, meta_filename(NAME))
        with open(meta, "wb") as f:
            f.write(raw)
        checkpoint, problem = load_checkpoint(meta)
        assert (checkpoint is None) == (problem is not None)
        shutil.rmtree(tmp, ignore_errors=True)
