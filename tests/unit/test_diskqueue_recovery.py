"""Crash recovery, corruption handling, check(), and I/O errors, on real files."""

from __future__ import annotations

import errno
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from diskqueue import DiskQueue, DiskQueueIOError, FormatVersionError, fileops
from diskqueue.__main__ import main as check_main
from diskqueue.check import check
from diskqueue.format import HEADER_SIZE, meta_filename, segment_filename
from tests.support.diskqueues import read_all, records
from tests.support.mounts import tmpfs
from tests.support.paths import REPO

NAME = "topic"
RECORD = 28  # 20-byte payloads + 8-byte frame
PER_SEGMENT = 9  # with max_bytes_per_file=300: (300 - 32) // 28


def seg(path: Path, number: int) -> Path:
    return path / segment_filename(NAME, number)


def offset(index_in_segment: int) -> int:
    return HEADER_SIZE + index_in_segment * RECORD


def patch(file: Path, at: int, data: bytes) -> None:
    with open(file, "r+b") as f:
        f.seek(at)
        f.write(data)


async def written(path: Path, sent: list[bytes], *, sync: bool = True, **options) -> None:
    q = DiskQueue(NAME, path, max_bytes_per_file=300, **options)
    q.put_many(sent)
    if sync:
        await q.close()
    else:
        shutil.copytree(path, path.with_name(path.name + "-crash"))
        await q.close()
        shutil.rmtree(path)
        path.with_name(path.name + "-crash").rename(path)


def reopen(path: Path, **options) -> DiskQueue:
    return DiskQueue(NAME, path, max_bytes_per_file=300, **options)


async def test_unsynced_tail_is_kept(tmp_path: Path) -> None:
    sent = records(40)
    with trio.fail_after(10):
        q = DiskQueue(NAME, tmp_path / "q", max_bytes_per_file=300)
        q.put_many(sent[:20])
        await q.sync()
        q.put_many(sent[20:])  # never synced, never checkpointed
        shutil.copytree(tmp_path / "q", tmp_path / "crash")
        await q.close()
        q = reopen(tmp_path / "crash")
        assert q.depth == 40 and q.statistics().records_lost == 0
        assert read_all(q, 5) == sent
        await q.close()


async def test_records_without_any_checkpoint_are_kept(tmp_path: Path) -> None:
    sent = records(30)
    with trio.fail_after(10):
        await written(tmp_path / "q", sent, sync=False)
        assert not (tmp_path / "q" / meta_filename(NAME)).exists()
        q = reopen(tmp_path / "q")
        assert q.depth == 30 and read_all(q, 5) == sent
        await q.close()


@pytest.mark.parametrize("cut", [1, 7, 8, 20], ids=lambda c: f"keep{c}bytes")
async def test_torn_final_record_is_cut_off(tmp_path: Path, cut: int) -> None:
    sent = records(25)  # segments 0, 1 full; 7 records in segment 2
    with trio.fail_after(10):
        q = DiskQueue(NAME, tmp_path / "q", max_bytes_per_file=300)
        q.put_many(sent[:20])
        await q.sync()
        q.put_many(sent[20:])
        shutil.copytree(tmp_path / "q", tmp_path / "c")
        await q.close()
        last = seg(tmp_path / "c", 2)
        os.truncate(last, offset(6) + cut)  # the 25th record was only partly written
        q = reopen(tmp_path / "c")
        assert q.depth == 24
        assert os.path.getsize(last) == offset(6)
        q.put(b"new")  # lands on the record boundary, not inside the torn record
        await q.close()
        q = reopen(tmp_path / "c")
        assert read_all(q, 5) == sent[:24] + [b"new"]
        await q.close()


async def test_zero_filled_tail_is_cut_off(tmp_path: Path) -> None:
    sent = records(12)
    with trio.fail_after(10):
        await written(tmp_path / "q", sent, sync=False)
        with open(seg(tmp_path / "q", 1), "ab") as f:
            f.write(bytes(4096))  # the file grew but its data never reached the disk
        q = reopen(tmp_path / "q")
        assert q.depth == 12
        q.put(b"next")
        assert read_all(q, 5) == sent + [b"next"]
        await q.close()


async def test_truncated_synced_segment(tmp_path: Path) -> None:
    sent = records(30)
    with trio.fail_after(10):
        await written(tmp_path / "q", sent)
        os.truncate(seg(tmp_path / "q", 3), offset(1) + 5)  # segment 3 held records 27..29
        q = reopen(tmp_path / "q")
        assert q.depth == 28
        assert q.statistics().records_lost == 2
        q.put(b"more")
        assert read_all(q, 5) == sent[:28] + [b"more"]
        await q.close()


@pytest.mark.parametrize("field", ["length", "checksum", "payload"])
async def test_corrupt_record_in_the_middle(tmp_path: Path, field: str) -> None:
    sent = records(50)
    with trio.fail_after(10):
        await written(tmp_path / "q", sent)
        at = offset(3)  # the 4th record of segment 1 (record 12)
        garble = {"length": (at, b"\x7f\x00\x00\x00"), "checksum": (at + 5, b"\xff"), "payload": (at + 12, b"!")}
        patch(seg(tmp_path / "q", 1), *garble[field])
        report = check(tmp_path / "q", NAME)
        assert not report.ok and report.records == 49 and report.records_lost == 1
        assert report.corrupt == ((1, at),)

        q = reopen(tmp_path / "q")
        depth_at_open = q.depth
        got = read_all(q, 5)
        assert got == sent[:12] + sent[13:]  # only the damaged record is skipped
        lost = q.statistics().records_lost
        assert lost == 1 and depth_at_open == len(got) + lost and q.depth == 0
        await q.sync()
        assert (tmp_path / "q" / (segment_filename(NAME, 1) + ".bad")).exists()
        assert not seg(tmp_path / "q", 1).exists()
        q.put(b"after")
        assert q.read_many(5) == [b"after"]
        await q.close()
        q = reopen(tmp_path / "q")
        assert q.depth == 0 and q.read_many(5) == []
        await q.close()


async def test_corruption_in_the_segment_being_written(tmp_path: Path) -> None:
    sent = records(15)  # segment 1 holds records 9..14 and is the write segment
    with trio.fail_after(10):
        await written(tmp_path / "q", sent)
        patch(seg(tmp_path / "q", 1), offset(2) + 6, b"\x00\x00")
        q = reopen(tmp_path / "q")
        q.put_many(records(3, start=100))
        got = read_all(q, 5)
        assert got == sent[:11] + sent[12:] + records(3, start=100)
        assert q.statistics().records_lost == 1 and q.depth == 0
        await q.close()
        assert (tmp_path / "q" / (segment_filename(NAME, 1) + ".bad")).exists()


async def test_corruption_found_with_uncommitted_records_before_it(tmp_path: Path) -> None:
    sent = records(30)
    with trio.fail_after(10):
        await written(tmp_path / "q", sent)
        patch(seg(tmp_path / "q", 1), offset(5) + 4, b"\xde\xad")
        q = reopen(tmp_path / "q", auto_commit=False)
        assert read_all(q, 5) == sent[:14] + sent[15:]
        q.commit(3)
        await q.close()  # the corrupt segment still holds uncommitted records: it is kept
        assert seg(tmp_path / "q", 1).exists()
        q = reopen(tmp_path / "q", auto_commit=False)
        assert q.depth == 26
        assert read_all(q, 5) == sent[3:14] + sent[15:]
        assert q.statistics().records_lost == 0  # already counted: not counted twice
        q.commit()
        await q.close()
        assert not seg(tmp_path / "q", 1).exists()
        assert (tmp_path / "q" / (segment_filename(NAME, 1) + ".bad")).exists()


async def test_deleted_segment(tmp_path: Path) -> None:
    sent = records(45)
    with trio.fail_after(10):
        await written(tmp_path / "q", sent)
        os.unlink(seg(tmp_path / "q", 2))
        report = check(tmp_path / "q", NAME)
        assert not report.ok and report.records == 36 and report.records_lost == 9
        q = reopen(tmp_path / "q")
        assert q.depth == 36  # the checkpoint does not match: records were counted
        assert q.statistics().records_lost == 9
        assert read_all(q, 5) == sent[:18] + sent[27:]
        await q.close()


async def test_garbled_segment_header(tmp_path: Path) -> None:
    sent = records(45)
    with trio.fail_after(10):
        await written(tmp_path / "q", sent)
        patch(seg(tmp_path / "q", 1), 10, b"\xff")
        q = reopen(tmp_path / "q")
        assert q.depth == 36
        assert read_all(q, 5) == sent[:9] + sent[18:]
        assert q.statistics().records_lost == 9
        await q.close()
        assert (tmp_path / "q" / (segment_filename(NAME, 1) + ".bad")).exists()


async def test_garbled_checkpoint_replays_from_oldest_segment(tmp_path: Path) -> None:
    sent = records(50)
    with trio.fail_after(10):
        q = DiskQueue(NAME, tmp_path, max_bytes_per_file=300)
        q.put_many(sent)
        assert q.read_many(22) == sent[:22]
        await q.close()  # segments 0 and 1 are consumed and removed; reading is inside segment 2
        patch(tmp_path / meta_filename(NAME), 3, b"garbage")
        q = reopen(tmp_path)
        assert q.depth == 32  # counted from the start of segment 2: 4 consumed records come back
        assert read_all(q, 5) == sent[18:]
        await q.close()
        assert (tmp_path / (meta_filename(NAME) + ".bad")).exists()
        q = reopen(tmp_path)
        assert q.depth == 0
        await q.close()


def replace_with_directory(path: Path) -> None:
    """What a confused restore or a file system repair can leave: a directory where a file was."""
    if path.exists():
        path.unlink()
    path.mkdir()
    (path / "inside").write_bytes(b"x")


async def test_a_directory_in_place_of_the_checkpoint_is_set_aside(tmp_path: Path) -> None:
    sent = records(20)
    with trio.fail_after(10):
        await written(tmp_path, sent)
        replace_with_directory(tmp_path / meta_filename(NAME))
        q = reopen(tmp_path)  # nothing consumed yet: replaying every segment loses nothing
        assert q.depth == 20 and read_all(q, 5) == sent
        await q.close()
        assert (tmp_path / (meta_filename(NAME) + ".bad") / "inside").exists()
        q = reopen(tmp_path)
        assert q.depth == 0
        await q.close()


async def test_a_directory_in_place_of_the_temporary_checkpoint_is_set_aside(tmp_path: Path) -> None:
    sent = records(20)
    with trio.fail_after(10):
        await written(tmp_path, sent)
        replace_with_directory(tmp_path / (meta_filename(NAME) + ".tmp"))
        q = reopen(tmp_path)
        assert read_all(q, 5) == sent
        await q.close()  # writes the checkpoint through the temporary file
        assert (tmp_path / (meta_filename(NAME) + ".tmp.bad") / "inside").exists()
        q = reopen(tmp_path)
        assert q.depth == 0
        await q.close()


@pytest.mark.parametrize("number", [0, 2, 4], ids=["oldest", "middle", "newest"])
async def test_a_directory_in_place_of_a_segment_costs_its_records_only(tmp_path: Path, number: int) -> None:
    sent = records(45)  # segments 0..4, 9 records each
    with trio.fail_after(10):
        await written(tmp_path, sent)
        replace_with_directory(seg(tmp_path, number))
        q = reopen(tmp_path)
        kept = sent[: number * PER_SEGMENT] + sent[(number + 1) * PER_SEGMENT:]
        assert read_all(q, 5) == kept
        assert q.statistics().records_lost == PER_SEGMENT
        q.put(b"after")
        assert read_all(q, 5) == [b"after"]
        await q.close()
        assert (tmp_path / (segment_filename(NAME, number) + ".bad") / "inside").exists()


async def test_missing_checkpoint_keeps_everything_on_disk(tmp_path: Path) -> None:
    sent = records(20)
    with trio.fail_after(10):
        await written(tmp_path, sent)
        os.unlink(tmp_path / meta_filename(NAME))
        q = reopen(tmp_path)
        assert q.depth == 20 and read_all(q, 5) == sent
        await q.close()


async def test_newer_format_is_refused_not_marked_bad(tmp_path: Path) -> None:
    with trio.fail_after(10):
        await written(tmp_path, records(3))
        import zlib

        body = struct.pack(">4sHHIIQI", b"PDQS", 2, 32, 0, 0, 0, 0)
        patch(seg(tmp_path, 0), 0, body + struct.pack(">I", zlib.crc32(body)))
        with pytest.raises(FormatVersionError):
            reopen(tmp_path)
        assert seg(tmp_path, 0).exists()


async def test_check_is_read_only_and_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with trio.fail_after(10):
        await written(tmp_path, records(30))
        report = check(tmp_path, NAME)
        assert report.ok and report.records == 30 and report.checkpoint == "ok"
        assert report.checkpoint_depth == 30 and report.segments == (0, 1, 2, 3)
        patch(seg(tmp_path, 0), offset(4), b"\xff\xff\xff\xff")
        before = {p: (tmp_path / p).read_bytes() for p in os.listdir(tmp_path)}
        report = check(tmp_path, NAME)
        assert {p: (tmp_path / p).read_bytes() for p in os.listdir(tmp_path)} == before
        assert not report.ok and report.records == 29 and report.records_lost == 1
        assert "PROBLEMS FOUND" in report.format()
        assert check_main([str(tmp_path)]) == 1
        assert "segment 000000 offset 144" in capsys.readouterr().out
        assert check_main([str(tmp_path / "missing")]) == 2


def test_check_command_line(tmp_path: Path) -> None:
    async def make() -> None:
        await written(tmp_path, records(5))

    trio.run(make)
    result = subprocess.run([sys.executable, "-m", "diskqueue", str(tmp_path), NAME],
                            capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "queue 'topic'" in result.stdout and ": OK" in result.stdout


# -- I/O errors ---------------------------------------------------------------------------


class FullDisk:
    """``fileops.pwrite`` that behaves like a disk with ``free`` bytes left: short write, then ENOSPC."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.real = fileops.pwrite

    def __call__(self, fd: int, data, offset: int) -> int:
        if self.free <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = min(len(data), self.free)
        self.free -= n
        return self.real(fd, bytes(data[:n]), offset)


async def test_full_disk_loses_nothing_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    disk = FullDisk(1000)
    monkeypatch.setattr(fileops, "pwrite", disk)
    accepted: list[bytes] = []
    with trio.fail_after(10):
        q = DiskQueue(NAME, tmp_path / "q", max_bytes_per_file=300)
        batch = 0
        with pytest.raises(DiskQueueIOError) as info:
            while True:
                sent = records(4, start=batch * 4)
                try:
                    q.put_many(sent)
                except DiskQueueIOError as exc:
                    accepted += sent[: exc.accepted]
                    raise
                accepted += sent
                batch += 1
        # named as nsqd names a failed write (Go's form of the OS error), plus what of the batch was written
        written = (f" (the first {info.value.accepted} record(s) of the batch were written)"
                   if info.value.accepted else "")
        failed_in = seg(tmp_path / "q", q.statistics().write_cursor[0])
        assert info.value.errno == errno.ENOSPC
        assert str(info.value) == f"write {failed_in}: no space left on device{written}"
        assert q.depth == len(accepted)
        shutil.copytree(tmp_path / "q", tmp_path / "crash")
        for number in range(q.statistics().write_cursor[0] + 1):
            path = seg(tmp_path / "q", number)
            if path.exists():
                assert (os.path.getsize(path) - HEADER_SIZE) % RECORD == 0  # no partial batch left behind
        disk.free = 10**9  # space freed
        q.put(b"after")
        assert read_all(q, 5) == accepted + [b"after"]
        await q.close()
    monkeypatch.undo()
    with trio.fail_after(10):
        q = reopen(tmp_path / "crash")
        assert read_all(q, 5) == accepted
        await q.close()


async def test_permission_denied_creating_a_segment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = fileops.open
    denied = [True]

    def guarded_open(path, flags, *args, **kwargs):
        if denied[0] and flags & os.O_CREAT and str(path).endswith(".dat") and ".meta." not in str(path):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        return real_open(path, flags, *args, **kwargs)

    with trio.fail_after(10):
        q = DiskQueue(NAME, tmp_path, max_bytes_per_file=300)
        denied[0] = False
        q.put_many(records(9))  # fills segment 0
        denied[0] = True
        monkeypatch.setattr(fileops, "open", guarded_open)
        with pytest.raises(DiskQueueIOError) as info:
            q.put_many(records(3, start=9))
        assert info.value.errno == errno.EACCES and info.value.accepted == 0
        assert q.depth == 9
        denied[0] = False
        q.put_many(records(3, start=9))
        monkeypatch.undo()
        assert read_all(q, 5) == records(12)
        await q.close()


async def test_full_tmpfs(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "256k") as mount, trio.fail_after(30):
        (mount / "ballast").write_bytes(b"\0" * 32768)
        q = DiskQueue(NAME, mount, max_bytes_per_file=16384)
        accepted: list[bytes] = []
        i = 0
        while True:
            sent = [b"%06d" % (i + k) + b"x" * 994 for k in range(10)]
            try:
                q.put_many(sent)
            except DiskQueueIOError as exc:
                assert exc.errno == errno.ENOSPC
                accepted += sent[: exc.accepted]
                break
            accepted += sent
            i += 10
        with pytest.raises(DiskQueueIOError):
            await q.sync()  # even the checkpoint cannot be written
        assert q.read_many(10**6) == accepted
        os.unlink(mount / "ballast")
        q.put(b"after")
        await q.close()
        q = DiskQueue(NAME, mount, max_bytes_per_file=16384)
        assert q.read_many(10) == [b"after"]
        await q.close()
