"""Power cuts under a lone DiskQueue: every acknowledged record that was not committed
survives, in order, and recovery never fails.

A seeded random run of ``put_many``, ``read_many``, ``commit``, ``sync(commits=True)``,
``sync(commits=False)``, ``empty`` (and the queue's own sync policy, ``run()``, in worker
threads), with segments small enough to roll often, is recorded by
``tests/support/powercut.py``. Then, at crash points of the record (``Recorder.crash_points``:
anywhere, right after an acknowledgement, right after a checkpoint, right after a file
creation or rename), the directory is rebuilt as a power cut there could leave it, and the
queue is opened on it and read to the end.

Power-cut model (implemented by ``powercut.Disk``):

* data and metadata reach stable storage only through fsync. A file's contents written
  since its last fsync may be lost entirely, partially or torn: each unsynced write is
  independently kept, dropped, kept as a prefix (torn at any byte), kept sector by sector
  at random, or zero-filled (the size grew, the data did not land); an unsynced
  ``ftruncate`` is kept or dropped. ``fdatasync`` makes the file's data and size durable;
* a created file, a rename or replace and an unlink are durable only after an fsync of
  the directory; before that the directory may show the old or the new name;
* besides such random cuts, a crash point may get either extreme: every write kept (what
  a killed process leaves) or nothing kept that was not fsynced.

Half the runs preallocate segments (``preallocate=``, as the broker's ``--durable``
queues do); the model records each extension as a write of zero bytes.

Acknowledged: a record put before a ``sync()`` (either kind) that then returned. After
reconstruction, every acknowledged record not committed before the cut is read back, in
the order written; records read are exactly records written (nothing invented), in order,
each at most once; committed records may come back (counted as duplicates). The recovered
queue then takes a new record, closes, and a reopen reads exactly that record. In a
quarter of the cases the recovery itself is recorded and cut again at a random point
before the final recovery: a power cut during the restart that follows a power cut, or
that follows a kill (the restart then runs on files whose last writes are still only in the
page cache, and the model goes on from there). ``test_the_simulation_finds_a_missing_fsync``
shows that the check fails when fsyncs of the directory, or of the data, do nothing.

Run longer (the CI run is seeded and short; the seed is printed)::

    PYNSQD_POWERCUT_POINTS=5000 PYNSQD_POWERCUT_SEED=random python -m pytest -q -s \\
        -p no:cacheprovider tests/unit/test_power_loss_diskqueue.py

``PYNSQD_POWERCUT_POINTS`` is the number of crash points (one recorded run per
``POINTS_PER_RUN``); ``PYNSQD_POWERCUT_SEED`` the first run's seed (an integer, or
``random``). A failure names the seed, the run, the crash point, the power-cut choices and
the operations recorded before the cut, and keeps the rebuilt directory.
"""

from __future__ import annotations

import ast
import dataclasses
import logging
import os
import random
import shutil
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio

from diskqueue import DiskQueue
from tests.support.diskqueues import read_all
from tests.support.paths import REPO
from tests.support.powercut import Disk, Op, Recorder, check_model, crash_points, first_seed, write_directory

NAME = "q"
#: Crash points tried on each recorded run.
POINTS_PER_RUN = 40
#: Crash points in the CI run.
CI_POINTS = 400
#: Operations of one recorded run.
STEPS = 160
LOG = logging.getLogger("powercut.diskqueue")


@dataclass
class Shape:
    """The queue's parameters in one run."""

    max_bytes: int
    sync_every: int
    auto_commit: bool
    preallocate: int  # bytes a segment is extended ahead of its data (0: not at all)

    def open(self, path: Path) -> DiskQueue:
        return DiskQueue(NAME, path, max_bytes_per_file=self.max_bytes, sync_every=self.sync_every,
                         sync_timeout=3600.0, auto_commit=self.auto_commit, logger=LOG,
                         preallocate=self.preallocate)


@dataclass
class Promises:
    """What the marks before a crash point promise: which records (by index) were acknowledged, committed, emptied."""

    acked: int = 0  # records [0, acked) were acknowledged
    emptied: int = 0  # records [0, emptied) were dropped by empty()
    committed: set[int] = field(default_factory=set)

    def apply(self, event: tuple) -> None:
        kind = event[0]
        if kind == "acked":
            self.acked = max(self.acked, event[1])
        elif kind == "emptied":
            self.emptied = max(self.emptied, event[1])
        elif kind == "committed":
            self.committed.update(event[1])

    def owed(self) -> list[int]:
        return [i for i in range(self.emptied, self.acked) if i not in self.committed]


def payload(i: int, rng: random.Random) -> bytes:
    return b"%07d:" % i + rng.randbytes(rng.randrange(0, 90))


async def record_run(path: Path, rng: random.Random, make: type[Recorder]) -> tuple[Recorder, Shape, list[bytes]]:
    """Run random operations on a queue in ``path`` under a recorder of type ``make``;
    returns it, the shape and every payload put, by index."""
    shape = Shape(max_bytes=rng.choice([200, 400, 1500]), sync_every=rng.choice([3, 10, 50]),
                  auto_commit=rng.random() < 0.3, preallocate=rng.choice([0, 0, 64, 1000]))
    path.mkdir()
    recorder = make(path)
    written: list[bytes] = []
    unread: deque[int] = deque()
    handed: deque[int] = deque()

    async def acknowledge(q: DiskQueue, upto: int, commits: bool) -> None:
        await q.sync(commits=commits)
        recorder.mark(("acked", upto))

    with recorder.installed(), trio.fail_after(60):
        q = shape.open(path)
        async with trio.open_nursery() as policy:
            policy.start_soon(q.run)
            async with trio.open_nursery() as syncs:
                for _ in range(STEPS):
                    roll = rng.random()
                    if roll < 0.35:
                        batch = [payload(len(written) + k, rng) for k in range(rng.randrange(1, 9))]
                        first = len(written)
                        q.put_many(batch)
                        written += batch
                        unread.extend(range(first, len(written)))
                        recorder.mark(("put", first, len(batch)))
                    elif roll < 0.6:
                        got = q.read_many(rng.randrange(1, 12))
                        indices = [unread.popleft() for _ in got]
                        assert got == [written[i] for i in indices], "the live queue read out of order"
                        if shape.auto_commit:
                            recorder.mark(("committed", indices))
                        else:
                            handed.extend(indices)
                    elif roll < 0.75:
                        if handed:
                            n = rng.randrange(1, len(handed) + 1)
                            q.commit(n)
                            recorder.mark(("committed", [handed.popleft() for _ in range(n)]))
                    elif roll < 0.97:
                        commits = rng.random() < 0.5
                        if rng.random() < 0.5:
                            await acknowledge(q, len(written), commits)
                        else:  # more operations while this sync's fsyncs run in a worker thread
                            syncs.start_soon(acknowledge, q, len(written), commits)
                    else:
                        recorder.mark(("emptied", len(written)))  # from here on they may be gone
                        q.empty()
                        unread.clear()
                        handed.clear()
                    await trio.sleep(0)
            await q.close()
    return recorder, shape, written


def cut(disk: Disk, rng: random.Random, mode: str | None = None) -> tuple[dict[str, bytes], list[str], str]:
    """A power cut (``mode``, or one drawn: mostly random, else everything kept or nothing unsynced)."""
    mode = mode or rng.choices(["random", "kept", "lost"], weights=[6, 2, 2])[0]
    files, choices = disk.power_cut(rng, mode)
    return files, choices, mode


async def restart_cut(path: Path, shape: Shape, rng: random.Random, target: Path, disk: Disk) -> tuple[Path, str]:
    """Record a recovery of ``path`` (open, read everything without committing, close) on
    top of ``disk``, the model of ``path``; cut it at a random point into ``target``.
    Returns ``target`` and what was done."""
    recorder = Recorder(path)
    with recorder.installed():
        q = dataclasses.replace(shape, auto_commit=False).open(path)  # reading must not consume them
        read_all(q, 64, exact=False)
        await q.close()
    point = rng.randrange(len(recorder.ops) + 1)
    disk.advance(recorder.ops, point)
    files, choices, mode = cut(disk, rng)
    note = (f"then the recovery was cut at {point}/{len(recorder.ops)} ({mode}: {'; '.join(choices) or '-'}); "
            f"its operations:\n{recorder.trace(point)}")
    return write_directory(target, files), note


async def check_recovery(path: Path, shape: Shape, written: list[bytes], owed: list[int]) -> int:
    """Open the queue in ``path``, read everything; returns the records read that were not owed."""
    index = {data: i for i, data in enumerate(written)}
    q = shape.open(path)
    got = read_all(q, 64, exact=False)
    invented = [data[:16] for data in got if data not in index]
    assert not invented, f"records that were never written: {invented}"
    order = [index[data] for data in got]
    assert order == sorted(set(order)), f"records out of order or repeated: {order}"
    missing = sorted(set(owed) - set(order))
    assert not missing, f"{len(missing)} acknowledged, uncommitted record(s) lost: {missing}"
    q.commit()
    q.put(b"after the restart")
    await q.close()
    q = shape.open(path)
    assert read_all(q, 64, exact=False) == [b"after the restart"], "the recovered queue did not keep a new record"
    await q.close()
    return len(order) - len(owed)


@dataclass
class Tally:
    """What a series of crash points found."""

    tried: int = 0
    cut_twice: int = 0
    returned: int = 0


async def explore(tmp_path: Path, seed: int, points: int, recorder: type[Recorder] = Recorder) -> Tally:
    """Try ``points`` crash points over recorded runs seeded from ``seed``; raises
    ``AssertionError`` (with the whole story) at the first one that breaks a promise."""
    tally = Tally()
    for run in range(-(-points // POINTS_PER_RUN)):
        rng = random.Random(seed + run)
        base = tmp_path / f"run{run}"
        base.mkdir()
        record, shape, written = await record_run(base / "live", rng, recorder)
        check_model(Disk(record.initial), record, base / "live")
        disk = Disk(record.initial)
        marks = iter(record.marks())
        pending = next(marks, None)
        promises = Promises()
        share = min(POINTS_PER_RUN, points - run * POINTS_PER_RUN)
        for n, point in enumerate(record.crash_points(share, rng)):
            disk.advance(record.ops, point)
            while pending is not None and pending[0] < point:
                promises.apply(pending[1])
                pending = next(marks, None)
            twice = rng.random() < 0.25
            files, choices, mode = cut(disk, rng, "kept" if twice and rng.random() < 0.5 else None)
            kept = write_directory(base / f"cut{n}", files)
            target = base / f"cut{n}-recovered"
            shutil.copytree(kept, target)
            context = (f"seed {seed} run {run} ({shape}), crash point {point} of {len(record.ops)}, "
                       f"{mode} cut: {'; '.join(choices) or '-'}\nthe directory the cut left: {kept}\n"
                       f"operations before the cut:\n{record.trace(point)}")
            with trio.fail_after(30):
                try:
                    if twice:
                        # after a kill the restart's writes join the killed process's unsynced ones;
                        # after a power cut everything on disk is stable
                        after = disk.killed() if mode == "kept" else Disk(files)
                        target, note = await restart_cut(target, shape, rng, base / f"cut{n}-restart", after)
                        context += "\n" + note
                        tally.cut_twice += 1
                    tally.returned += await check_recovery(target, shape, written, promises.owed())
                except Exception as exc:
                    raise AssertionError(f"{exc}\n{context}") from exc
            tally.tried += 1
    return tally


async def test_power_cuts_lose_no_acknowledged_record(tmp_path: Path) -> None:
    points, seed = crash_points(CI_POINTS), first_seed()
    print(f"\npower cuts under a DiskQueue: seed {seed}, {points} crash points")
    tally = await explore(tmp_path, seed, points)
    print(f"power cuts under a DiskQueue: {tally.tried} crash points tried ({tally.cut_twice} cut again during "
          f"the restart), nothing acknowledged lost; {tally.returned} committed record(s) delivered again")
    assert tally.tried == points


class WithoutDirectoryFsync(Recorder):
    """A file system on which an fsync of the directory does nothing: new names never become durable."""

    def fsync(self, fd: int) -> None:
        if not self.is_directory(fd):
            super().fsync(fd)


class WithoutDataFsync(Recorder):
    """A file system on which an fsync of a file does nothing: its data never becomes durable."""

    def fsync(self, fd: int) -> None:
        if self.is_directory(fd):
            super().fsync(fd)


@pytest.mark.parametrize("recorder", [WithoutDirectoryFsync, WithoutDataFsync], ids=["directory", "data"])
async def test_the_simulation_finds_a_missing_fsync(tmp_path: Path, recorder: type[Recorder]) -> None:
    """The check can fail: with fsyncs of one kind ignored, acknowledged records are lost."""
    with pytest.raises(AssertionError, match="acknowledged, uncommitted record"):
        await explore(tmp_path, 20250611, 400, recorder)


#: What of ``os`` the disk queue may use directly: constants and path arithmetic, no I/O.
_PURE_OS = {"fspath", "sep", "PathLike", "path.join", "path.dirname", "path.basename", "path.split", "strerror"}


def test_diskqueue_reaches_the_file_system_only_through_fileops() -> None:
    """The simulation sees only what goes through ``diskqueue/fileops.py``: any other file
    call in the package would escape it."""
    escapes = []
    for source in sorted((REPO / "diskqueue").glob("*.py")):
        if source.name == "fileops.py":
            continue
        for node in ast.walk(ast.parse(source.read_text(), str(source))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os":
                name = node.attr
            elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                  and isinstance(node.value.value, ast.Name) and node.value.value.id == "os"):
                name = f"{node.value.attr}.{node.attr}"
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open":
                name = "open() (builtin)"
            else:
                continue
            if not (name in _PURE_OS or name.startswith("O_") or name == "path"):
                escapes.append(f"{source.name}:{node.lineno}: os.{name}")
    assert not escapes, escapes


def test_the_model_reopens_a_temporary_file_a_killed_process_left() -> None:
    """A kill between creating ``nsqd.dat.tmp`` and renaming it leaves the file; the next
    process creates it again with O_TRUNC, which opens and empties it (O_EXCL would fail)."""
    create = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    disk = Disk({})
    first = [Op("open", fd=3, name="nsqd.dat.tmp", flags=create),
             Op("write", fd=3, name="nsqd.dat.tmp", offset=0, data=b"old")]
    disk.advance(first, len(first))
    restarted = disk.killed()
    second = [Op("open", fd=3, name="nsqd.dat.tmp", flags=create),
              Op("write", fd=3, name="nsqd.dat.tmp", offset=0, data=b"new!")]
    restarted.advance(second, len(second))
    assert restarted.files_now() == {"nsqd.dat.tmp": b"new!"}
    with pytest.raises(AssertionError, match="model out of step"):
        exclusive = Op("open", fd=4, name="nsqd.dat.tmp", flags=create | os.O_EXCL)
        restarted.advance([*second, exclusive], len(second) + 1)
