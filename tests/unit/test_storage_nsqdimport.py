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
import threading
from pathlib import Path

import pytest
import trio

from broker.config.options import parse_args
from broker.core.message import decode
from broker.storage import nsqdimport
from broker.storage.datadir import DataDirectory
from broker.storage.nsqdimport import NsqdImportError, import_nsqd_queues
from broker.storage.nsqdreader import scan_nsqd_meta
from broker.storage.queuestore import QueueStore
from diskqueue import fileops
from tests.support.diskfaults import FaultyDisk
from tests.support.nsqd_files import nsqd_payload, segment_bytes, write_nsqd_queue
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
    monkeypatch.setattr(nsqdimport, "_BATCH_BYTES", 200)  # many appends (7 records each), each a point to crash after
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


# ------------------------------------------------------------- checkpoints and files nsqd reads oddly

@pytest.mark.parametrize("text, scanned", [
    ("12\n3,45\n6,789\n", (12, 3, 45, 6, 789, None)),
    ("12\n3,45\n6,789", (12, 3, 45, 6, 789, None)),  # the last newline may be missing
    ("-5\n-1,-100\n-2,-7\n", (-5, -1, -100, -2, -7, None)),
    (" +4 \n +0, 0\n0,+9\r\n", (4, 0, 0, 0, 9, None)),  # signs, spaces, CRLF
    ("4\n0,0\n1,abc\n", (0, 0, 0, 1, 0, "expected integer")),  # depth is kept only when all scans
    ("4\n0,0\n1,36x\n", (0, 0, 0, 1, 36, "newline in format does not match input")),
    ("4\n0,0\n0,99999999999999999999\n",
     (0, 0, 0, 0, 0, 'strconv.ParseInt: parsing "99999999999999999999": value out of range')),
    ("4\n0;0\n0,9\n", (0, 0, 0, 0, 0, "input does not match format")),
    ("4\n\n0,0\n0,9\n", (0, 0, 0, 0, 0, "unexpected newline")),
    ("4\n0,0\n", (0, 0, 0, 0, 0, "unexpected EOF")),
    ("", (0, 0, 0, 0, 0, "unexpected EOF")),
])
def test_nsqds_checkpoint_is_scanned_as_gos_fscanf_scans_it(text, scanned):
    assert tuple(scan_nsqd_meta(text.encode())) == scanned


def _payloads(counts: list[int]) -> list[list[bytes]]:
    start = [sum(counts[:i]) for i in range(len(counts))]
    return [[nsqd_payload(i, "q") for i in range(s, s + n)] for s, n in zip(start, counts)]


def _size(counts: list[int], number: int) -> int:
    return len(segment_bytes(_payloads(counts)[number]))


#: (records per segment, the checkpoint's text, records nsqd delivers (by number), nsqd's files
#: the queue keeps afterwards, as what). What nsqd 1.3.0 delivers from each was read from it
#: (``tests/system/test_nsqd_import.py`` runs it on such files). A segment named in
#: :data:`_DIRECTORIES` is a directory.
_ODD = [
    ("negative-depth", [4], lambda c: f"-5\n0,0\n0,{_size(c, 0)}\n", range(4), {}),
    ("negative-read-position", [4], lambda c: f"4\n0,-100\n0,{_size(c, 0)}\n", range(4), {0: ".bad"}),
    ("negative-read-file", [4], lambda c: f"4\n-1,0\n0,{_size(c, 0)}\n", range(4), {}),
    ("read-file-far-behind", [4], lambda c: f"4\n-999999,0\n0,{_size(c, 0)}\n", range(4), {}),
    ("negative-write-position", [4], lambda c: "4\n0,0\n0,-1\n", range(4), {}),
    ("negative-write-file", [4], lambda c: f"4\n0,0\n-1,{_size(c, 0)}\n", range(4), {}),
    ("all-negative", [4], lambda c: "-4\n-1,-1\n-1,-1\n", [], {0: ".unread"}),
    ("read-position-past-the-end", [4], lambda c: f"4\n0,{_size(c, 0) + 100}\n0,{_size(c, 0)}\n", [],
     {0: ".unread"}),
    ("write-position-past-the-end", [4], lambda c: f"4\n0,0\n0,{_size(c, 0) + 100}\n", range(4), {0: ".bad"}),
    ("read-file-999999999", [4], lambda c: f"4\n999999999,0\n0,{_size(c, 0)}\n", [], {0: ".unread"}),
    ("write-file-999999999", [4], lambda c: "4\n0,0\n999999999,0\n", range(4), {}),
    ("read-file-past-the-write-file", [2, 2, 2], lambda c: f"6\n2,0\n1,{_size(c, 1)}\n", range(4, 6),
     {0: ".unread", 1: ".unread"}),
    ("a-file-after-the-write-file", [2, 2, 2], lambda c: f"4\n0,0\n1,{_size(c, 1)}\n", range(4), {2: ".unread"}),
    ("write-position-not-a-number", [2, 2], lambda c: "4\n0,0\n1,abc\n", range(2), {1: ".unread"}),
    ("write-position-overflows", [4], lambda c: "4\n0,0\n0,99999999999999999999\n", [], {0: ".unread"}),
    ("signs-and-spaces", [4], lambda c: f" 4 \n+0, +0\n0,{_size(c, 0)}\r\n", range(4), {}),
    ("a-directory-segment", [2, 2, 2], lambda c: f"6\n0,0\n2,{_size(c, 2)}\n", [0, 1, 4, 5], {1: ".bad"}),
]
_DIRECTORIES = {"a-directory-segment": 1}


@pytest.mark.parametrize("case, counts, meta, delivered, kept", _ODD, ids=[case[0] for case in _ODD])
async def test_a_queue_nsqd_reads_oddly_is_imported_as_nsqd_reads_it(tmp_path, caplog, case, counts, meta, delivered,
                                                                     kept):
    """Deliveries as nsqd's, and no file nsqd keeps is removed: it stays, set aside, with a warning."""
    caplog.set_level(logging.INFO, "pynsqd.import")
    segments = _payloads(counts)
    write_nsqd_queue(tmp_path, "q", segments, meta=meta(counts))
    original = {n: (tmp_path / f"q.diskqueue.{n:06d}.dat").read_bytes() for n in range(len(counts))}
    if case in _DIRECTORIES:
        path = tmp_path / f"q.diskqueue.{_DIRECTORIES[case]:06d}.dat"
        path.unlink()
        path.mkdir()
        (path / "inside").write_bytes(b"x")

    with trio.fail_after(30):
        done = await run_import(tmp_path)

    every = [p for s in segments for p in s]
    assert await pynsqd_records(tmp_path, "q") == [every[i] for i in delivered]
    assert done[0].messages == len(delivered)
    set_aside = {p.name: p for p in tmp_path.iterdir() if p.name.endswith((".bad", ".unread"))}
    assert sorted(set_aside) == sorted(f"q.diskqueue.{n:06d}.dat{suffix}" for n, suffix in kept.items())
    for number, suffix in kept.items():
        path = set_aside[f"q.diskqueue.{number:06d}.dat{suffix}"]
        assert path.is_dir() or path.read_bytes() == original[number]  # whole, as nsqd left it
        assert f"q.diskqueue.{number:06d}.dat" in caplog.text
    assert claimed_files(tmp_path) == []
    assert not [r for r in caplog.records if r.levelno > logging.WARNING]
    assert await run_import(tmp_path) == []  # imported once


class _Seen(logging.Handler):
    """Sets ``event`` when a record holding ``words`` is logged (from any thread)."""

    def __init__(self, words: str):
        super().__init__()
        self.words = words
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.words in record.getMessage():
            self.event.set()


async def test_many_queues_are_copied_side_by_side_and_the_log_says_how_far(tmp_path, caplog, monkeypatch):
    """The queues' copies overlap (the final syncs of two are under way at once), the data
    directory is listed a constant number of times whatever the number of queues, and the
    log says what the import does while it runs."""
    caplog.set_level(logging.INFO, "pynsqd.import")
    monkeypatch.setattr(nsqdimport, "PROGRESS_INTERVAL", 0.01)
    names = [f"t{i:03d}" for i in range(200)]
    for i, name in enumerate(names):
        write_nsqd_queue(tmp_path, name, [[nsqd_payload(i, name)]])
    progress = _Seen("queue(s) imported")
    logging.getLogger("pynsqd.import").addHandler(progress)
    lock = threading.Lock()
    syncing = [0, 0]  # now, most at once
    second = threading.Event()
    listings = []

    def fdatasync(fd: int) -> None:
        with lock:
            syncing[0] += 1
            syncing[1] = max(syncing)
            if syncing[0] >= 2:
                second.set()
        try:
            # the first sync waits for another to start beside it, and for a progress line
            if second.wait(10):
                progress.event.wait(10)
            real["fdatasync"](fd)
        finally:
            with lock:
                syncing[0] -= 1

    def listdir(path: str) -> list[str]:
        listings.append(path)
        return real["listdir"](path)

    real = fileops.substitute({"fdatasync": fdatasync, "listdir": listdir})
    try:
        with trio.fail_after(60):
            done = await run_import(tmp_path)
    finally:
        fileops.substitute(real)
        logging.getLogger("pynsqd.import").removeHandler(progress)

    assert [q.name for q in done] == names and all(q.messages == 1 for q in done)
    assert syncing[1] >= 2
    assert len(listings) <= 2, listings
    assert "nsqd import: importing 200 nsqd queue(s) (200 file(s)," in caplog.text
    assert "queue(s) imported, " in caplog.text
    assert "nsqd import: imported 200 message(s) of 200 nsqd queue(s) in " in caplog.text
    assert [await pynsqd_records(tmp_path, name) for name in names] == [[nsqd_payload(i, n)] for i, n in enumerate(names)]
