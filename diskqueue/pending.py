"""Records handed out by ``read_many`` and not yet committed: where the ack floor can move."""

from __future__ import annotations

from collections import deque

from .checkpoint import Cursor
from .format import HEADER_SIZE, RECORD_HEADER_SIZE

__all__ = ["Uncommitted"]


class _Handed:
    """The records one ``read_many`` handed out from one segment.

    Only their payload lengths are kept (one list slot each, and only while uncommitted);
    ``pos`` is where the first uncommitted one starts, ``seq`` the sequence number of the
    first of them all.
    """

    __slots__ = ("file", "pos", "lengths", "done", "seq")

    def __init__(self, file: int, pos: int, lengths: list[int], seq: int) -> None:
        self.file = file
        self.pos = pos
        self.lengths = lengths
        self.done = 0
        self.seq = seq


class Uncommitted:
    """Handed-out records in order, and the segment ends the reader crossed after them.

    ``commit(n)`` returns the cursor just past the ``n`` oldest records. A cursor that lands
    exactly at the end of a segment the reader has already left is moved to the start of
    the segment it went on to, so the left segment can be removed.
    """

    __slots__ = ("_handed", "_crossed", "count")

    def __init__(self) -> None:
        self._handed: deque[_Handed] = deque()
        self._crossed: dict[int, tuple[int, int, int]] = {}
        self.count = 0

    def hand_out(self, file: int, pos: int, seq: int, payloads: list[bytes]) -> None:
        """Remember ``payloads``, read from segment ``file`` starting at ``pos``/``seq``."""
        self._handed.append(_Handed(file, pos, list(map(len, payloads)), seq))
        self.count += len(payloads)

    def crossed(self, left: int, end: int, entered: Cursor) -> None:
        """The reader left segment ``left`` at offset ``end`` for ``entered``."""
        if self._handed:
            self._crossed[left] = (end, entered.file, entered.seq)

    def commit(self, n: int) -> Cursor:
        """Forget the ``n`` oldest records (``0 < n <= count``); the cursor just past them.

        When nothing handed out remains the caller should use the read cursor instead.
        """
        self.count -= n
        handed_out = self._handed
        while True:
            handed = handed_out[0]
            done = handed.done
            take = min(n, len(handed.lengths) - done)
            handed.pos += sum(handed.lengths[done : done + take]) + RECORD_HEADER_SIZE * take
            handed.done = done + take
            n -= take
            if handed.done == len(handed.lengths):
                handed_out.popleft()
            if not n:
                break
        file, pos, seq = handed.file, handed.pos, handed.seq + handed.done
        crossed = self._crossed
        while True:
            hop = crossed.get(file)
            if hop is None or hop[0] != pos:
                break
            file, pos, seq = hop[1], HEADER_SIZE, hop[2]
        if not handed_out:
            crossed.clear()
        for left in [k for k in crossed if k < file]:
            del crossed[left]
        return Cursor(file, pos, seq)

    def clear(self) -> None:
        """Forget everything (the queue was emptied)."""
        self._handed.clear()
        self._crossed.clear()
        self.count = 0

    def __bool__(self) -> bool:
        return self.count > 0
