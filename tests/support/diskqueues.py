"""What the disk queue tests put in a queue, how they read it back to its end, and how they
damage its files."""

from __future__ import annotations

import struct
from pathlib import Path

from diskqueue import DiskQueue
from diskqueue.format import HEADER_SIZE, RECORD_HEADER_SIZE

__all__ = ["flip", "read_all", "record_spans", "records"]


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


def record_spans(segment: Path) -> list[tuple[int, int]]:
    """``[start, end)`` of every record in an intact segment, read straight from the bytes."""
    data = segment.read_bytes()
    spans, pos = [], HEADER_SIZE
    while pos < len(data):
        (length,) = struct.unpack_from(">I", data, pos)
        spans.append((pos, pos + RECORD_HEADER_SIZE + length))
        pos += RECORD_HEADER_SIZE + length
    return spans


def flip(segment: Path, at: int, size: int = 8) -> None:
    """Invert ``size`` bytes of ``segment`` from offset ``at``: damage no checksum misses."""
    with open(segment, "r+b") as f:
        f.seek(at)
        old = f.read(size)
        f.seek(at)
        f.write(bytes(b ^ 0xFF for b in old))
