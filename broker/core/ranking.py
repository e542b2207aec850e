"""Priorities: a channel that delivers its ready messages in (priority, arrival) order.

A message may carry a priority, 0 (most urgent) to 2**32-1, as beanstalkd's jobs
do; one without carries None and ranks as ``--default-priority`` (2**31 unless
set, so a publisher can mark messages both more and less urgent than the
unprioritised ones). Arrival is the message id: ids increase in publish order
(:mod:`broker.core.guid`), so ``(priority, id)`` is beanstalkd's ``(pri, job id)``
and a message requeued, timed out, deferred or kicked takes its place back by
its own arrival, not behind everything.

A topic *ranks* once a message with a priority other than the default is
published to it; from then on (kept in ``nsqd.dat``) each of its channels keeps
its ready messages in a :class:`RankedMemory` instead of a deque. A topic that
never sees a priority keeps the plain FIFO path, at no cost.

**On disk.** Memory holds at most ``--mem-queue-size`` ready messages, the most
urgent ones; the rest wait in the channel's disk queue, which is a FIFO log, in
no particular order. The queue knows a *floor*, a key no unread record is below.
While the front of memory is below the floor, it is the most urgent ready
message and goes out. When it is not (memory ran empty, a more urgent record
was appended, or nothing is known after a start), the channel *sweeps*: it reads
every unread record once, keeps the most urgent ones in memory and appends the
others behind, as new records, and the floor becomes the least of those. It does so
a bounded step at a time, in a task of the channel (:mod:`broker.core.sweeper`), and
delivers nothing until the last step. With
``n`` records on disk and memory ``m``, draining the backlog costs about
``n / m`` sweeps; a sweep reads and writes at most ``n`` records. Durable
channels write those records as replacements of the ones read (as a REQ
does), so a crash in a sweep delivers again rather than loses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from sortedcontainers import SortedKeyList

from broker.core.message import Message

__all__ = ["LOWEST_KEY", "HIGHEST_KEY", "RankedMemory", "Key", "rank_key"]

Key = tuple[int, bytes]
#: A key below every message's.
LOWEST_KEY: Key = (-1, b"")
#: A key above every message's.
HIGHEST_KEY: Key = (1 << 33, b"")


def rank_key(default: int) -> Callable[[Message], Key]:
    """The sort key of a message: its priority (``default`` when it has none), then its id."""

    def key(msg: Message) -> Key:
        priority = msg.priority
        return (default if priority is None else priority, msg.id)

    return key


class RankedMemory(SortedKeyList):
    """Ready messages in (priority, arrival) order, with the deque methods a channel uses:
    ``popleft`` takes the most urgent, ``pop`` the least, ``append`` and ``extend`` insert
    each message in its place."""

    def __init__(self, messages: Iterable[Message], key: Callable[[Message], Key]):
        super().__init__(messages, key=key)

    append = SortedKeyList.add
    extend = SortedKeyList.update

    def popleft(self) -> Message:
        return self.pop(0)

    def below(self, floor: Key) -> int:
        """How many messages rank at or before ``floor``."""
        return self.bisect_key_right(floor)

