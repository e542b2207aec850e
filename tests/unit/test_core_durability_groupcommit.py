"""Group commit (``broker/core/durability/groupcommit.py``): one sync shared by the writers waiting at once."""

from __future__ import annotations

import trio

from broker.core.durability.groupcommit import GroupCommit
from diskqueue import DiskQueue


async def test_group_commit_shares_one_sync_among_concurrent_writers(tmp_path):
    queue = DiskQueue("t", tmp_path, min_msg_size=1)
    group = GroupCommit(queue)

    async def writer(i: int) -> None:
        queue.put(b"record-%d" % i)
        await group.wait()

    async with trio.open_nursery() as nursery:
        for i in range(50):
            nursery.start_soon(writer, i)
    assert 1 <= group.syncs <= 3
    await queue.close()
