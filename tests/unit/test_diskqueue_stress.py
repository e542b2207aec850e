"""Seeded random operations on a DiskQueue against a model made of ``collections.deque``s,
and seeded random damage to its files.

The model: ``unread`` records not handed out yet; ``handed`` handed out and not committed;
``since_sync`` committed since the last sync. A graceful reopen brings ``handed`` back; a
crash (the files copied as a kill -9 leaves them, then reopened) also brings back
``since_sync``, because the checkpoint only knows the committed cursor of the last sync.
"""

from __future__ import annotations

import os
import random
import shutil
import zlib
from collections import deque
from pathlib import Path

import pytest
import trio

from diskqueue import DiskQueue
from diskqueue.check import check

NAME = "stress"


class Model:
    def __init__(self) -> None:
        self.unread: deque[bytes] = deque()
        self.handed: deque[bytes] = deque()
        self.since_sync: deque[bytes] = deque()

    def read(self, n: int, auto_commit: bool) -> list[bytes]:
        got = [self.unread.popleft() for _ in range(min(n, len(self.unread)))]
        (self.since_sync if auto_commit else self.handed).extend(got)
        return got

    def commit(self, n: int) -> None:
        for _ in range(n):
            self.since_sync.append(self.handed.popleft())

    def reopened(self, crashed: bool) -> None:
        back = list(self.since_sync) if crashed else []
        self.unread.extendleft(reversed(back + list(self.handed)))
        self.handed.clear()
        self.since_sync.clear()

    def emptied(self) -> None:
        self.unread.clear()
        self.handed.clear()
        self.since_sync.clear()


@pytest.mark.parametrize("auto_commit", [True, False], ids=["auto", "manual"])
@pytest.mark.parametrize("seed", range(4))
async def test_random_operations_match_the_model(tmp_path: Path, seed: int, auto_commit: bool) -> None:
    rng = random.Random(seed)
    model = Model()
    serial = 0
    generation = 0
    path = tmp_path / "g0"

    def open_queue() -> DiskQueue:
        return DiskQueue(NAME, path, max_bytes_per_file=rng.choice([600, 2000, 8000]),
                         max_msg_size=300, auto_commit=auto_commit)

    with trio.fail_after(60):
        q = open_queue()
        for _ in range(300):
            op = rng.choices(
                ["put", "read", "commit", "sync", "reopen", "crash", "empty", "check"],
                weights=[30, 30, 15, 6, 4, 4, 1, 2],
            )[0]
            if op == "put":
                batch = []
                for _ in range(rng.randint(1, 25)):
                    batch.append(b"%06d:" % serial + rng.randbytes(rng.randint(0, 200)))
                    serial += 1
                q.put_many(batch)
                model.unread.extend(batch)
            elif op == "read":
                n = rng.randint(1, 40)
                assert q.read_many(n) == model.read(n, auto_commit)
            elif op == "commit" and not auto_commit:
                n = rng.randint(0, len(model.handed))
                q.commit(n)
                model.commit(n)
            elif op == "sync":
                await q.sync()
                model.since_sync.clear()
            elif op == "reopen":
                await q.close()
                q = open_queue()
                model.reopened(crashed=False)
            elif op == "crash":
                generation += 1
                crashed = tmp_path / f"g{generation}"
                shutil.copytree(path, crashed)
                await q.close()
                path = crashed
                q = open_queue()
                model.reopened(crashed=True)
            elif op == "empty":
                q.empty()
                model.emptied()
            elif op == "check":
                await q.sync()
                model.since_sync.clear()
                report = check(path, NAME, max_msg_size=300)
                assert report.ok, report.format()
                assert report.records == len(model.handed) + len(model.unread)
            assert q.depth == len(model.unread)
            assert q.uncommitted == len(model.handed)
        assert q.statistics().records_lost == 0
        await q.close()
        q = open_queue()
        model.reopened(crashed=False)
        assert q.read_many(10**6) == list(model.unread)
        await q.close()


def _tagged(serial: int, rng: random.Random) -> bytes:
    body = rng.randbytes(rng.randint(0, 150))
    return b"%08d" % serial + zlib.crc32(body).to_bytes(4, "big") + body


def _intact(payload: bytes) -> bool:
    return len(payload) >= 12 and zlib.crc32(payload[12:]) == int.from_bytes(payload[8:12], "big")


async def _damage(path: Path, rng: random.Random) -> None:
    for _ in range(rng.randint(1, 3)):
        files = sorted(os.listdir(path))
        if not files:
            return
        file = path / rng.choice(files)
        size = file.stat().st_size
        action = rng.choice(["flip", "flip", "truncate", "delete", "append"])
        if action == "flip" and size:
            data = bytearray(file.read_bytes())
            data[rng.randrange(size)] ^= 1 << rng.randrange(8)
            file.write_bytes(bytes(data))
        elif action == "truncate":
            os.truncate(file, rng.randint(0, size))
        elif action == "delete":
            file.unlink()
        elif action == "append":
            with open(file, "ab") as f:
                f.write(rng.choice([bytes(rng.randint(1, 100)), rng.randbytes(rng.randint(1, 100))]))


async def test_random_damage_never_yields_garbage_and_depth_stays_exact(tmp_path: Path) -> None:
    """Flip bits in, truncate, delete or extend any file, then reopen and drain: every record
    delivered is one that was written, in order; depth at open equals records delivered plus
    records the reader found lost; the queue keeps working afterwards."""
    with trio.fail_after(60):
        for seed in range(40):
            rng = random.Random(seed)
            path = tmp_path / f"s{seed}"
            auto_commit = rng.random() < 0.5
            q = DiskQueue(NAME, path, max_bytes_per_file=rng.choice([300, 1000, 4000]), auto_commit=auto_commit)
            serial = 0
            for _ in range(rng.randint(1, 8)):
                batch = [_tagged(serial + k, rng) for k in range(rng.randint(1, 30))]
                serial += len(batch)
                q.put_many(batch)
                if rng.random() < 0.5:
                    q.read_many(rng.randint(0, 20))
                    if not auto_commit and rng.random() < 0.7:
                        q.commit(rng.randint(0, q.uncommitted))
                if rng.random() < 0.3:
                    await q.sync()
            await q.close()
            await _damage(path, rng)
            check(path, NAME)  # must not raise on any damage
            q = DiskQueue(NAME, path, max_bytes_per_file=rng.choice([300, 1000, 4000]), auto_commit=auto_commit)
            depth, lost = q.depth, q.statistics().records_lost
            delivered, last = 0, -1
            while True:
                before, lost_before = q.depth, q.statistics().records_lost
                batch = q.read_many(rng.randint(1, 20))
                assert q.depth == before - len(batch) - (q.statistics().records_lost - lost_before), f"seed {seed}"
                if not batch:
                    break
                for payload in batch:
                    assert _intact(payload), f"seed {seed}: garbage delivered"
                    assert int(payload[:8]) > last, f"seed {seed}: out of order"
                    last = int(payload[:8])
                delivered += len(batch)
                q.commit()
            assert q.depth == 0
            assert delivered + q.statistics().records_lost - lost == depth, f"seed {seed}"
            q.put(b"after damage")
            await q.close()
            q = DiskQueue(NAME, path)
            assert q.read_many(10) == [b"after damage"]
            await q.close()
