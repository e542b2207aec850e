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
  over its retired prefix, and writes the runs of retired records past it
  into the queue's checkpoint. A crash therefore re-delivers only what was
  finished after the last commit step (duplicates), and never loses a
  message; new records say which they replace, so the second copies a crash
  leaves are dropped when read (:mod:`~broker.core.durability.restart`). An old
  record read again after a crash while a newer copy of its message waits
  deferred or buried is dropped (``_superseded``), so a crash undoes neither a
  deferral nor a burial.

Disk cost: a record is freed only when every older record of its queue is
retired, so one message that stays in flight for a long time keeps the
segments written after it (at most ``--max-msg-timeout``); deferred messages
live in their own store, which compacts itself, so long deferrals do not pin
the channel's queue.
"""

from __future__ import annotations

import logging

from broker.core.deferred import Deferred
from broker.core.durability.ackfloor import AckFloor
from broker.core.durability.groupcommit import GroupCommit
from broker.core.durability.parked import ParkedStore
from broker.core.durability.restart import Leftovers, encode_done, newest_copy, record_origin
from broker.core.host import CoreHost
from broker.core.message import (
    COPIED,
    RELEASED,
    REPLACES,
    Message,
    decode_all,
    decode_each,
    encode,
    is_deferred_record,
    mark_origin,
    now_ns,
)
from broker.core.retention.memory import RETRY_DELAY, MemoryRetention, close_all, store_name
from broker.core.spill import REFILL_BATCH, SpillQueue
from diskqueue import DiskQueue, DiskQueueError

__all__ = ["DurableRetention"]

log = logging.getLogger("pynsqd.channel")

#: How far a file's modification time may lag the wall clock of the write that set it.
_MTIME_SLACK_NS = 1_000_000_000

#: Runs of done records past the committed cursor that a checkpoint lists at most.
_NOTE_RANGES = 4096


class DurableRetention(MemoryRetention):
    """A channel's disk queue read without auto-commit, its deferred and buried stores, and their commits.

    ``group`` is the group commit of the channel's queue.
    """

    def __init__(self, where: str, host: CoreHost, deferred: Deferred):
        queues = host.queues
        backend = queues.open(where, auto_commit=False)
        self.backend: DiskQueue = backend
        self.acks = AckFloor()
        self.group = GroupCommit(backend)
        # the store a shutdown without --durable writes deferred messages to, kept live
        self.deferred_store = ParkedStore(queues.open(store_name(where, "deferred"), auto_commit=False))
        self._copies_failed = False
        self.leftovers = Leftovers(backend)
        self._origins: dict[bytes, int] = {}  # deferred message id -> the queue record its deferral replaced
        self._offset: int | None = None  # a record's number in the queue minus its ticket, while known
        self._offset_known = False
        ready = SpillQueue(backend, host.options.mem_queue_size, where=f"channel {where}", log=log, write_through=True)
        super().__init__(where, host, deferred, ready,
                         ParkedStore(queues.open(store_name(where, "buried"), auto_commit=False)))

    def _floors(self) -> list:
        store = self.deferred_store
        return [(self.acks, self.backend), (store.acks, store.queue), *super()._floors()]

    def _notes(self) -> list:
        return [(self.backend, self._done_note)]

    def _done_note(self) -> bytes | None:
        """The records past the committed cursor that are done, for the queue's checkpoint.

        Finished records (and replaced ones, once the ledger has made their
        replacements durable: it takes this note before it syncs them) are
        done, but the committed cursor cannot pass them while an older record
        is still in flight. Kept in the checkpoint, they are dropped after a
        crash instead of being delivered again (:mod:`~broker.core.durability.restart`).
        The first :data:`_NOTE_RANGES` runs are kept. None while record numbers
        are not known (the note is then left as it is: what it says stays true).
        """
        offset = self._offset
        if offset is None:
            return None
        ranges = [(a + offset, b + offset) for a, b in self.acks.done_ranges(_NOTE_RANGES)]
        ranges.extend(self.leftovers.done_since(self.backend.read_seq))
        return encode_done(ranges)

    def queues(self) -> list[DiskQueue]:
        return [*super().queues(), self.deferred_store.queue]

    def restore(self) -> None:
        super().restore()
        msgs = self._newest(self.deferred_store.load())
        replaced = self.deferred_store.replaced
        self._origins.update(replaced)
        self.leftovers.deferred_at_start(msgs)
        due = self._hold_until_due(msgs)
        if due:
            due = self._not_released(due)
        if due:
            self.release(due)
        log.info("channel %s: %d deferred messages in the store", self.where, len(msgs))

    # ---------------------------------------------------------------- moves

    def put_records(self, records: list[bytes], number: int) -> int:
        """Write a durable topic's records: plain ones to the queue, deferred ones to the deferred store.

        The last record written to each carries ``number`` (see
        :meth:`copied_through`), in the same write as the copies. Once a write
        failed, no more numbers are written until a restart: a later number
        would cover the copies that failure lost. Raises the queue's ``DiskQueueError``.
        """
        plain = [r for r in records if not is_deferred_record(r)]
        deferred = [r for r in records if is_deferred_record(r)] if len(plain) != len(records) else []
        mark = None if self._copies_failed else number
        try:
            if plain:
                if mark is not None:
                    plain[-1] = mark_origin(plain[-1], COPIED, source=mark)
                self.backend.put_many(plain)
                if self.ready.ranked:
                    self.ready.wrote(decode_all(plain, log, self.ready.where))
            if deferred:
                msgs = decode_all(deferred, log, self.ready.where)
                if msgs:
                    if mark is not None:
                        deferred[-1] = mark_origin(deferred[-1], COPIED, source=mark)
                    self.deferred_store.add(msgs, deferred if len(msgs) == len(deferred) else None)
                due = self._hold_until_due(msgs)
                if due:
                    self.release(due)
                return len(plain) + len(msgs)
        except DiskQueueError:
            self._copies_failed = True
            raise
        return len(plain)

    def copied_through(self) -> tuple[int, int]:
        """The topic record numbers the newest copies in the queue and in the deferred store carry.

        A durable topic copies its records in order, the plain ones into the
        queue and the deferred ones into the deferred store, each batch in one
        write whose last record carries the topic's number for the batch's
        last record (:data:`~broker.core.message.COPIED`). So a number found
        here means every earlier record of that kind reached this channel in a
        write no later than that one: after a crash the topic skips them
        instead of copying them twice. -1 when nothing says so: no copy left on
        disk, or damage in the queue, which may have taken copies before the
        number (copying again makes duplicates, never a loss).
        """
        return newest_copy(self.backend), newest_copy(self.deferred_store.queue)

    def append(self, msgs: list[Message]) -> bool:
        """Append ``msgs`` as new ready records; False (reported) if the write failed."""
        for msg in msgs:
            msg.due_ns = 0
        try:
            self.backend.put_many([encode(m) for m in msgs])
        except DiskQueueError as exc:
            self.host.disk_failed(exc)
            return False
        if self.ready.ranked:
            self.ready.wrote(msgs)
        self.ledger.replaced(self.group)
        return True

    def requeue(self, msgs: list[Message]) -> bool:
        """Append ``msgs`` as new records that name the records they replace, then retire those."""
        for msg in msgs:
            msg.due_ns = 0
        try:
            self.backend.put_many(self._replacements(msgs))
        except DiskQueueError as exc:
            self.host.disk_failed(exc)
            return False
        if self.ready.ranked:
            self.ready.wrote(msgs)
        self.ledger.replaced(self.group)
        self.retire(msgs)
        return True

    def _replacements(self, msgs: list[Message]) -> list[bytes]:
        """The new records of ``msgs`` (read from the queue), each naming the record it replaces."""
        offset = self._offset
        if offset is None:
            return [encode(m) for m in msgs]
        return [encode(m) if m.ticket < 0 else mark_origin(encode(m), REPLACES, replaces=m.ticket + offset)
                for m in msgs]

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
            self.deferred_store.add(msgs, self._replacements(msgs))
        except DiskQueueError as exc:
            self.host.disk_failed(exc)
            for msg, ticket, due in zip(msgs, old, saved):
                msg.ticket, msg.due_ns = ticket, due
            return False
        if self._offset is not None:
            for msg, ticket in zip(msgs, old):
                if ticket >= 0:
                    self._origins[msg.id] = ticket + self._offset
        done = self.acks.done
        for msg, ticket in zip(msgs, old):
            done(ticket)
            self._hold(msg, msg.due_ns)
        self.ledger.replaced(self.deferred_store.group)
        return True

    def _newest(self, msgs: list[Message]) -> list[Message]:
        """The newest record of each message the deferred store holds; older ones (a crash left them
        before their commit) are retired."""
        newest: dict[bytes, Message] = {}
        older = []
        for msg in msgs:
            prev = newest.get(msg.id)
            if prev is not None:
                older.append(prev)
            newest[msg.id] = msg
        if not older:
            return msgs
        self.deferred_store.remove_many(older)
        self.ledger.wake()
        return list(newest.values())

    def _not_released(self, due: list[Message]) -> list[Message]:
        """The due messages of the deferred store whose release did not reach the queue before a crash.

        A release appends the message to the queue and retires its store record,
        which is committed a moment later: a crash in between leaves both. The
        queue's record names the store record it came from
        (:data:`~broker.core.message.RELEASED`) and was written at or after the
        message's due time, so only segments modified since the oldest due time
        are searched. Those store records are retired instead of being released a
        second time (see :mod:`~broker.core.durability.restart` for the queue records).
        """
        store = self.deferred_store
        want = {number: m for m in due if (number := store.number(m)) >= 0}
        if not want:
            return due
        found: list[Message] = []
        since = min(m.due_ns for m in want.values()) - _MTIME_SLACK_NS
        for records in self.backend.newest_records(since):
            for record in records:
                if record[:1] == b"\xfe":
                    mark = record_origin(record)
                    if mark is not None and mark.kind == RELEASED and mark.source in want:
                        found.append(want.pop(mark.source))
            if not want:
                break
        if not found:
            return due
        self.leftovers.released_before(found)
        store.remove_many(found)
        self.ledger.wake()
        log.info("channel %s: %d deferred messages were released before the restart", self.where, len(found))
        gone = {id(m) for m in found}
        return [m for m in due if id(m) not in gone]

    def _hold_until_due(self, msgs: list[Message]) -> list[Message]:
        """Hold the messages of the deferred store that are not due yet; returns those that are."""
        wall = now_ns()
        for msg in msgs:
            if msg.due_ns > wall:
                self._hold(msg, msg.due_ns)
        return [m for m in msgs if m.due_ns <= wall]

    def _hold(self, msg: Message, due_ns: int) -> None:
        """Hold ``msg`` as deferred, dropping the record of an older copy (re-delivered after a crash)."""
        old = self.deferred.get(msg.id)
        if old is not None and old is not msg:
            self.deferred_store.remove(old)
        self.deferred.hold(msg, due_ns)

    def release(self, msgs: list[Message]) -> None:
        """Move due messages from the deferred store to the ready queue (retried later if the write fails).

        Each new record names its record in the store and the queue record its
        deferral replaced (:data:`~broker.core.message.RELEASED`), for a restart after a crash.
        """
        store = self.deferred_store
        origins = self._origins
        records = []
        for msg in msgs:
            msg.due_ns = 0
            records.append(mark_origin(encode(msg), RELEASED, source=store.number(msg),
                                       replaces=origins.get(msg.id, -1)))
        try:
            self.backend.put_many(records)
        except DiskQueueError as exc:
            self.host.disk_failed(exc)
            wall = now_ns() + int(RETRY_DELAY * 1e9)
            for msg in msgs:
                self._hold(msg, wall)
            return
        if self.ready.ranked:
            self.ready.wrote(msgs)
        self.ledger.replaced(self.group)
        for msg in msgs:
            origins.pop(msg.id, None)
        store.remove_many(msgs)
        if store.wants_compaction():
            store.compact(self.deferred.values())

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

    def sweep_batch(self, want: int, keep: int) -> int:
        """Read ahead; what memory cannot keep is requeued: new records that replace those read."""
        before = self.backend.depth
        msgs = self._read_ahead(want)
        if msgs is None:
            return 0
        read = max(1, before - self.backend.depth)
        memory = self.ready.memory
        excess = len(memory) - keep
        if excess > 0:
            back = [memory.pop() for _ in range(excess)]
            if not self.requeue(back):
                memory.extend(back)
                self.sweep_refused(len(back))
                return 0
        self.ready.sweep_read(read, msgs)
        return read

    def read_ahead(self, want: int) -> bool:
        return self._read_ahead(want) is not None

    def _read_ahead(self, want: int) -> list[Message | None] | None:
        """:meth:`read_ahead`: the records read, decoded (None for an unreadable one), or None
        when the disk held none."""
        backend = self.backend
        if not backend.depth:
            return None
        first = backend.read_seq
        records = backend.read_many(max(1, min(want, REFILL_BATCH)))
        if not records:
            return None
        acks = self.acks
        memory = self.ready.memory
        ticket = acks.issue(len(records))
        if not self._offset_known:
            self._offset, self._offset_known = first - ticket, True
        elif self._offset is not None and self._offset != first - ticket:
            self._offset = None  # records were lost to damage: numbers are no longer certain
        wall = now_ns()
        later: list[Message] = []  # records with a due time, for the deferred store
        dropped = False
        msgs = decode_each(records, log, self.ready.where)
        if self.leftovers.pending(first):
            self.leftovers.drop(records, msgs, first)
        for msg in msgs:
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
        return msgs

    def _superseded(self, msg: Message) -> bool:
        """Whether a newer copy of ``msg`` waits deferred or buried.

        A REQ with a delay or a burial writes the message's new record to a
        store before its old records are committed away; a crash in between
        leaves both, and the old ones must not undo the deferral or the burial.
        The newer copy has at least as many attempts. (Once the deferred copy
        is due and back in the queue, ``leftovers`` still knows it.)
        """
        held = self.deferred.get(msg.id) or self.buried.messages.get(msg.id)
        return held is not None and held.attempts >= msg.attempts

    # ---------------------------------------------------------------- commits and end

    async def wait_durable(self) -> None:
        await self.group.wait()
        await self.deferred_store.group.wait()

    async def close(self, in_flight: list[Message]) -> int:
        """Append the messages in memory and in flight once more and commit every record read so far.

        Deferred and buried messages are records of their stores already; a
        graceful restart then delivers each live message once, without the
        duplicates a crash would cause. When the disk refuses (full), nothing is
        committed: every message is still a record read but not committed, so
        the next start delivers it again; none is lost (returns 0).
        """
        buried = self.buried.store
        assert buried is not None
        stores = [buried, self.deferred_store]
        live = list(self.ready.memory)
        live.extend(in_flight)
        try:
            buried.settle(list(self.buried.messages.values()))
            self.deferred_store.settle(self.deferred.values())
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
                      "next start delivers the %d messages in memory or in flight again", self.where, exc,
                      len(live))
        await close_all(self.queues(), f"channel {self.where}")
        return 0

    def empty(self) -> None:
        super().empty()
        self.acks.reset()
        self._offset, self._offset_known = None, False
        self.leftovers.forget()
        self._origins.clear()
        self.deferred_store.clear()

