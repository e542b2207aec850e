"""A parked set: messages kept whole in memory and mirrored, one record each, in a disk queue.

A channel parks messages that wait for something other than a consumer: the
dead-letter set (until an operator kicks or deletes them) and, in durable
mode, deferred messages (until they are due). Such sets are small and change
one message at a time, so the disk side is an append-only log read back in
full on open:

* adding a message appends its record (nsqd's layout with the versioned
  due-time prefix of :mod:`broker.core.message`) and at once reads it back, so that
  every record of the queue is always *handed out* and owns a ticket of an
  :class:`~broker.core.durability.ackfloor.AckFloor`;
* removing a message marks its ticket done; the owner's commit step later
  moves the queue's committed cursor over the done prefix, and the queue's
  sync removes segments below it;
* when the log holds far more dead records than live ones (one long-lived
  message pins the floor while many short-lived ones pass), :meth:`compact`
  re-appends the live messages and retires their old records, so disk use
  stays proportional to the live set.

A restart reads every record past the committed cursor, and the cursor only
moves over a prefix of retired records: a message removed while an older one
is still live comes back. :meth:`settle` prevents that where it matters (a
graceful shutdown, an operator's kick or delete) by rewriting the live set
behind the removed records; after a crash a removed message may come back
(a duplicate, never a loss).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

from broker.core.durability.ackfloor import AckFloor
from broker.core.durability.groupcommit import GroupCommit
from broker.core.message import REPLACES, Message, decode_each, encode, origin
from diskqueue import DiskQueue, DiskQueueError

__all__ = ["ParkedStore"]

log = logging.getLogger("pynsqd.parked")

#: Compact when dead records exceed this many times the live ones ...
_COMPACT_RATIO = 4
#: ... and there are at least this many of them.
_COMPACT_MIN = 4096
#: Records read per call when loading.
_LOAD_BATCH = 4096


class ParkedStore:
    """The disk side of a parked set; the owner keeps the messages themselves.

    Owns ``queue`` (opened with ``auto_commit=False``); the owner runs
    ``queue.run()`` in its nursery, calls :meth:`commit` from its commit step
    and :meth:`close` or :meth:`delete` at the end.
    """

    __slots__ = ("queue", "acks", "group", "replaced", "_live", "_offset", "_offset_known")

    def __init__(self, queue: DiskQueue):
        self.queue = queue
        self.acks = AckFloor()
        self.group = GroupCommit(queue)
        self.replaced: dict[bytes, int] = {}
        self._live = 0
        self._offset: int | None = None  # a record's number in the queue minus its ticket, while known
        self._offset_known = False

    def number(self, msg: Message) -> int:
        """The number (disk queue sequence number) of ``msg``'s record, or -1 when not known."""
        if msg.ticket < 0 or self._offset is None:
            return -1
        return msg.ticket + self._offset

    def _issue(self, first: int, n: int) -> int:
        """Tickets for ``n`` records just read, numbered from ``first``; returns the first ticket."""
        ticket = self.acks.issue(n)
        if not self._offset_known:
            self._offset, self._offset_known = first - ticket, True
        elif self._offset is not None and self._offset != first - ticket:
            self._offset = None  # records were lost to damage: numbers are no longer certain
        return ticket

    def load(self) -> list[Message]:
        """Every message the queue holds past its committed cursor, each with its ticket.

        Call once, right after opening. Unreadable records are logged and retired.
        For the messages whose record says it replaces another
        (:data:`~broker.core.message.REPLACES`), ``replaced`` maps the message id to that number.
        """
        out: list[Message] = []
        replaced: dict[bytes, int] = {}
        for ticket, records in self._read_rest():
            for record, msg in zip(records, decode_each(records, log, self.queue.name)):
                if msg is None:
                    self.acks.done(ticket)
                else:
                    msg.ticket = ticket
                    out.append(msg)
                    mark = origin(record)
                    if mark is not None and mark.kind == REPLACES:
                        replaced[msg.id] = mark.replaces
                    else:
                        replaced.pop(msg.id, None)  # the newest record of a message speaks for it
                ticket += 1
        self._live = len(out)
        self.replaced = replaced
        return out

    def add(self, msgs: list[Message], records: list[bytes] | None = None) -> None:
        """Append ``msgs`` and give each its ticket.

        ``records``: the messages' records when the caller encoded them (with
        an origin prefix, :func:`~broker.core.message.mark_origin`). Raises the queue's
        ``DiskQueueError``; the messages then hold no ticket (-1) and whatever
        part of the batch reached the file is retired at once (a restart may
        bring it back as a duplicate, never lose it).
        """
        queue = self.queue
        try:
            queue.put_many(records if records is not None else [encode(m) for m in msgs])
        except DiskQueueError:
            for msg in msgs:
                msg.ticket = -1
            self._retire_unread()
            raise
        # Read the records straight back: the queue is always fully read, so these
        # are exactly the ones just written, and reading them hands them out.
        got = 0
        first = queue.read_seq
        while got < len(msgs):
            records = queue.read_many(len(msgs) - got)
            if not records:
                break
            got += len(records)
        ticket = self._issue(first, got)
        for msg in msgs[:got]:
            msg.ticket = ticket
            ticket += 1
        self._live += len(msgs)

    def _retire_unread(self) -> None:
        for ticket, records in self._read_rest():
            for done in range(ticket, ticket + len(records)):
                self.acks.done(done)

    def _read_rest(self) -> Iterator[tuple[int, list[bytes]]]:
        """Read the queue to its end, a batch at a time, each with the ticket of its first record."""
        queue = self.queue
        while queue.depth:
            first = queue.read_seq
            records = queue.read_many(_LOAD_BATCH)
            if not records:
                break
            yield self._issue(first, len(records)), records

    def remove(self, msg: Message) -> None:
        """Retire ``msg``'s record (it left the set)."""
        self.remove_many((msg,))

    def remove_many(self, msgs: Iterable[Message]) -> None:
        """Retire the records of several messages (those without a record are skipped)."""
        done = self.acks.done
        n = 0
        for msg in msgs:
            if msg.ticket >= 0:
                done(msg.ticket)
                n += 1
        self._live -= n

    def wants_compaction(self) -> bool:
        """Whether dead records outweigh the live ones enough to rewrite the live ones."""
        dead = len(self.acks) - self._live
        return dead >= _COMPACT_MIN and dead > _COMPACT_RATIO * self._live

    def compact(self, live: list[Message]) -> None:
        """Re-append the ``live`` messages (the whole set) and retire their old records."""
        old = [m.ticket for m in live]
        self._live -= len(live)
        self.add(live)
        for ticket in old:
            self.acks.done(ticket)

    def settle(self, live: list[Message]) -> None:
        """Make the records past the committed cursor exactly ``live`` (the whole set).

        Rewrites the live messages when a removed record lies past the floor;
        the caller then commits (:meth:`commit`) and syncs the queue.
        """
        if len(self.acks) > self._live:
            self.compact(live)

    def commit(self) -> None:
        """Move the queue's committed cursor over the records retired so far.

        The caller must first have made durable whatever replaced them (see
        :class:`~broker.core.durability.ledger.CommitLedger`); the next sync of the queue records it.
        """
        n = self.acks.take()
        if n:
            self.queue.commit(n)

    def clear(self) -> None:
        """Drop every record (the owner dropped the set)."""
        self.queue.empty()
        self.acks.reset()
        self._live = 0
        self._offset, self._offset_known = None, False

    async def close(self) -> None:
        """Commit what is retired and close the queue (which syncs).

        Call :meth:`settle` first (before any other queue whose records
        replace retired ones here is synced) for a restart without duplicates.
        """
        self.commit()
        await self.queue.close()

    def delete(self) -> None:
        """Remove the queue's files."""
        self.queue.delete()
