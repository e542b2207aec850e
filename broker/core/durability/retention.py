"""Durable retention (``--durable``): every message of a channel stays on disk until it is finished.

* every ready message is a record of the channel's disk queue, which is read
  without auto-commit; the memory deque only holds records read ahead, each
  with a ticket of the channel's :class:`~broker.core.durability.ackfloor.AckFloor`;
* a record is *retired* (its ticket done) when its message is finished, or
  after its replacement was written: REQ and timeouts append a new record,
  deferral and burial move it to the channel's deferred or buried store (both
  :class:`~broker.core.durability.parked.ParkedStore`);
* the channel's :class:`~broker.core.durability.ledger.CommitLedger` waits until every
  replacement is on stable storage, then moves each queue's committed cursor
  over its retired prefix. A crash therefore re-delivers everything not
  finished (and what was finished after the last checkpoint: duplicates), and
  never loses a message. An old record read again after a crash while a newer
  copy of its message waits deferred or buried is dropped (``_superseded``),
  so a crash undoes neither a deferral nor a burial.

Disk cost: a record is freed only when every older record of its queue is
retired, so one message that stays in flight for a long time keeps the
segments written after it (at most ``--max-msg-timeout``); deferred messages
live in their own store, which compacts itself, so long deferrals do not pin
the channel's queue.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from broker.core.durability.ackfloor import AckFloor
from broker.core.durability.groupcommit import GroupCommit
from broker.core.durability.parked import ParkedStore
from broker.core.host import CoreHost
from broker.core.message import Message, decode_each, encode, now_ns
from broker.core.retention import Retention, close_all, store_name
from broker.core.spill import REFILL_BATCH, SpillQueue
from diskqueue import DiskQueue, DiskQueueError

if TYPE_CHECKING:
    from broker.core.channel import Channel

__all__ = ["DurableRetention", "RETRY_DELAY"]

log = logging.getLogger("pynsqd.channel")

#: Seconds before a replacement write that failed is tried again.
RETRY_DELAY = 1.0


class DurableRetention(Retention):
    """A channel's disk queue read without auto-commit, its deferred and buried stores, and their commits.

    ``group`` is the group commit of the channel's queue.
    """

    def __init__(self, channel: Channel, host: CoreHost):
        queues = host.queues
        backend = queues.open(channel.where, auto_commit=False)
        self.backend: DiskQueue = backend
        self.acks = AckFloor()
        self.group = GroupCommit(backend)
        # the store a shutdown without --durable writes deferred messages to, kept live
        self.deferred_store = ParkedStore(queues.open(store_name(channel, "deferred"), auto_commit=False))
        ready = SpillQueue(backend, host.options.mem_queue_size, where=f"channel {channel.where}", log=log, write_through=True)
        super().__init__(channel, host, ready, ParkedStore(queues.open(store_name(channel, "buried"),
                                                                       auto_commit=False)))

    def _floors(self) -> list:
        store = self.deferred_store
        return [(self.acks, self.backend), (store.acks, store.queue), *super()._floors()]

    def queues(self) -> list[DiskQueue]:
        return [*super().queues(), self.deferred_store.queue]

    def restore(self) -> None:
        super().restore()
        msgs = self.deferred_store.load()
        wall = now_ns()
        due = [m for m in msgs if m.due_ns <= wall]
        for msg in msgs:
            if msg.due_ns > wall:
                self._hold(msg, msg.due_ns)
        if due:
            self.release(due)
        log.info("channel %s: %d deferred messages in the store", self.channel.where, len(msgs))

    # ---------------------------------------------------------------- moves

    def put_records(self, records: list[bytes]) -> int:
        self.backend.put_many(records)
        return len(records)

    def append(self, msgs: list[Message]) -> bool:
        """Append ``msgs`` as new ready records; False (reported) if the write failed."""
        for msg in msgs:
            msg.due_ns = 0
        try:
            self.backend.put_many([encode(m) for m in msgs])
        except DiskQueueError as exc:
            self.host.disk_failed(exc)
            return False
        self.ledger.replaced(self.group)
        return True

    def defer(self, msgs: list[Message], due_ns: int) -> bool:
        return self._park(msgs, due_ns)

    def _park(self, msgs: list[Message], due_ns: int | None) -> bool:
        """Write ``msgs`` to the deferred store, then hold them until due.

        ``due_ns`` overrides each message's own due time. Messages that held a
        ticket of the channel's queue have it retired once the store has
        their record. Returns False (nothing moved, reported) if the write failed.
        """
        old = [m.ticket for m in msgs]
        saved = [m.due_ns for m in msgs]
        if due_ns is not None:
            for msg in msgs:
                msg.due_ns = due_ns
        try:
            self.deferred_store.add(msgs)
        except DiskQueueError as exc:
            self.host.disk_failed(exc)
            for msg, ticket, due in zip(msgs, old, saved):
                msg.ticket, msg.due_ns = ticket, due
            return False
        done = self.acks.done
        for msg, ticket in zip(msgs, old):
            done(ticket)
            self._hold(msg, msg.due_ns)
        self.ledger.replaced(self.deferred_store.group)
        return True

    def _hold(self, msg: Message, due_ns: int) -> None:
        """Hold ``msg`` as deferred, dropping the record of an older copy (re-delivered after a crash)."""
        old = self.channel.deferred.get(msg.id)
        if old is not None and old is not msg:
            self.deferred_store.remove(old)
        self.channel.defer_until(msg, due_ns)

    def release(self, msgs: list[Message]) -> None:
        """Move due messages from the deferred store to the ready queue (retried later if the write fails)."""
        store = self.deferred_store
        if self.append(msgs):
            store.remove_many(msgs)
            if store.wants_compaction():
                store.compact(list(self.channel.deferred.values()))
        else:
            wall = now_ns() + int(RETRY_DELAY * 1e9)
            for msg in msgs:
                self._hold(msg, wall)

    def retire(self, msgs: list[Message]) -> None:
        done = self.acks.done
        for msg in msgs:
            done(msg.ticket)
        self.ledger.wake()

    def buried_replaced(self, tickets: list[int]) -> None:
        done = self.acks.done
        for ticket in tickets:
            done(ticket)
        store = self.buried.store
        assert store is not None
        self.ledger.replaced(store.group)

    def refill(self, want: int) -> bool:
        backend = self.backend
        if not backend.depth:
            return False
        records = backend.read_many(max(1, min(want, REFILL_BATCH)))
        if not records:
            return False
        acks = self.acks
        memory = self.ready.memory
        ticket = acks.issue(len(records))
        wall = now_ns()
        later: list[Message] = []  # records with a due time, for the deferred store
        dropped = False
        for msg in decode_each(records, log, self.ready.where):
            if msg is None:
                acks.done(ticket)
                ticket += 1
                dropped = True
                continue
            msg.ticket = ticket
            ticket += 1
            if self._superseded(msg):
                acks.done(msg.ticket)
                dropped = True
                continue
            if msg.due_ns > wall:
                later.append(msg)
            else:
                msg.due_ns = 0
                memory.append(msg)
        if later and not self._park(later, None):
            memory.extend(later)  # the store refused them: deliver now rather than drop
        if dropped:
            self.ledger.wake()
        return True

    def _superseded(self, msg: Message) -> bool:
        """Whether a newer copy of ``msg`` waits deferred or buried.

        A REQ with a delay or a burial writes the message's new record to a
        store before its old record is committed away; a crash in between
        leaves both, and the old one must not undo the deferral or the burial.
        The newer copy has at least as many attempts.
        """
        held = self.channel.deferred.get(msg.id) or self.buried.messages.get(msg.id)
        return held is not None and held.attempts >= msg.attempts

    # ---------------------------------------------------------------- commits and end

    async def wait_durable(self) -> None:
        await self.group.wait()
        await self.deferred_store.group.wait()

    async def close(self) -> int:
        """Append the messages in memory and in flight once more and commit every record read so far.

        Deferred and buried messages are records of their stores already; a
        graceful restart then delivers each live message once, without the
        duplicates a crash would cause. When the disk refuses (full), nothing is
        committed: every message is still a record read but not committed, so
        the next start delivers it again; none is lost (returns 0).
        """
        channel = self.channel
        buried = self.buried.store
        assert buried is not None
        stores = [buried, self.deferred_store]
        live = list(self.ready.memory)
        live.extend(channel.in_flight_timers.live())
        try:
            buried.settle(list(self.buried.messages.values()))
            self.deferred_store.settle(list(channel.deferred.values()))
            if live:
                self.backend.put_many([encode(m) for m in live])
            # replacements first, on stable storage in every queue; then the commits
            for queue in self.queues():
                await queue.sync()
            self.backend.commit()
            self.acks.reset()
            for store in stores:
                store.commit()
        except DiskQueueError as exc:
            log.error("channel %s: the disk refused the final writes (%s); nothing was committed, so the "
                      "next start delivers the %d messages in memory or in flight again", channel.where, exc,
                      len(live))
        await close_all(self.queues(), f"channel {channel.where}")
        return 0

    def empty(self) -> None:
        super().empty()
        self.acks.reset()
        self.deferred_store.clear()
