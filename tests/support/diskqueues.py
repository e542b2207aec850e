"""What the disk queue tests put in a queue and how they read it back to its end."""

from __future__ import annotations

from diskqueue import DiskQueue

__all__ = ["read_all", "records"]


def records(n: int, start: int = 0, size: int = 20) -> list[bytes]:
    """``n`` distinct records of ``size`` bytes, numbered from ``start`` (``00000007............``)."""
    return [(b"%08d" % i).ljust(size, b".") for i in range(start, start + n)]


def read_all(q: DiskQueue, batch: int = 100, *, exact: bool = True) -> list[bytes]:
    """Every record ``q`` hands out, ``batch`` at a time, until a read hands none; in order.

    With ``exact``, each read must take from the depth exactly the records it returned and
    those it found lost (``statistics().records_lost``), whatever the damage the test did to
    the files. After a power cut the checkpoint may be older than the data, and the queue
    corrects its depth as it reads: such a test passes ``exact=False``.
    """
    out: list[bytes] = []
    while True:
        depth, lost = q.depth, q.statistics().records_lost
        got = q.read_many(batch)
        if exact:
            assert q.depth == depth - len(got) - (q.statistics().records_lost - lost), (depth, len(got), q.depth)
        if not got:
            return out
        out += got
