"""The ack floor of a disk queue read without auto-commit: which handed-out records are done.

A disk queue opened with ``auto_commit=False`` hands records out in order and
only forgets them (after a restart) once ``commit(n)`` has moved its committed
cursor over them. Records are finished out of order, though: a consumer FINs
message 7 while message 3 is still in flight. An :class:`AckFloor` gives every
handed-out record a *ticket* (consecutive integers, in read order), remembers
which tickets are done, and counts how far the done prefix has advanced, which
is exactly the ``n`` the queue may commit::

    tickets   10 11 12 13 14 15 16
    done       x  x  .  x  .  x  .      floor = 12: commit(2) may be issued
    (12 and 14 are still in memory, in flight or deferred)

A crash loses nothing past the floor: records from the floor on are read again
after a restart (the done ones among them are duplicates).
"""

from __future__ import annotations

__all__ = ["AckFloor", "COMMIT_INTERVAL"]

#: Finished flags dropped from the front of the buffer at most this often (bytes).
_COMPACT_AT = 4096

#: Seconds an owner waits after one commit step before the next. A commit step
#: may need a sync of several queues first; waiting lets one step cover every
#: record retired meanwhile, at the price of re-delivering a little more after
#: a crash.
COMMIT_INTERVAL = 0.1


class AckFloor:
    """Tickets for the records one disk queue handed out, and their done flags.

    ``issue(n)`` is called with every ``read_many`` result (n records), ``done``
    when a record's message leaves the owner for good (finished, re-appended
    elsewhere, dropped), ``take()`` by whoever calls ``commit``. ``reset()``
    follows an ``empty()`` of the queue: tickets issued before it are ignored,
    and ``epoch`` changes so that a commit prepared before it is dropped.
    """

    __slots__ = ("_flags", "_head", "_floor", "_next", "_advanced", "epoch")

    def __init__(self) -> None:
        self._flags = bytearray()  # done flags of tickets _floor .. _next-1, from _head on
        self._head = 0
        self._floor = 0  # the oldest ticket not yet done
        self._next = 0
        self._advanced = 0  # tickets below _floor not yet returned by take()
        self.epoch = 0

    def __len__(self) -> int:
        """Tickets handed out and not yet below the floor (done or not)."""
        return self._next - self._floor

    @property
    def floor(self) -> int:
        """The oldest ticket that is not done (or the next ticket when all are)."""
        return self._floor

    def issue(self, n: int) -> int:
        """Hand out ``n`` consecutive tickets; returns the first."""
        first = self._next
        self._next = first + n
        self._flags.extend(bytes(n))
        return first

    def done(self, ticket: int) -> None:
        """Mark ``ticket`` finished. Stale tickets (below the floor, or from before a reset) are ignored."""
        i = ticket - self._floor
        if i < 0 or ticket >= self._next:
            return
        flags = self._flags
        head = self._head
        flags[head + i] = 1
        if i:
            return
        end = len(flags)
        j = head
        while j < end and flags[j]:
            j += 1
        moved = j - head
        self._floor += moved
        self._advanced += moved
        if j > _COMPACT_AT and j * 2 > end:
            del flags[:j]
            j = 0
        self._head = j

    def done_ranges(self, limit: int) -> list[tuple[int, int]]:
        """Up to ``limit`` runs ``(first, end)`` of done tickets past the floor, oldest first (``end`` excluded)."""
        flags = self._flags
        head = self._head
        base = self._floor - head  # ticket = base + index into flags
        out: list[tuple[int, int]] = []
        i = flags.find(1, head)
        while i >= 0 and len(out) < limit:
            j = flags.find(0, i)
            if j < 0:
                j = len(flags)
            out.append((base + i, base + j))
            i = flags.find(1, j)
        return out

    def take(self) -> int:
        """How far the floor advanced since the last call: the ``n`` to commit."""
        n = self._advanced
        self._advanced = 0
        return n

    def untake(self, n: int) -> None:
        """Give back what :meth:`take` returned when the commit could not be made."""
        self._advanced += n

    def reset(self) -> None:
        """Forget every ticket (the queue was emptied); later ``done`` calls for them do nothing."""
        self._flags = bytearray()
        self._head = 0
        self._floor = self._next
        self._advanced = 0
        self.epoch += 1
