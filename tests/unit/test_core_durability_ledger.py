"""The commit ledger (``broker/core/durability/ledger.py``): commits only once the replacements are durable."""

from __future__ import annotations

import trio

from broker.core.durability.ackfloor import AckFloor
from broker.core.durability.ledger import CommitLedger
from diskqueue import DiskQueue


def _queue(path, name="t:c#store") -> DiskQueue:
    return DiskQueue(name, path, auto_commit=False, min_msg_size=26, max_bytes_per_file=64 * 1024)


class _GatedSync:
    """Stands in for a group commit whose sync has not finished until ``open`` is set."""

    def __init__(self) -> None:
        self.open = trio.Event()
        self.waiting = trio.Event()

    async def wait(self) -> None:
        self.waiting.set()
        await self.open.wait()


async def test_ledger_commits_only_after_the_replacements_are_durable(tmp_path):
    queue = _queue(tmp_path, "t:c")
    queue.put_many([b"x" * 30] * 4)
    acks = AckFloor()
    first = acks.issue(len(queue.read_many(4)))
    ledger = CommitLedger([(acks, queue)], on_error=lambda exc: None)
    gate = _GatedSync()
    acks.done(first)
    acks.done(first + 1)
    ledger.replaced(gate)  # their replacements were written elsewhere, not yet synced
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ledger.commit)
        await gate.waiting.wait()
        acks.done(first + 2)  # retired meanwhile: belongs to the next step
        assert queue.uncommitted == 4
        gate.open.set()
    assert queue.uncommitted == 2
    await ledger.commit()
    assert queue.uncommitted == 1
    await queue.close()
