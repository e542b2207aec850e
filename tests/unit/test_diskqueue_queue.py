"""DiskQueue behaviour: round trips, segments, cursors, restarts, sync and the sync policy."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from trio.testing import wait_all_tasks_blocked

from diskqueue import DirectoryListing, DiskQueue, DiskQueueClosed, MessageSizeError, fileops
from diskqueue.checkpoint import Cursor, load_checkpoint
from diskqueue.format import HEADER_SIZE, meta_filename, segment_filename
from tests.support.diskqueues import read_all, records

NAME = "topic:channel"


@asynccontextmanager
async def opened(path: Path, **options) -> AsyncIterator[DiskQueue]:
    """The queue ``NAME`` in ``path`` (with ``options``) while the block runs, closed after it;
    the whole has 10 seconds."""
    with trio.fail_after(10):
        q = DiskQueue(NAME, path, **options)
        yield q
        await q.close()


@asynccontextmanager
async def running(path: Path, **options) -> AsyncIterator[DiskQueue]:
    """The queue ``NAME`` in ``path`` (with ``options``) and its ``run`` loop while the block runs,
    closed after it. For tests on the mock clock: the time bound is virtual time."""
    with trio.fail_after(1000):  # virtual time: the mock clock only moves when jumped
        q = DiskQueue(NAME, path, **options)
        async with trio.open_nursery() as nursery:
            await nursery.start(q.run)
            yield q
            await q.close()


def segment_files(path: Path) -> list[str]:
    return sorted(p for p in os.listdir(path) if p.endswith(".dat") and ".meta." not in p)


def checkpoint_of(path: Path):
    checkpoint, problem = load_checkpoint(str(path / meta_filename(NAME)))
    assert checkpoint is not None
    assert problem is None
    return checkpoint


async def test_round_trip_single_records(tmp_path: Path) -> None:
    async with opened(tmp_path) as q:
        for payload in (b"a", b"", b"ccc"):
            q.put(payload)
        assert q.depth == 3
        assert q.read_many(10) == [b"a", b"", b"ccc"]
        assert q.depth == 0 and q.read_many(10) == []


async def test_round_trip_batches(tmp_path: Path) -> None:
    async with opened(tmp_path, max_bytes_per_file=4096) as q:
        sent = [os.urandom(n) for n in range(0, 600, 3)]
        q.put_many(sent[:50])
        q.put_many(iter(sent[50:]))
        got = []
        for size in (1, 2, 30, 1000):
            got += q.read_many(size)
        assert got == sent


async def test_opening_an_empty_directory_creates_nothing(tmp_path: Path) -> None:
    with trio.fail_after(10):
        q = DiskQueue(NAME, tmp_path)
        assert q.depth == 0 and q.read_many(5) == []
        await q.close()
        assert os.listdir(tmp_path) == []


async def test_segments_roll_before_passing_max_and_are_deleted_once_consumed(tmp_path: Path) -> None:
    async with opened(tmp_path, max_bytes_per_file=300) as q:
        sent = records(100)  # 28 bytes a record: 9 per segment
        q.put_many(sent[:40])
        for i in range(40, 100, 3):
            q.put_many(sent[i : i + 3])
        files = segment_files(tmp_path)
        assert files[0] == segment_filename(NAME, 0) and len(files) == 12
        assert all(os.path.getsize(tmp_path / f) <= 300 for f in files)
        assert read_all(q, 10) == sent
        await q.sync()
        assert segment_files(tmp_path) == [segment_filename(NAME, 11)]


async def test_consumed_segments_wait_for_the_checkpoint(tmp_path: Path) -> None:
    async with opened(tmp_path, max_bytes_per_file=300) as q:
        q.put_many(records(30))
        q.read_many(30)
        assert len(segment_files(tmp_path)) == 4  # removal happens in sync, after the checkpoint
        await q.sync()
        assert segment_files(tmp_path) == [segment_filename(NAME, 3)]


async def test_record_bigger_than_a_segment_goes_alone(tmp_path: Path) -> None:
    async with opened(tmp_path, max_bytes_per_file=100) as q:
        sent = [b"s", b"L" * 500, b"t"]
        q.put_many(sent)
        assert len(segment_files(tmp_path)) == 3
        assert q.read_many(5) == sent


async def test_message_size_bounds(tmp_path: Path) -> None:
    async with opened(tmp_path, min_msg_size=2, max_msg_size=10) as q:
        with pytest.raises(MessageSizeError) as info:
            q.put_many([b"ok", b"x"])
        assert info.value.size == 1 and info.value.index == 1
        with pytest.raises(MessageSizeError):
            q.put(b"x" * 11)
        assert q.depth == 0 and segment_files(tmp_path) == []
        q.put_many([b"ok", b"x" * 10])
        assert q.read_many(5) == [b"ok", b"x" * 10]


@pytest.mark.parametrize("graceful", [True, False], ids=["close", "crash"])
async def test_restart_at_every_cursor_position(tmp_path: Path, graceful: bool) -> None:
    sent = records(23)
    with trio.fail_after(20):
        for k in range(len(sent) + 1):
            path = tmp_path / f"k{k}"
            q = DiskQueue(NAME, path, max_bytes_per_file=200)
            q.put_many(sent[:15])
            q.put_many(sent[15:])
            assert q.read_many(k) == sent[:k]
            if graceful:
                await q.close()
            else:
                await q.sync()
                shutil.copytree(path, tmp_path / f"crash{k}")  # the files as a kill -9 leaves them
                await q.close()
                path = tmp_path / f"crash{k}"
            q = DiskQueue(NAME, path, max_bytes_per_file=200)
            assert q.depth == len(sent) - k
            assert read_all(q, 4) == sent[k:]
            assert q.depth == 0
            q.put(b"after")
            assert q.read_many(2) == [b"after"]
            await q.close()


@pytest.mark.parametrize("graceful", [True, False], ids=["close", "crash"])
async def test_committed_cursor_contract(tmp_path: Path, graceful: bool) -> None:
    sent = records(100)
    with trio.fail_after(10):
        q = DiskQueue(NAME, tmp_path / "q", max_bytes_per_file=500, auto_commit=False)
        q.put_many(sent)
        assert q.read_many(100) == sent
        assert q.depth == 0 and q.uncommitted == 100
        q.commit(40)
        assert q.uncommitted == 60
        path = tmp_path / "q"
        if graceful:
            await q.close()
        else:
            await q.sync()
            shutil.copytree(path, tmp_path / "crash")
            await q.close()
            path = tmp_path / "crash"
        q = DiskQueue(NAME, path, max_bytes_per_file=500, auto_commit=False)
        assert q.depth == 60 and q.uncommitted == 0
        assert read_all(q, 7) == sent[40:]
        await q.close()


async def test_commit_in_pieces_across_segments(tmp_path: Path) -> None:
    sent = records(50)
    with trio.fail_after(10):
        q = DiskQueue(NAME, tmp_path, max_bytes_per_file=150, auto_commit=False)
        q.put_many(sent)
        for size in (3, 11, 20):
            q.read_many(size)
        assert q.uncommitted == 34
        with pytest.raises(ValueError):
            q.commit(35)
        with pytest.raises(ValueError):
            q.commit(-1)
        q.commit(0)
        for n in (1, 5, 13):
            q.commit(n)
        assert q.uncommitted == 15
        await q.sync()
        # only segments before the one holding the oldest uncommitted record are gone
        oldest = int(segment_files(tmp_path)[0].split(".")[-2])
        assert oldest == checkpoint_of(tmp_path).commit.file
        await q.close()
        q = DiskQueue(NAME, tmp_path, max_bytes_per_file=150, auto_commit=False)
        assert read_all(q, 7) == sent[19:]
        q.commit()
        assert q.uncommitted == 0
        await q.close()
        q = DiskQueue(NAME, tmp_path, max_bytes_per_file=150, auto_commit=False)
        assert q.depth == 0 and read_all(q, 7) == []
        await q.close()


async def test_committing_everything_releases_segments(tmp_path: Path) -> None:
    async with opened(tmp_path, max_bytes_per_file=150, auto_commit=False) as q:
        q.put_many(records(40))
        q.read_many(40)
        await q.sync()
        assert len(segment_files(tmp_path)) == 10  # nothing committed: all kept
        q.commit()
        await q.sync()
        assert len(segment_files(tmp_path)) == 1


async def test_empty_drops_everything(tmp_path: Path) -> None:
    with trio.fail_after(10):
        q = DiskQueue(NAME, tmp_path / "q", max_bytes_per_file=200, auto_commit=False)
        q.put_many(records(30))
        q.read_many(5)
        await q.sync()
        q.empty()
        assert q.depth == 0 and q.uncommitted == 0 and q.read_many(5) == []
        assert os.listdir(tmp_path / "q") == []
        shutil.copytree(tmp_path / "q", tmp_path / "crash-before-sync")
        q.put_many(records(3, start=100))
        with pytest.raises(ValueError):
            q.commit(1)
        await q.close()
        q = DiskQueue(NAME, tmp_path / "q", max_bytes_per_file=200)
        assert read_all(q, 7) == records(3, start=100)
        await q.close()
        q = DiskQueue(NAME, tmp_path / "crash-before-sync")
        assert q.depth == 0 and read_all(q, 7) == []
        await q.close()


async def test_delete_and_close_are_final_and_idempotent(tmp_path: Path) -> None:
    with trio.fail_after(10):
        q = DiskQueue(NAME, tmp_path, max_bytes_per_file=200)
        q.put_many(records(30))
        await q.sync()
        (tmp_path / "other.diskqueue.000000.dat").write_bytes(b"not ours")
        q.delete()
        q.delete()
        assert os.listdir(tmp_path) == ["other.diskqueue.000000.dat"]
        for call in (lambda: q.put(b"x"), lambda: q.read_many(1), lambda: q.commit(), q.empty):
            with pytest.raises(DiskQueueClosed):
                call()
        with pytest.raises(DiskQueueClosed):
            await q.sync()
        await q.close()
        await q.close()

        q = DiskQueue(NAME, tmp_path)
        q.put(b"x")
        await q.close()
        await q.close()
        with pytest.raises(DiskQueueClosed):
            q.put(b"y")
        q = DiskQueue(NAME, tmp_path)
        assert q.read_many(5) == [b"x"]
        await q.close()


async def test_sync_is_a_group_commit(tmp_path: Path) -> None:
    async with opened(tmp_path, max_bytes_per_file=1000) as q:
        for i in range(0, 100, 10):
            q.put_many(records(10, start=i))
        assert q.sync_needed
        await q.sync()
        assert not q.sync_needed and q.statistics().syncs == 1
        checkpoint = checkpoint_of(tmp_path)
        stats = q.statistics()
        assert (checkpoint.write.file, checkpoint.write.pos) == stats.write_cursor
        assert checkpoint.write.seq == 100 and checkpoint.depth == 100
        await q.sync()  # nothing new: no fsync, no new checkpoint
        assert q.statistics().syncs == 1


async def test_sync_of_new_records_alone_is_one_data_fsync(tmp_path: Path) -> None:
    with trio.fail_after(10):
        q = DiskQueue(NAME, tmp_path / "q")
        q.put_many(records(10))
        await q.sync()  # a segment was created: checkpoint written
        meta = tmp_path / "q" / meta_filename(NAME)
        before = meta.read_bytes()
        q.put_many(records(10, start=10))
        await q.sync()
        assert meta.read_bytes() == before  # only the data was fsynced
        shutil.copytree(tmp_path / "q", tmp_path / "crash")
        assert q.read_many(5) == records(5)
        await q.sync()  # the committed cursor moved: checkpoint written
        assert checkpoint_of(tmp_path / "q").commit.seq == 5
        await q.close()
        q = DiskQueue(NAME, tmp_path / "crash")
        assert read_all(q, 7) == records(20)
        await q.close()


async def test_sync_of_records_only_leaves_commits_to_the_policy(tmp_path: Path) -> None:
    with trio.fail_after(10):
        q = DiskQueue(NAME, tmp_path / "q")
        q.put_many(records(10))
        await q.sync()
        q.put_many(records(10, start=10))
        assert q.read_many(15) == records(15)
        await q.sync(commits=False)
        assert checkpoint_of(tmp_path / "q").commit.seq == 0
        assert q.sync_needed  # the commits are still owed a checkpoint
        shutil.copytree(tmp_path / "q", tmp_path / "crash")
        await q.sync()
        assert checkpoint_of(tmp_path / "q").commit.seq == 15 and not q.sync_needed
        await q.close()
        q = DiskQueue(NAME, tmp_path / "crash")
        assert read_all(q, 7) == records(20)  # committed records come back; nothing is lost
        await q.close()


async def test_a_segment_a_sync_of_records_only_started_is_named_by_a_checkpoint_by_close(tmp_path: Path) -> None:
    with trio.fail_after(10):
        q = DiskQueue(NAME, tmp_path / "q")
        q.put_many(records(10))  # the first segment file is created
        await q.sync(commits=False)  # its records and its name are durable; no checkpoint yet
        assert not (tmp_path / "q" / meta_filename(NAME)).exists()
        assert q.sync_needed  # a checkpoint naming the new segment is still owed
        await q.close()
        assert checkpoint_of(tmp_path / "q").write.seq == 10
        q = DiskQueue(NAME, tmp_path / "q")
        assert read_all(q, 7) == records(10)
        await q.close()


@pytest.fixture
def blocking_fsync(monkeypatch: pytest.MonkeyPatch):
    """Make data fsyncs wait until released, to act while a sync is in its worker thread."""
    entered, release = threading.Event(), threading.Event()
    real = fileops.fdatasync

    def datasync(fd: int) -> None:
        entered.set()
        release.wait(10)
        real(fd)

    monkeypatch.setattr(fileops, "fdatasync", datasync)
    return entered, release


async def test_puts_and_reads_continue_while_sync_runs(tmp_path: Path, blocking_fsync) -> None:
    entered, release = blocking_fsync
    sent = records(300)
    with trio.fail_after(10):
        q = DiskQueue(NAME, tmp_path, max_bytes_per_file=1000)
        q.put_many(sent[:20])
        async with trio.open_nursery() as nursery:
            nursery.start_soon(q.sync)
            await trio.to_thread.run_sync(entered.wait)
            q.put_many(sent[20:])  # rolls the segment whose descriptor is being fsynced
            assert q.read_many(50) == sent[:50]
            release.set()
        checkpoint = checkpoint_of(tmp_path)
        assert checkpoint.write == Cursor(0, HEADER_SIZE + 20 * 28, 20)  # the captured instant
        assert checkpoint.commit == Cursor(0, HEADER_SIZE, 0)
        await q.sync()
        assert checkpoint_of(tmp_path).write.seq == 300
        await q.close()
        q = DiskQueue(NAME, tmp_path, max_bytes_per_file=1000)
        assert read_all(q, 100) == sent[50:]
        await q.close()


@pytest.mark.parametrize("action", ["empty", "delete"])
async def test_empty_or_delete_during_sync(tmp_path: Path, blocking_fsync, action: str) -> None:
    entered, release = blocking_fsync
    with trio.fail_after(10):
        q = DiskQueue(NAME, tmp_path, max_bytes_per_file=300)
        q.put_many(records(40))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(q.sync)  # must not fail: its descriptors stay open until it is done
            await trio.to_thread.run_sync(entered.wait)
            getattr(q, action)()
            release.set()
        assert not (tmp_path / meta_filename(NAME)).exists()  # the stale checkpoint was not installed
        assert segment_files(tmp_path) == []
        if action == "empty":
            q.put(b"new")
            await q.close()
            q = DiskQueue(NAME, tmp_path)
            assert read_all(q, 7) == [b"new"]
        await q.close()


async def test_run_syncs_after_sync_every_operations(tmp_path: Path, mock_clock) -> None:
    async with running(tmp_path, sync_every=10, sync_timeout=5.0) as q:
        q.put_many(records(6))
        q.read_many(3)
        await wait_all_tasks_blocked()
        assert q.sync_needed and q.statistics().syncs == 0
        q.put(b"tenth")
        await wait_all_tasks_blocked()
        assert not q.sync_needed  # the loop has captured a sync
        await q.sync()  # waits for the loop's sync to finish
        assert q.statistics().syncs == 1
        assert checkpoint_of(tmp_path).write.seq == 7


async def test_records_moved_do_not_count_towards_sync_every(tmp_path: Path, mock_clock) -> None:
    async with running(tmp_path, sync_every=10, sync_timeout=5.0) as q:
        q.put_many(records(6))
        with q.moving():  # read and appended again: twelve operations, none counted
            q.put_many(q.read_many(6)[::-1])
        await wait_all_tasks_blocked()
        assert q.sync_needed and q.statistics().syncs == 0
        q.put_many(records(4, start=6))  # the tenth counted
        await wait_all_tasks_blocked()
        assert not q.sync_needed
        await q.sync()
        assert q.statistics().syncs == 1
        assert read_all(q, 7) == records(6)[::-1] + records(4, start=6)


async def test_run_syncs_within_sync_timeout_of_activity(tmp_path: Path, mock_clock) -> None:
    async with running(tmp_path, sync_every=1000, sync_timeout=2.0) as q:
        q.put(b"x")
        mock_clock.jump(1.9)
        await wait_all_tasks_blocked()
        assert q.sync_needed
        mock_clock.jump(0.2)
        await wait_all_tasks_blocked()
        assert not q.sync_needed
        await q.sync()
        assert q.statistics().syncs == 1
        mock_clock.jump(60)  # idle: nothing to sync
        await wait_all_tasks_blocked()
        assert q.statistics().syncs == 1


async def test_run_syncs_promptly_after_a_roll(tmp_path: Path, mock_clock) -> None:
    async with running(tmp_path, max_bytes_per_file=200, sync_every=1000, sync_timeout=60.0) as q:
        q.put_many(records(5))
        await wait_all_tasks_blocked()
        assert q.sync_needed
        q.put_many(records(5))  # passes 200 bytes: rolls
        await wait_all_tasks_blocked()
        assert not q.sync_needed
        await q.sync()
        assert checkpoint_of(tmp_path).write.file == 1


async def until(condition) -> None:
    """Yield to other tasks until ``condition()`` holds: a worker thread's result arrives at
    a moment no Trio primitive can wait for. Bounded by real time so a bug fails, not hangs."""
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await trio.sleep(0)


async def test_run_retries_a_failed_sync(tmp_path: Path, mock_clock, monkeypatch: pytest.MonkeyPatch) -> None:
    real = fileops.fdatasync
    failures = [OSError(5, "Input/output error")]

    def datasync(fd: int) -> None:
        if failures:
            raise failures.pop()
        real(fd)

    monkeypatch.setattr(fileops, "fdatasync", datasync)
    async with running(tmp_path, sync_every=1, sync_timeout=1.0) as q:
        q.put(b"x")
        await until(lambda: q.statistics().last_sync_error is not None)
        stats = q.statistics()
        assert stats.syncs == 0 and "Input/output error" in (stats.last_sync_error or "")
        assert q.sync_needed and not (tmp_path / meta_filename(NAME)).exists()
        await wait_all_tasks_blocked()  # the loop is waiting sync_timeout before retrying
        mock_clock.jump(1.0)
        await wait_all_tasks_blocked()
        assert not q.sync_needed  # the loop retried
        await q.sync()
        assert q.statistics().syncs == 1 and q.statistics().last_sync_error is None
        assert checkpoint_of(tmp_path).write.seq == 1


async def test_statistics(tmp_path: Path) -> None:
    async with opened(tmp_path, max_bytes_per_file=200, auto_commit=False) as q:
        q.put_many(records(20))
        q.read_many(8)
        q.commit(3)
        stats = q.statistics()
        assert (stats.depth, stats.uncommitted, stats.records_written) == (12, 5, 20)
        assert stats.segments == 4 and stats.write_cursor[0] == 3
        assert stats.read_cursor == (1, HEADER_SIZE + 2 * 28)
        assert stats.commit_cursor == (0, HEADER_SIZE + 3 * 28)
        assert stats.unsynced_operations == 28 and stats.sync_needed and stats.records_lost == 0


async def test_max_bytes_per_file_may_change_between_runs(tmp_path: Path) -> None:
    sent = records(90)
    with trio.fail_after(10):
        for i, max_bytes in enumerate((1000, 120, 5000)):
            q = DiskQueue(NAME, tmp_path, max_bytes_per_file=max_bytes)
            q.put_many(sent[i * 30 : i * 30 + 30])
            assert q.read_many(5) == sent[i * 5 : i * 5 + 5]
            await q.close()
        q = DiskQueue(NAME, tmp_path, max_bytes_per_file=300)
        assert q.depth == 75
        assert read_all(q, 7) == sent[15:]
        await q.close()


async def test_the_owners_note_is_kept_in_the_checkpoint_with_the_cursors(tmp_path: Path) -> None:
    q = DiskQueue("q", tmp_path, auto_commit=False)
    q.put_many([b"a", b"b", b"c"])
    q.read_many(3)
    q.commit(1)
    q.note = b"records 2..3 are done"
    await q.sync()
    q.note = b"not written: the process dies before the next sync"
    reopened = DiskQueue("q", tmp_path, auto_commit=False)  # as after a crash
    assert reopened.note == b"records 2..3 are done"
    assert reopened.read_seq == 1
    reopened.empty()
    assert reopened.note == b""
    await reopened.close()
    assert DiskQueue("q", tmp_path).note == b""


async def test_a_quick_sync_of_records_runs_on_the_calling_thread_and_a_slow_one_sends_the_next_away(
        tmp_path: Path) -> None:
    """``inline_sync_below``: fdatasync on the Trio thread while the last sync of records was quick."""
    calls: list[tuple[str, bool]] = []  # (call, made on the Trio thread)
    delay = [0.0]
    main = threading.current_thread()

    def recording(name: str, real):
        def call(fd: int) -> None:
            calls.append((name, threading.current_thread() is main))
            time.sleep(delay[0])
            real(fd)
        return call

    previous = fileops.substitute({"fdatasync": recording("fdatasync", fileops.fdatasync),
                                   "fsync": recording("fsync", fileops.fsync)})
    try:
        q = DiskQueue("q", tmp_path, inline_sync_below=0.2)
        q.put(b"a")
        await q.sync(commits=False)  # quick: inline
        delay[0] = 0.3
        q.put(b"b")
        await q.sync(commits=False)  # inline too, but slow
        delay[0] = 0.0
        q.put(b"c")
        await q.sync(commits=False)  # so this one goes to a worker thread, and is quick
        q.put(b"d")
        await q.sync(commits=False)  # inline again
        assert [inline for name, inline in calls if name == "fdatasync"] == [True, True, False, True]
        calls.clear()
        q.put(b"e")
        await q.sync()  # with a checkpoint: always in a worker thread
        assert calls and not any(inline for _, inline in calls)
        await q.close()
    finally:
        fileops.substitute(previous)


class _StepCounter(trio.abc.Instrument):
    """Counts the steps run by tasks whose name contains ``word``: how often they woke."""

    def __init__(self, word: str) -> None:
        self.word = word
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if self.word in task.name:
            self.steps += 1


async def test_run_does_not_wake_while_everything_is_synced(tmp_path: Path, mock_clock) -> None:
    with trio.fail_after(100_000):  # virtual time: the mock clock only moves when jumped
        q = DiskQueue(NAME, tmp_path, sync_every=1000, sync_timeout=0.1)
        counter = _StepCounter("DiskQueue.run")
        trio.lowlevel.add_instrument(counter)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(q.run)
                await wait_all_tasks_blocked()
                idle_start = counter.steps
                for _ in range(100):  # 1,000 sync timeouts of idle
                    mock_clock.jump(1.0)
                    await wait_all_tasks_blocked()
                assert counter.steps == idle_start
                q.put(b"x")  # the first change starts the clock
                mock_clock.jump(0.05)
                await wait_all_tasks_blocked()
                assert q.sync_needed
                mock_clock.jump(0.06)
                await until(lambda: q.statistics().syncs == 1)  # the sync runs in a worker thread
                await wait_all_tasks_blocked()
                assert not q.sync_needed
                after_sync = counter.steps
                for _ in range(100):
                    mock_clock.jump(1.0)
                    await wait_all_tasks_blocked()
                assert counter.steps == after_sync
                await q.close()
        finally:
            trio.lowlevel.remove_instrument(counter)


async def test_run_on_demand_starts_the_loop_at_the_first_change(tmp_path: Path, mock_clock) -> None:
    with trio.fail_after(1000):  # virtual time: the mock clock only moves when jumped
        q = DiskQueue(NAME, tmp_path, sync_every=1000, sync_timeout=2.0)
        async with trio.open_nursery() as nursery:
            q.run_on_demand(nursery)
            await wait_all_tasks_blocked()
            assert not nursery.child_tasks  # idle: no task at all
            q.put(b"x")
            await wait_all_tasks_blocked()
            assert len(nursery.child_tasks) == 1
            mock_clock.jump(2.1)
            await until(lambda: q.statistics().syncs == 1)  # the sync runs in a worker thread
            q.put(b"y")  # the loop runs on: no second task
            await wait_all_tasks_blocked()
            assert len(nursery.child_tasks) == 1
            await q.close()


async def test_a_queue_deleted_from_a_listing_reopens_empty_without_listing(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "other.diskqueue.meta.dat").write_bytes(b"")
    listing = DirectoryListing(tmp_path)
    q = DiskQueue(NAME, tmp_path, listing=listing)
    q.put_many(records(3))
    await q.sync()
    q.delete()

    def no_listing(path):
        raise AssertionError("listed the directory")

    monkeypatch.setattr(fileops, "listdir", no_listing)
    q = DiskQueue(NAME, tmp_path, listing=listing)
    assert q.depth == 0 and q.read_many(10) == []
    q.put(b"again")
    await q.close()
    monkeypatch.undo()
    assert read_all(DiskQueue(NAME, tmp_path)) == [b"again"]
