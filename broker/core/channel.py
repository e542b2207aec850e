"""A channel: one consumer group's copy of a topic's messages.

Ready messages live in a bounded memory deque that spills into the channel's
disk queue. Spilling is sticky: once the disk queue holds unread records every
new message goes behind them, so a channel delivers in the order messages
arrived (requeues and timeouts go to the tail). The memory deque is refilled
from disk in batches as clients consume.

Delivery is synchronous: whenever something changes that could let a message
move (a put, RDY, FIN, a new subscriber, unpause, a timeout) the owner calls
:meth:`Channel.dispatch`, which hands every ready message that fits into the
subscribers' RDY windows (``in_flight < rdy``), round robin, and queues the
frames in each client's output buffer. Popping from the queue and recording
the message as in flight is one synchronous step, so no lock is needed.

Dead letters: with a maximum number of attempts (``--max-attempts`` or the
channel's own setting) a message that would be delivered once more than that
is moved to the channel's buried set (:mod:`broker.core.deadletter`) instead.

Durable mode (``--durable``) keeps every message of a non-ephemeral channel on
disk until it is finished:

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

Disk cost of durable mode: a record is freed only when every older record of
its queue is retired, so one message that stays in flight for a long time
keeps the segments written after it (at most ``--max-msg-timeout``); deferred
messages live in their own store, which compacts itself, so long deferrals do
not pin the channel's queue.
"""

from __future__ import annotations

import heapq
import logging
import random
from collections import deque
from typing import TYPE_CHECKING

import trio

from broker.core.deadletter import BuriedSet
from broker.core.durability.ackfloor import AckFloor
from broker.core.durability.groupcommit import GroupCommit
from broker.core.durability.ledger import CommitLedger
from broker.core.durability.parked import ParkedStore
from broker.core.latency import LatencyHistogram
from broker.core.message import Message, decode, encode, now_ns
from broker.core.timers import TimerHeap
from broker.protocol import ProtocolError, is_ephemeral
from diskqueue import DiskQueueError

if TYPE_CHECKING:
    from broker.core.topic import Topic
    from broker.server.connection import Client

__all__ = ["Channel"]

log = logging.getLogger("pynsqd.channel")

#: Records pulled from disk into memory per refill at most.
REFILL_BATCH = 1024
#: Seconds before a replacement write that failed is tried again (durable mode).
RETRY_DELAY = 1.0


def _deadline_of(msg: Message) -> float:
    return msg.deadline


def _failed(code: str, verb: str, msg_id: bytes, reason: bytes) -> ProtocolError:
    """nsqd's non-fatal ``E_<VERB>_FAILED <VERB> <id> failed <reason>``, id bytes as sent."""
    return ProtocolError.with_raw_description(code, verb.encode() + b" " + msg_id + b" failed " + reason, fatal=False)


class Channel:
    """A named channel of a topic; owned by its :class:`~broker.core.topic.Topic`.

    Owns its disk queue (None when ephemeral), in durable mode its deferred
    store, its buried set and store, its in-flight and deferred heaps, and the
    list of subscribed clients.
    """

    def __init__(self, topic: Topic, name: str):
        self.topic = topic
        self.name = name
        self.ephemeral = is_ephemeral(name)
        broker = topic.broker
        self.broker = broker
        self.options = broker.options
        self.mem_limit = self.options.mem_queue_size
        self.durable = self.options.durable and not self.ephemeral
        self.memory: deque[Message] = deque()
        self.backend = None if self.ephemeral else broker.open_backend(f"{topic.name}:{name}",
                                                                        auto_commit=not self.durable)
        self.in_flight: dict[bytes, Message] = {}
        self.deferred: dict[bytes, Message] = {}
        self._in_flight_timers = TimerHeap(_deadline_of, lambda m: self.in_flight.get(m.id) is m)
        self._deferred_timers = TimerHeap(_deadline_of, lambda m: self.deferred.get(m.id) is m)
        self.clients: list[Client] = []
        self._rr = 0
        self.paused = False
        self.exiting = False
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.dropped_count = 0
        self.e2e = broker.new_latency_stream()
        self.fin_latency = LatencyHistogram()
        self.max_attempts: int | None = None  # this channel's own setting; None follows --max-attempts
        self.bury_after = self.options.max_attempts  # the limit in force (0: never bury)
        self.buried = BuriedSet(None if self.ephemeral else ParkedStore(
            broker.open_backend(broker.store_name(self, "buried"), auto_commit=False)))
        # durable mode: the ack floor and group commit of the channel's queue, the deferred store
        self._acks: AckFloor | None = None
        self.group: GroupCommit | None = None
        self._deferred_store: ParkedStore | None = None
        floors = []
        if self.durable:
            self._acks = AckFloor()
            self.group = GroupCommit(self.backend)
            # the store a shutdown without --durable writes deferred messages to, kept live
            self._deferred_store = ParkedStore(broker.open_backend(broker.store_name(self, "deferred"),
                                                                   auto_commit=False))
            floors += [(self._acks, self.backend), (self._deferred_store.acks, self._deferred_store.queue)]
        if self.buried.store is not None:
            floors.append((self.buried.store.acks, self.buried.store.queue))
        self.ledger = CommitLedger(floors, broker.disk_failed)
        self._cancel_scope = trio.CancelScope()
        if self.backend is not None:
            self.buried.restore()
            if self.durable:
                self._restore_deferred_store()
            else:
                broker.restore_deferred(self)

    # ---------------------------------------------------------------- lifecycle

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run the disk queues' sync policies and the commit task until the channel is closed."""
        with self._cancel_scope:
            async with trio.open_nursery() as nursery:
                for queue in self._queues():
                    nursery.start_soon(queue.run)
                if self.backend is not None:
                    nursery.start_soon(self.ledger.run)
                task_status.started()

    def _queues(self) -> list:
        queues = [] if self.backend is None else [self.backend, self.buried.store.queue]
        if self._deferred_store is not None:
            queues.append(self._deferred_store.queue)
        return queues

    def close(self) -> None:
        """Stop the background tasks; the owner closes the disk queues."""
        self.exiting = True
        self._cancel_scope.cancel()

    def load_deferred(self, records: list[bytes]) -> None:
        """Restore deferred messages written by :meth:`flush_records` before a restart."""
        for record in records:
            msg = decode(record)
            self._defer_until(msg, msg.due_ns)

    def flush_records(self) -> tuple[list[bytes], list[bytes]]:
        """Everything the channel holds in memory, as disk records, for a shutdown without ``--durable``.

        Returns ``(ready, deferred)``: ready messages in delivery order (memory
        first, then in-flight, which become ready again after a restart with
        their attempts kept) and deferred messages with their due times.
        """
        ready = [encode(m) for m in self.memory]
        ready.extend(encode(m) for m in self._in_flight_timers.live())
        deferred = [encode(m) for m in self._deferred_timers.live()]
        return ready, deferred

    async def close_queues(self) -> None:
        """Shutdown: make the disk state final and close every queue of the channel.

        Without ``--durable`` memory and in-flight messages are appended to the
        queue and deferred ones written to a store read back at start-up. In
        durable mode they are all records already; the messages in memory and
        in flight are appended once more and every record read so far is
        committed, so a graceful restart delivers each live message once,
        without the duplicates a crash would cause.
        """
        if self.backend is None:
            return
        stores = [self.buried.store]
        self.buried.store.settle(list(self.buried.messages.values()))
        if not self.durable:
            ready, deferred = self.flush_records()
            if ready:
                self.backend.put_many(ready)
            if deferred:
                await self.broker.save_deferred(self, deferred)
            log.info("channel %s:%s: wrote %d ready and %d deferred messages to disk",
                     self.topic.name, self.name, len(ready), len(deferred))
        else:
            stores.append(self._deferred_store)
            self._deferred_store.settle(list(self.deferred.values()))
            live = list(self.memory)
            live.extend(self._in_flight_timers.live())
            if live:
                self.backend.put_many([encode(m) for m in live])
            # replacements first, on stable storage in every queue; then the commits
            for queue in self._queues():
                await queue.sync()
            self.backend.commit()
            self._acks.reset()
        for store in stores:
            store.commit()
        for queue in self._queues():
            await queue.close()

    def delete_queues(self) -> None:
        """Remove every file of the channel (it was deleted)."""
        for queue in self._queues():
            queue.delete()
        self.broker.delete_deferred_store(self)

    # ---------------------------------------------------------------- committing (durable mode)

    def _retire(self, msgs) -> None:
        """Mark the records of ``msgs`` (read from this channel's queue) done."""
        done = self._acks.done
        for msg in msgs:
            done(msg.ticket)
        self.ledger.wake()

    async def wait_durable(self) -> None:
        """Return once everything written to the channel's ready and deferred queues is durable.

        The topic waits for this before it commits the records it fanned out.
        """
        await self.group.wait()
        await self._deferred_store.group.wait()

    # ---------------------------------------------------------------- queueing

    @property
    def depth(self) -> int:
        """Ready messages: memory plus unread disk records (not in-flight, not deferred)."""
        return len(self.memory) + (self.backend.depth if self.backend is not None else 0)

    @property
    def backend_depth(self) -> int:
        return self.backend.depth if self.backend is not None else 0

    def put_many(self, msgs: list[Message]) -> None:
        """Accept a batch of new messages from the topic and deliver what fits."""
        self.message_count += len(msgs)
        self._enqueue(msgs)
        self.dispatch()

    def put_records(self, records: list[bytes]) -> None:
        """Durable mode: accept ready records fanned out by the topic, as they are.

        Raises the queue's ``DiskQueueError``; the topic then keeps its own
        records uncommitted, so they are fanned out again after a restart.
        """
        self.backend.put_many(records)
        self.message_count += len(records)
        self.dispatch()

    def put_deferred(self, msg: Message) -> None:
        """Accept a message from the topic that must wait until ``msg.due_ns``."""
        self.message_count += 1
        if msg.due_ns <= now_ns():
            msg.due_ns = 0
            self._enqueue([msg])
            self.dispatch()
        elif self._deferred_store is not None:
            self._store_deferred([msg], msg.due_ns)
        else:
            self._defer_until(msg, msg.due_ns)

    def _defer_until(self, msg: Message, due_ns: int) -> None:
        msg.due_ns = due_ns
        msg.deadline = trio.current_time() + max(0, due_ns - now_ns()) / 1e9
        msg.client = None
        old = self.deferred.get(msg.id)
        if old is not None and old is not msg and self._deferred_store is not None:
            # a second copy of the same message (re-delivered after a crash): keep one
            self._deferred_store.remove(old)
        self.deferred[msg.id] = msg
        self._deferred_timers.push(msg.deadline, msg)

    def _store_deferred(self, msgs: list[Message], due_ns: int | None = None) -> bool:
        """Durable mode: write ``msgs`` to the deferred store, then hold them until due.

        ``due_ns`` overrides each message's own due time. Messages that held a
        ticket of the channel's queue have it retired once the store has
        their record. Returns False (nothing moved) if the write failed.
        """
        old = [m.ticket for m in msgs]
        saved = [m.due_ns for m in msgs]
        if due_ns is not None:
            for msg in msgs:
                msg.due_ns = due_ns
        try:
            self._deferred_store.add(msgs)
        except DiskQueueError as exc:
            self.broker.disk_failed(exc)
            for msg, ticket, due in zip(msgs, old, saved):
                msg.ticket, msg.due_ns = ticket, due
            return False
        done = self._acks.done
        for msg, ticket in zip(msgs, old):
            done(ticket)
            self._defer_until(msg, msg.due_ns)
        self.ledger.replaced(self._deferred_store.group)
        return True

    def _restore_deferred_store(self) -> None:
        msgs = self._deferred_store.load()
        wall = now_ns()
        due = [m for m in msgs if m.due_ns <= wall]
        for msg in msgs:
            if msg.due_ns > wall:
                self._defer_until(msg, msg.due_ns)
        if due:
            self._release_due(due)
        log.info("channel %s:%s: %d deferred messages in the store", self.topic.name, self.name, len(msgs))

    def _enqueue(self, msgs: list[Message]) -> None:
        """Append ready messages: memory while it has room and disk holds nothing unread."""
        backend = self.backend
        memory = self.memory
        if backend is not None and (backend.depth or self.durable):
            self._spill(msgs)
            return
        room = self.mem_limit - len(memory)
        if room >= len(msgs):
            memory.extend(msgs)
            return
        if room > 0:
            memory.extend(msgs[:room])
            msgs = msgs[room:]
        if backend is None:
            self.dropped_count += len(msgs)
            return
        self._spill(msgs)

    def _spill(self, msgs: list[Message]) -> None:
        """Write ``msgs`` to the disk queue.

        In durable mode a failed write raises (the caller still holds the
        messages' records). Otherwise the messages stay in memory past the
        limit: a full or broken disk slows nothing down and loses nothing
        until the process ends.
        """
        try:
            self.backend.put_many([encode(m) for m in msgs])
        except DiskQueueError as exc:
            if self.durable:
                raise
            self.broker.disk_failed(exc)
            self.memory.extend(msgs)

    def _append_ready(self, msgs: list[Message]) -> bool:
        """Durable mode: append ``msgs`` as new ready records; False if the write failed."""
        for msg in msgs:
            msg.due_ns = 0
        try:
            self.backend.put_many([encode(m) for m in msgs])
        except DiskQueueError as exc:
            self.broker.disk_failed(exc)
            return False
        self.ledger.replaced(self.group)
        return True

    def _refill(self, want: int) -> bool:
        """Move up to ``want`` records from disk to memory; False if disk is empty."""
        backend = self.backend
        if backend is None or not backend.depth:
            return False
        records = backend.read_many(max(1, min(want, REFILL_BATCH)))
        if not records:
            return False
        acks = self._acks
        ticket = acks.issue(len(records)) if acks is not None else -1
        wall = now_ns()
        later: list[Message] = []  # durable mode: records with a due time, for the deferred store
        dropped = False
        for record in records:
            try:
                msg = decode(record)
            except ValueError as exc:
                log.error("channel %s:%s: skipping unreadable record: %s", self.topic.name, self.name, exc)
                if acks is not None:
                    acks.done(ticket)
                    ticket += 1
                    dropped = True
                continue
            if acks is not None:
                msg.ticket = ticket
                ticket += 1
                if self._superseded(msg):
                    acks.done(msg.ticket)
                    dropped = True
                    continue
            if msg.due_ns > wall:
                if acks is None:
                    self._defer_until(msg, msg.due_ns)
                else:
                    later.append(msg)
            else:
                msg.due_ns = 0
                self.memory.append(msg)
        if later and not self._store_deferred(later):
            self.memory.extend(later)  # the store refused them: deliver now rather than drop
        if dropped:
            self.ledger.wake()
        return True

    def _superseded(self, msg: Message) -> bool:
        """Durable mode: whether a newer copy of ``msg`` waits deferred or buried.

        A REQ with a delay or a burial writes the message's new record to a
        store before its old record is committed away; a crash in between
        leaves both, and the old one must not undo the deferral or the burial.
        The newer copy has at least as many attempts.
        """
        held = self.deferred.get(msg.id) or self.buried.messages.get(msg.id)
        return held is not None and held.attempts >= msg.attempts

    # ---------------------------------------------------------------- delivery

    def dispatch(self) -> None:
        """Hand ready messages to subscribers with room in their RDY window."""
        if self.paused or not self.clients or self.exiting:
            return
        ready = [c for c in self.clients if c.ready_for_more()]
        if not ready:
            return
        if len(ready) > 1:
            self._rr = (self._rr + 1) % len(ready)
            ready = ready[self._rr:] + ready[:self._rr]
        memory = self.memory
        now = trio.current_time()
        touched = []
        while ready:
            if not memory:
                if not self._refill(sum(c.rdy - c.in_flight_count for c in ready)):
                    break
                continue
            share = max(1, len(memory) // len(ready))
            for client in ready:
                n = min(client.rdy - client.in_flight_count, share, len(memory))
                if n <= 0:
                    break
                self._deliver(client, n, now)
                touched.append(client)
            ready = [c for c in ready if c.ready_for_more()]
        for client in touched:
            client.wake_writer()

    def _deliver(self, client: Client, n: int, now: float) -> None:
        memory = self.memory
        in_flight = self.in_flight
        timers = self._in_flight_timers
        deadline = now + client.msg_timeout
        sample_rate = client.sample_rate
        bury_after = self.bury_after
        durable = self.durable
        dead = None
        sent = []
        for _ in range(n):
            msg = memory.popleft()
            if sample_rate and random.randrange(100) >= sample_rate:
                if durable:
                    self._retire((msg,))
                continue
            if durable and msg.id in in_flight:
                # A copy of a message already in flight: a crash left both records.
                # The copy in flight keeps (or replaces) its own record; drop this one.
                self._retire((msg,))
                continue
            if bury_after and msg.attempts >= bury_after:
                if dead is None:
                    dead = []
                dead.append(msg)
                continue
            msg.attempts += 1
            msg.client = client
            msg.deadline = deadline
            msg.delivered_at = now
            in_flight[msg.id] = msg
            sent.append(msg)
        client.send_messages(sent)
        timers.push_many(deadline, sent)
        if dead:
            self._bury(dead)

    def _bury(self, msgs: list[Message]) -> None:
        """Move messages that used up their attempts to the buried set."""
        old = [m.ticket for m in msgs]
        try:
            self.buried.bury(msgs)
        except DiskQueueError as exc:
            # kept in memory all the same; in durable mode their records stay unretired
            self.broker.disk_failed(exc)
            return
        log.info("channel %s:%s: buried %d message(s) after %d attempts",
                 self.topic.name, self.name, len(msgs), self.bury_after)
        if self._acks is not None:
            done = self._acks.done
            for ticket in old:
                done(ticket)
            self.ledger.replaced(self.buried.store.group)

    # ---------------------------------------------------------------- client commands

    def _owned(self, client: Client, msg_id: bytes, verb: str, code: str) -> Message:
        """The in-flight message ``msg_id`` of ``client``, or nsqd's non-fatal error."""
        msg = self.in_flight.get(msg_id)
        if msg is None:
            raise _failed(code, verb, msg_id, b"ID not in flight")
        if msg.client is not client:
            raise _failed(code, verb, msg_id, b"client does not own message")
        return msg

    def _pop_in_flight(self, client: Client, msg_id: bytes, verb: str, code: str) -> Message:
        msg = self._owned(client, msg_id, verb, code)
        del self.in_flight[msg_id]
        msg.client = None
        client.in_flight_count -= 1
        return msg

    def finish_many(self, client: Client, msg_ids: list[bytes]) -> list[ProtocolError]:
        """FIN: a run of consecutive FIN commands, with one clock read.

        Returns the non-fatal ``E_FIN_FAILED`` errors of the ids that were not
        in flight for ``client``, in order; the others are done.
        """
        in_flight = self.in_flight
        acks = self._acks
        errors = []
        latencies = []
        now = now_ns()
        for msg_id in msg_ids:
            msg = in_flight.get(msg_id)
            if msg is None or msg.client is not client:
                reason = b"ID not in flight" if msg is None else b"client does not own message"
                errors.append(_failed("E_FIN_FAILED", "FIN", msg_id, reason))
                continue
            del in_flight[msg_id]
            msg.client = None
            if acks is not None:
                acks.done(msg.ticket)
            latencies.append(now - msg.timestamp)
        if latencies:
            done = len(latencies)
            client.in_flight_count -= done
            client.finish_count += done
            if acks is not None:
                self.ledger.wake()
            self.e2e.record_many(latencies)
            self.topic.e2e.record_many(latencies)
            self.fin_latency.observe_many(latencies)
        return errors

    def requeue(self, client: Client, msg_id: bytes, delay_ms: int) -> None:
        """REQ: back to the queue now, or after ``delay_ms``. Raises ``E_REQ_FAILED``."""
        if self.exiting:
            raise _failed("E_REQ_FAILED", "REQ", msg_id, b"exiting")
        if self.durable:
            self._requeue_durable(client, msg_id, delay_ms)
            return
        msg = self._pop_in_flight(client, msg_id, "REQ", "E_REQ_FAILED")
        client.requeue_count += 1
        self.requeue_count += 1
        if delay_ms > 0:
            self._defer_until(msg, now_ns() + delay_ms * 1_000_000)
        else:
            self._enqueue([msg])

    def _requeue_durable(self, client: Client, msg_id: bytes, delay_ms: int) -> None:
        msg = self._owned(client, msg_id, "REQ", "E_REQ_FAILED")
        # the replacement record is written first; if that fails the message stays in flight
        if delay_ms > 0:
            saved = self.in_flight.pop(msg_id)
            if not self._store_deferred([msg], now_ns() + delay_ms * 1_000_000):
                self.in_flight[msg_id] = saved
                raise _failed("E_REQ_FAILED", "REQ", msg_id, b"disk write failed")
        else:
            if not self._append_ready([msg]):
                raise _failed("E_REQ_FAILED", "REQ", msg_id, b"disk write failed")
            self.in_flight.pop(msg_id)
            self._retire((msg,))
        msg.client = None
        client.in_flight_count -= 1
        client.requeue_count += 1
        self.requeue_count += 1

    def touch(self, client: Client, msg_id: bytes) -> None:
        """TOUCH: restart the timeout, never past delivery + max-msg-timeout."""
        msg = self._owned(client, msg_id, "TOUCH", "E_TOUCH_FAILED")
        now = trio.current_time()
        deadline = min(now + client.msg_timeout, msg.delivered_at + self.options.max_msg_timeout)
        if deadline != msg.deadline:
            msg.deadline = deadline
            self._in_flight_timers.push(deadline, msg)

    # ---------------------------------------------------------------- subscribers

    def add_client(self, client: Client) -> None:
        """Subscribe ``client``. Raises fatal ``E_SUB_FAILED`` past --max-channel-consumers."""
        limit = self.options.max_channel_consumers
        if self.exiting:
            raise ProtocolError("E_SUB_FAILED", "SUB failed channel is exiting")
        if limit and len(self.clients) >= limit:
            raise ProtocolError(
                "E_SUB_FAILED",
                f"SUB failed consumers for {self.topic.name}:{self.name} exceeds limit of {limit}",
            )
        self.clients.append(client)

    def remove_client(self, client: Client) -> None:
        """Unsubscribe; its in-flight messages time out as in nsqd. An ephemeral
        channel goes away with its last client."""
        try:
            self.clients.remove(client)
        except ValueError:
            return
        if self.ephemeral and not self.clients and not self.exiting:
            self.topic.delete_channel(self.name)

    # ---------------------------------------------------------------- timers

    def process_timers(self) -> bool:
        """Requeue expired in-flight messages and release due deferred ones.

        Returns True if anything moved. Called by the broker's scanner task.
        """
        now = trio.current_time()
        expired = self._in_flight_timers.pop_due(now)
        for msg in expired:
            del self.in_flight[msg.id]
            client = msg.client
            msg.client = None
            if client is not None:
                client.in_flight_count -= 1
                client.timeout_count += 1
            self.timeout_count += 1
        due = self._deferred_timers.pop_due(now)
        for msg in due:
            del self.deferred[msg.id]
            msg.due_ns = 0
        if self.durable:
            if expired:
                if self._append_ready(expired):
                    self._retire(expired)
                else:  # keep them (and their records) until the disk takes a write again
                    self._hold(expired, now + RETRY_DELAY)
            if due:
                self._release_due(due)
        else:
            if expired:
                self._enqueue(expired)
            if due:
                self._enqueue(due)
        self._in_flight_timers.compact(len(self.in_flight))
        self._deferred_timers.compact(len(self.deferred))
        if expired or due:
            self.dispatch()
            return True
        return False

    def _hold(self, msgs: list[Message], deadline: float) -> None:
        """Keep timed-out messages in flight, owned by nobody, until ``deadline``."""
        for msg in msgs:
            msg.deadline = deadline
            self.in_flight[msg.id] = msg
            self._in_flight_timers.push(deadline, msg)

    def _release_due(self, msgs: list[Message]) -> None:
        """Durable mode: move due messages from the deferred store to the ready queue."""
        store = self._deferred_store
        if self._append_ready(msgs):
            store.remove_many(msgs)
            if store.wants_compaction():
                store.compact(list(self.deferred.values()))
        else:
            wall = now_ns() + int(RETRY_DELAY * 1e9)
            for msg in msgs:
                self._defer_until(msg, wall)

    # ---------------------------------------------------------------- dead letters

    def set_max_attempts(self, value: int | None) -> None:
        """Set this channel's maximum attempts (0 = never bury; None = follow ``--max-attempts``)."""
        self.max_attempts = value
        self.bury_after = self.options.max_attempts if value is None else value
        if not self.ephemeral:
            self.broker.metadata_changed()

    def kick(self, msg_id: bytes | None = None, n: int = 0) -> int:
        """Move the buried message ``msg_id``, or the ``n`` oldest, back to ready.

        Kicked messages start over with 0 attempts. Returns how many moved.
        """
        msgs = self.buried.take(msg_id, n)
        if not msgs:
            return 0
        for msg in msgs:
            msg.attempts = 0
        if self.durable:
            if not self._append_ready(msgs):
                self.buried.bury(msgs)  # the old records are retired already; write new ones
                return 0
        else:
            self._enqueue(msgs)
            self.ledger.wake()
        self.buried.kicked_count += len(msgs)
        self.dispatch()
        return len(msgs)

    async def persist_buried(self) -> None:
        """Make a kick or delete final on disk: commit what it retired and checkpoint the store.

        Raises the queues' ``DiskQueueError``.
        """
        store = self.buried.store
        if store is None:
            return
        store.settle(list(self.buried.messages.values()))
        await self.ledger.commit()
        await store.queue.sync()

    def delete_buried(self, msg_id: bytes | None = None, n: int = 0) -> int:
        """Drop the buried message ``msg_id``, or the ``n`` oldest. Returns how many went."""
        msgs = self.buried.take(msg_id, n)
        self.buried.deleted_count += len(msgs)
        if msgs:
            self.ledger.wake()
        return len(msgs)

    # ---------------------------------------------------------------- inspection

    def peek_ready(self, n: int) -> list[Message]:
        """The next ``n`` ready messages in delivery order (memory, then disk), unchanged."""
        out = list(self.memory) if len(self.memory) <= n else [self.memory[i] for i in range(n)]
        backend = self.backend
        if len(out) < n and backend is not None and backend.depth:
            for record in backend.peek_many(n - len(out)):
                try:
                    out.append(decode(record))
                except ValueError:
                    continue
        return out

    def peek_deferred(self, n: int) -> list[Message]:
        """The ``n`` deferred messages due first, unchanged."""
        return heapq.nsmallest(n, self.deferred.values(), key=lambda m: (m.due_ns, m.id))

    def peek_in_flight(self, n: int) -> list[Message]:
        """The ``n`` in-flight messages whose timeout comes first, unchanged."""
        return heapq.nsmallest(n, self.in_flight.values(), key=lambda m: (m.deadline, m.id))

    def peek_buried(self, n: int) -> list[Message]:
        """The ``n`` messages buried first, unchanged."""
        return self.buried.peek(n)

    # ---------------------------------------------------------------- admin

    def pause(self) -> None:
        self.paused = True

    def unpause(self) -> None:
        self.paused = False
        self.dispatch()

    def empty(self) -> None:
        """Drop every ready, in-flight and deferred message (``/channel/empty``); buried ones stay."""
        self.memory.clear()
        for msg in self.in_flight.values():
            if msg.client is not None:
                msg.client.in_flight_count -= 1
                msg.client = None
        self.in_flight.clear()
        self.deferred.clear()
        self._in_flight_timers.clear()
        self._deferred_timers.clear()
        if self.backend is not None:
            self.backend.empty()
        if self._acks is not None:
            self._acks.reset()
            self._deferred_store.clear()
        for client in self.clients:
            client.wake_writer()
        self.dispatch()
