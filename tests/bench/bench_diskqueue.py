"""Disk queue benchmark: throughput against plain file I/O, group commit, memory at depth.

    python -m tests.bench.bench_diskqueue [--seconds-per-case 0.5] [--memory-records 10000000]
                                          [--dir DIR] [--repeat 5]

A script, not a test. Every comparison runs in the same process, on the same file system,
with the same payloads (batches of 200 distinct random payloads of 100 or 1000 bytes):

* write: ``DiskQueue.put_many(batch)`` (length + CRC-32 frame, one ``pwrite`` per batch)
  against a plain buffered file (``open(path, "wb")``) written record by record with the
  same number of bytes: an 8-byte length header and the payload, no checksum.
* read: ``DiskQueue.read_many(200)`` (checksums verified) against the same buffered file
  read back record by record (``read(8)``, ``read(length)``) into a list per batch; also
  ``read_many`` + ``commit()`` with ``auto_commit=False``.
* "bulk" lines show the bare cost of moving the bytes: one ``write``/``read`` of a whole
  batch with no framing at all; no queue can reach them and they are not the baseline.
* group commit: ``put_many(200)`` then ``await sync()``, against the buffered file written
  the same way then ``flush()`` + ``fdatasync``; also with a consumer reading and
  committing each batch, where each ``sync()`` also replaces the checkpoint, and the same
  with ``sync(commits=False)``, which leaves the commits to the sync policy.
* memory: RSS while the queue grows to ``--memory-records`` 100-byte records and while it
  is drained again (consumed segments removed by a sync every million records).

Rates are records/s and MB/s of payload, the best of ``--repeat`` runs. Each queue run is
paired with a baseline run just before it, so both see the same machine load; a ratio is
the median over the pairs of (queue rate / plain-file rate): higher is better, >= 0.7 is
the target for batched writes and reads.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

import trio

from diskqueue import DiskQueue

BATCH = 200
FRAME = struct.Struct(">II")
MB = 1e6


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def make_batch(size: int) -> list[bytes]:
    return [os.urandom(size) for _ in range(BATCH)]


class Case:
    """One throughput case on fresh files under ``root``."""

    def __init__(self, root: Path, size: int, batches: int) -> None:
        self.root = root
        self.size = size
        self.batches = batches
        self.batch = make_batch(size)
        self.records = batches * BATCH

    def fresh(self) -> Path:
        return Path(tempfile.mkdtemp(prefix=f"{self.size}-", dir=self.root))

    def once(self, prepare, run) -> float:
        """Time of ``run(path)`` on a fresh directory set up (untimed) by ``prepare``."""
        path = self.fresh()
        try:
            prepare(path)
            return run(path)
        finally:
            shutil.rmtree(path)

    # plain buffered file --------------------------------------------------------------

    def plain_write(self, path: Path) -> float:
        batch, pack = self.batch, FRAME.pack
        start = time.perf_counter()
        with open(path / "plain.dat", "wb") as f:
            write = f.write
            for _ in range(self.batches):
                for p in batch:
                    write(pack(len(p), 0))
                    write(p)
        return time.perf_counter() - start

    def plain_read(self, path: Path) -> float:
        unpack = FRAME.unpack
        count = 0
        start = time.perf_counter()
        with open(path / "plain.dat", "rb") as f:
            read = f.read
            while True:
                out = []
                for _ in range(BATCH):
                    header = read(8)
                    if len(header) < 8:
                        break
                    out.append(read(unpack(header)[0]))
                if not out:
                    break
                count += len(out)
        elapsed = time.perf_counter() - start
        assert count == self.records
        return elapsed

    def bulk_write(self, path: Path) -> float:
        batch = self.batch
        start = time.perf_counter()
        with open(path / "bulk.dat", "wb") as f:
            for _ in range(self.batches):
                f.write(b"".join(batch))
        return time.perf_counter() - start

    def bulk_read(self, path: Path) -> float:
        chunk = self.size * BATCH
        start = time.perf_counter()
        with open(path / "bulk.dat", "rb") as f:
            while f.read(chunk):
                pass
        return time.perf_counter() - start

    # the queue ------------------------------------------------------------------------

    def queue_write(self, path: Path) -> float:
        q = DiskQueue("bench", path)
        batch = self.batch
        start = time.perf_counter()
        for _ in range(self.batches):
            q.put_many(batch)
        elapsed = time.perf_counter() - start
        trio.run(q.close)
        return elapsed

    def queue_read(self, path: Path, auto_commit: bool = True) -> float:
        q = DiskQueue("bench", path, auto_commit=auto_commit)
        count = 0
        start = time.perf_counter()
        while True:
            got = q.read_many(BATCH)
            if not got:
                break
            if not auto_commit:
                q.commit()
            count += len(got)
        elapsed = time.perf_counter() - start
        assert count == self.records, count
        trio.run(q.close)
        return elapsed


class Paired:
    """Times of a baseline and a contender run back to back, so both see the same load."""

    def __init__(self) -> None:
        self.base: list[float] = []
        self.other: list[float] = []

    def add(self, base: float, other: float) -> None:
        self.base.append(base)
        self.other.append(other)

    @property
    def ratio(self) -> float:
        """Median of the per-pair ratios (contender rate / baseline rate)."""
        return statistics.median(b / o for b, o in zip(self.base, self.other))


def rate_line(label: str, records: int, size: int, seconds: float, ratio: float | None = None) -> str:
    rps = records / seconds
    line = f"  {label:<40} {rps:>12,.0f} rec/s {rps * size / MB:>9.1f} MB/s"
    if ratio is not None:
        line += f"   ratio {ratio:5.2f}"
    return line


def throughput(root: Path, size: int, seconds: float, repeat: int) -> None:
    probe = Case(root, size, 50)
    probe_time = probe.once(lambda path: None, probe.plain_write)
    case = Case(root, size, max(50, int(seconds / (probe_time / 50))))
    n = case.records
    print(f"\n{size}-byte payloads, batches of {BATCH}, {n:,} records ({n * size / MB:.0f} MB of payload) "
          f"per run; best rate of {repeat}, median ratio of {repeat} back-to-back pairs")

    def nothing(path: Path) -> None:
        pass

    def plain_files(path: Path) -> None:
        case.plain_write(path)
        case.bulk_write(path)

    def manual_read(path: Path) -> float:
        return case.queue_read(path, auto_commit=False)

    write, read, read_commit = Paired(), Paired(), Paired()
    bulk_w, bulk_r = [], []
    for _ in range(repeat):
        write.add(case.once(nothing, case.plain_write), case.once(nothing, case.queue_write))
        bulk_w.append(case.once(nothing, case.bulk_write))
    for _ in range(repeat):
        plain = case.once(plain_files, case.plain_read)
        read.add(plain, case.once(case.queue_write, case.queue_read))
        read_commit.add(plain, case.once(case.queue_write, manual_read))
        bulk_r.append(case.once(plain_files, case.bulk_read))
    print(rate_line("write  plain buffered file, per record", n, size, min(write.base)))
    print(rate_line("write  DiskQueue.put_many", n, size, min(write.other), write.ratio))
    print(rate_line("write  (bulk: one write per batch)", n, size, min(bulk_w)))
    print(rate_line("read   plain buffered file, per record", n, size, min(read.base)))
    print(rate_line("read   DiskQueue.read_many", n, size, min(read.other), read.ratio))
    print(rate_line("read   read_many + commit (manual)", n, size, min(read_commit.other), read_commit.ratio))
    print(rate_line("read   (bulk: one read per batch)", n, size, min(bulk_r)))


async def group_commit(root: Path, size: int, batches: int, repeat: int) -> None:
    batch = make_batch(size)
    records = batches * BATCH

    async def plain() -> float:
        path = root / f"plain-gc-{time.perf_counter_ns()}"
        path.mkdir()
        start = time.perf_counter()
        with open(path / "plain.dat", "wb") as f:
            for _ in range(batches):
                for p in batch:
                    f.write(FRAME.pack(len(p), 0))
                    f.write(p)
                f.flush()
                await trio.to_thread.run_sync(os.fdatasync, f.fileno())
        return time.perf_counter() - start

    async def queue(consume: bool, commits: bool = True) -> float:
        q = DiskQueue("bench", root / f"queue-gc-{time.perf_counter_ns()}")
        start = time.perf_counter()
        for _ in range(batches):
            q.put_many(batch)
            if consume:
                q.read_many(BATCH)
            await q.sync(commits=commits)
        elapsed = time.perf_counter() - start
        await q.close()
        return elapsed

    alone, consuming, records_only = Paired(), Paired(), Paired()
    for _ in range(repeat):
        base = await plain()
        alone.add(base, await queue(False))
        consuming.add(base, await queue(True))
        records_only.add(base, await queue(True, commits=False))
    print(f"\ngroup commit, {size}-byte payloads: {batches} x (write {BATCH} records, fsync); "
          f"best rate of {repeat}, median ratio")
    print(rate_line("plain buffered file + fdatasync", records, size, min(alone.base)))
    print(rate_line("put_many + await sync()", records, size, min(alone.other), alone.ratio))
    print(rate_line("put_many + read_many + await sync()", records, size, min(consuming.other), consuming.ratio))
    print(rate_line("  same, await sync(commits=False)", records, size, min(records_only.other),
                    records_only.ratio))
    for path in root.iterdir():
        shutil.rmtree(path)


async def memory(root: Path, total: int) -> None:
    batch = make_batch(100)
    q = DiskQueue("bench", root / "memory")
    step = max(BATCH, total // 10 // BATCH * BATCH)
    print(f"\nmemory: {total:,} records of 100 bytes, RSS in MiB")
    base = rss_mb()
    print(f"  {'records in queue':>18} {'RSS':>8} {'growth':>8}")
    print(f"  {0:>18,} {base:>8.1f} {0:>8.1f}")
    peak = base
    start = time.perf_counter()
    written = 0
    while written < total:
        for _ in range(step // BATCH):
            q.put_many(batch)
        written += step
        await q.sync()
        now = rss_mb()
        peak = max(peak, now)
        print(f"  {q.depth:>18,} {now:>8.1f} {now - base:>8.1f}")
    write_time = time.perf_counter() - start
    start = time.perf_counter()
    read = 0
    while q.depth:
        for _ in range(step // BATCH):
            read += len(q.read_many(BATCH))
        await q.sync()
        now = rss_mb()
        peak = max(peak, now)
        print(f"  {q.depth:>18,} {now:>8.1f} {now - base:>8.1f}   (draining)")
    read_time = time.perf_counter() - start
    await q.close()
    print(f"  peak growth {peak - base:.1f} MiB; wrote {written:,} in {write_time:.1f} s "
          f"({written / write_time:,.0f} rec/s), read {read:,} in {read_time:.1f} s ({read / read_time:,.0f} rec/s)")
    shutil.rmtree(root / "memory")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds-per-case", type=float, default=0.5,
                        help="size each throughput run to about this long (plain-file time)")
    parser.add_argument("--group-commit-batches", type=int, default=150)
    parser.add_argument("--memory-records", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where to put the files (default: a temporary directory)")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-diskqueue-", dir=args.dir))
    try:
        print(f"python {sys.version.split()[0]}, files in {root}")
        for size in (100, 1000):
            throughput(root, size, args.seconds_per_case, args.repeat)
        for size in (100, 1000):
            trio.run(group_commit, root, size, args.group_commit_batches, args.repeat)
        if args.memory_records:
            trio.run(memory, root, args.memory_records)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
