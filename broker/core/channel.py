"""A channel: one consumer group's copy of a topic's messages.

Ready messages wait in a :class:`~broker.core.spill.SpillQueue` (memory, then
disk) and go out in the order they arrived (requeues and timeouts go to the
tail), or, once the topic has priorities, in (priority, arrival) order
(:mod:`broker.core.ranking`; the sweeps that takes run in a task of the channel,
:mod:`broker.core.sweeper`); in-flight and deferred messages are indexed by id and
ordered by their Trio-clock deadlines in a :class:`~broker.core.timers.TimerHeap` each.

Delivery is synchronous: whenever something changes that could let a message
move (a put, RDY, FIN, a new subscriber, unpause, a timeout) the owner calls
:meth:`Channel.dispatch`, which hands every ready message that fits into the
subscribers' RDY windows (``in_flight < rdy``), round robin, and queues the
frames in their output buffers, no more at once than a buffer's room (a client
whose socket does not drain gets nothing more). Popping from the queue and recording the
message as in flight is one synchronous step, so no lock is needed. A message
that would be delivered more than ``--max-attempts`` (or the channel's own
setting) times is buried instead (:mod:`broker.core.deadletter`).

Where messages are kept is the channel's *retention*, chosen once at
construction (:mod:`broker.core.retention`): memory only (ephemeral), memory
spilling to disk, or on disk until finished (``--durable``). The channel says
where a message goes (ready again, deferred, retired); the retention does it
and answers whether it could, without a reference back to the channel: what
it must hold back goes to the channel's deferred index
(:class:`~broker.core.deferred.Deferred`), which both share.

Delivery (:mod:`broker.core.delivery`), the lease commands (:mod:`broker.core.leasing`) and
the dead-letter commands (:mod:`broker.core.deadletter`) are base classes of the channel, in
their own modules.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable

import trio

from broker.core.deadletter import BuriedSet, DeadLetterCommands
from broker.core.deferred import Deferred
from broker.core.delivery import Delivery, Upstream
from broker.core.host import CoreHost, Subscriber
from broker.core.latency import LatencyHistogram, LatencyStream
from broker.core.leases import Leases
from broker.core.leasing import LeaseSettlement
from broker.core.message import Message, now_ns
from broker.core.retention import RETRY_DELAY, MemoryRetention, retention_for
from broker.core.spill import SharedBatch
from broker.core.sweeper import Sweeper
from broker.core.tasks import TaskSet
from broker.core.timers import TimerHeap
from broker.protocol import ProtocolError, command_failed, is_ephemeral
from diskqueue import DiskQueue

__all__ = ["Channel", "Upstream"]

log = logging.getLogger("pynsqd.channel")



class Channel(Delivery, LeaseSettlement, DeadLetterCommands):
    """A named channel of a topic; owned by its :class:`~broker.core.topic.Topic`.

    Owns its retention (queues and stores, the buried set), its in-flight
    messages (``in_flight_timers`` orders them by deadline), its deferred ones
    (``deferred``, shared with the retention) and the list of subscribers. ``topic_e2e`` is the
    topic's latency stream (a FIN counts there too); ``on_empty`` is called
    when an ephemeral channel loses its last subscriber; ``upstream`` is the topic,
    which may hold messages that already belong to the channel (its depth and
    counts include them).
    """

    def __init__(self, topic_name: str, name: str, host: CoreHost, *, topic_e2e: LatencyStream,
                 on_empty: Callable[[], None], upstream: Upstream):
        self.topic_name = topic_name
        self.name = name
        self.ephemeral = is_ephemeral(name)
        options = host.options
        self.options = options
        self._host = host
        self.in_flight: dict[bytes, Message] = {}
        armed = host.timed.add  # the broker's scanner visits only channels with timers
        self.in_flight_timers = TimerHeap(self.in_flight, lambda: armed(self))
        self.deferred = Deferred(lambda: armed(self))
        self.clients: list[Subscriber] = []
        self.leases = Leases()
        self._rr = 0
        self._all_full = False  # the last dispatch ended with no subscriber able to take more
        self.paused = False
        self.exiting = False
        self._upstream = upstream
        self.put_count = 0  # messages the topic handed over (see message_count)
        self.requeue_count = 0
        self.timeout_count = 0
        self.e2e = host.latency_stream()
        self._topic_e2e = topic_e2e
        self.fin_latency = LatencyHistogram()
        self.max_attempts: int | None = None  # this channel's own setting; None follows --max-attempts
        self.bury_after = options.max_attempts  # the limit in force (0: never bury)
        self._on_empty = on_empty
        self.tasks = TaskSet()
        self.retention: MemoryRetention = retention_for(self.where, host, self.deferred, ephemeral=self.ephemeral)
        self.ready = self.retention.ready
        self.memory = self.ready.memory
        self.buried: BuriedSet = self.retention.buried
        self.ranked = False
        self.sweeper = Sweeper(self.retention, self.tasks, self.dispatch)
        #: ids of messages another node took over (--replicas): skipped, not delivered
        self.taken: set[bytes] | None = None
        self.retention.restore()
        self.retention.start(self.tasks)

    @property
    def where(self) -> str:
        """``topic:channel``: the name of the channel's disk queue, and how logs name it."""
        return f"{self.topic_name}:{self.name}"

    def rank(self, default: int) -> None:
        """Deliver in (priority, arrival) order from now on (the topic has priorities);
        ``default`` is the priority of a message without one. What waits on disk is swept now
        (in the background: nothing goes out until the sweep is over)."""
        if self.ranked:
            return
        self.ranked = True
        self.ready.rank(default)
        self.memory = self.ready.memory
        self.sweeper.start()

    def priority_levels(self) -> list[tuple[int, int]]:
        """Ranked: ready messages per priority, most urgent first (what the topic holds for the
        channel is not counted: it holds only while nobody reads)."""
        return sorted(self.ready.levels().items()) if self.ranked else []

    # ---------------------------------------------------------------- lifecycle

    def start(self, nursery: trio.Nursery) -> None:
        """Run the retention's tasks (disk queue syncs, commits) in ``nursery`` (the topic's)
        until the channel is closed, each only once it has work: an idle channel costs none."""
        self.tasks.attach(nursery)

    def close(self) -> None:
        """Stop the background tasks; the owner closes the disk queues."""
        self.exiting = True
        self.tasks.close()

    async def close_queues(self) -> int:
        """Shutdown: make the disk state final and close every queue (see the retention);
        the number of messages that could not be written."""
        return await self.retention.close(self.in_flight_timers.live())

    def delete_queues(self) -> None:
        """Remove every file of the channel (it was deleted)."""
        self.retention.delete()

    async def wait_durable(self) -> None:
        """Return once everything written to the channel's queues is on stable storage.

        A durable topic waits for this before it commits the records it fanned out.
        """
        await self.retention.wait_durable()

    # ---------------------------------------------------------------- queueing

    @property
    def backend(self) -> DiskQueue | None:
        """The disk queue of ready messages (None when ephemeral)."""
        return self.ready.backend

    @backend.setter
    def backend(self, queue: DiskQueue | None) -> None:
        self.ready.backend = queue

    @property
    def depth(self) -> int:
        """Ready messages: the channel's own (memory and disk) and those its topic holds for it."""
        return self.ready.depth + self._upstream.held_for(self.name)[0]

    @property
    def backend_depth(self) -> int:
        """Ready messages on disk: in the channel's queue and in its topic's, held for it."""
        return self.ready.backend_depth + self._upstream.held_for(self.name)[1]

    @property
    def message_count(self) -> int:
        """Messages put into the channel since start, those its topic holds for it included."""
        return self.put_count + self._upstream.held_for(self.name)[0]

    @property
    def wants_messages(self) -> bool:
        """Whether someone could take messages now: a subscriber, and the channel not paused."""
        return bool(self.clients) and not self.paused and not self.exiting

    def put_many(self, msgs: list[Message], shared: SharedBatch | None = None) -> None:
        """Accept a batch of new messages from the topic and deliver what fits.

        ``shared``: the topic hands the same batch to other channels too (its messages are
        ``shared``), encoded for disk once for all of them.
        """
        self.put_count += len(msgs)
        self.ready.put(msgs, shared)
        self.dispatch()

    def put_records(self, records: list[bytes], number: int) -> None:
        """Accept records copied by a durable topic (deferred ones wait until due).

        ``number`` is the topic's number for the last record of the batch being
        copied (see :meth:`copied_through`). Raises the queue's
        ``DiskQueueError``; the topic then keeps its own records uncommitted, so
        they are fanned out again after a restart.
        """
        self.put_count += self.retention.put_records(records, number)
        self.dispatch()

    def copied_through(self) -> tuple[int, int]:
        """The numbers of the last plain and deferred records a durable topic copied here
        before a crash, as the channel's files say (-1 when they say nothing)."""
        return self.retention.copied_through()

    def put_deferred(self, msg: Message) -> None:
        """Accept a message from the topic that must wait until ``msg.due_ns``."""
        self.put_count += 1
        if msg.due_ns <= now_ns():
            msg.due_ns = 0
            self.ready.put([msg])
            self.dispatch()
        else:
            self.retention.defer([msg], msg.due_ns)

    # ---------------------------------------------------------------- client commands

    def _owned(self, client: Subscriber, msg_id: bytes, verb: str, code: str) -> Message:
        """The in-flight message ``msg_id`` of ``client``, or nsqd's non-fatal error."""
        msg = self.in_flight.get(msg_id)
        if msg is None:
            raise command_failed(code, verb, msg_id, b"ID not in flight")
        if msg.client is not client:
            raise command_failed(code, verb, msg_id, b"client does not own message")
        return msg

    def finish_many(self, client: Subscriber, msg_ids: list[bytes]) -> list[ProtocolError]:
        """FIN: a run of consecutive FIN commands, with one clock read.

        Returns the non-fatal ``E_FIN_FAILED`` errors of the ids that were not
        in flight for ``client``, in order; the others are done.
        """
        in_flight = self.in_flight
        errors = []
        finished = []
        for msg_id in msg_ids:
            msg = in_flight.get(msg_id)
            if msg is None or msg.client is not client:
                reason = b"ID not in flight" if msg is None else b"client does not own message"
                errors.append(command_failed("E_FIN_FAILED", "FIN", msg_id, reason))
                continue
            del in_flight[msg_id]
            msg.client = None
            finished.append(msg)
        if finished:
            done = len(finished)
            client.in_flight_count -= done
            client.finish_count += done
            self._retire_finished(finished)
        return errors

    def _retire_finished(self, finished: list[Message]) -> None:
        self._host.copies.finished(self.topic_name, self.name, finished)
        now = now_ns()
        latencies = [now - m.timestamp for m in finished]
        self.retention.retire(finished)
        self.e2e.record_many(latencies)
        self._topic_e2e.record_many(latencies)
        self.fin_latency.observe_many(latencies)

    def requeue(self, client: Subscriber, msg_id: bytes, delay_ms: int) -> None:
        """REQ: back to the queue now, or after ``delay_ms``. Raises ``E_REQ_FAILED``.

        The message leaves flight only once the retention has taken it (in
        durable mode, once its replacement record is written).
        """
        if self.exiting:
            raise command_failed("E_REQ_FAILED", "REQ", msg_id, b"exiting")
        msg = self._owned(client, msg_id, "REQ", "E_REQ_FAILED")
        del self.in_flight[msg_id]
        msg.client = None
        if not self._move_back([msg], delay_ms):
            msg.client = client
            self.in_flight[msg_id] = msg
            raise command_failed("E_REQ_FAILED", "REQ", msg_id, b"disk write failed")
        client.in_flight_count -= 1
        client.requeue_count += 1
        self.requeue_count += 1

    def touch(self, client: Subscriber, msg_id: bytes) -> None:
        """TOUCH: restart the timeout, never past delivery + max-msg-timeout."""
        self._extend([self._owned(client, msg_id, "TOUCH", "E_TOUCH_FAILED")], client.msg_timeout)

    def _extend(self, msgs: list[Message], msg_timeout: float) -> None:
        """Restart the timeouts of in-flight ``msgs``, never past delivery + max-msg-timeout."""
        now = trio.current_time()
        limit = self.options.max_msg_timeout
        for msg in msgs:
            deadline = min(now + msg_timeout, msg.delivered_at + limit)
            if deadline != msg.deadline:
                msg.deadline = deadline
                self.in_flight_timers.push(deadline, msg)

    def _move_back(self, msgs: list[Message], delay_ms: int) -> bool:
        """Out of flight (REQ, LEASE REQ): ready again now, or deferred ``delay_ms``; False if the
        retention could not take them (nothing moved)."""
        if delay_ms > 0:
            moved = self.retention.defer(msgs, now_ns() + delay_ms * 1_000_000)
        else:
            moved = self.retention.requeue(msgs)
        if moved:
            self._host.copies.requeued(self.topic_name, self.name, msgs)
        return moved

    # ---------------------------------------------------------------- subscribers

    def add_client(self, client: Subscriber) -> None:
        """Subscribe ``client``. Raises fatal ``E_SUB_FAILED`` past --max-channel-consumers."""
        limit = self.options.max_channel_consumers
        if self.exiting:
            raise ProtocolError("E_SUB_FAILED", "SUB failed channel is exiting")
        if limit and len(self.clients) >= limit:
            raise ProtocolError("E_SUB_FAILED", f"SUB failed consumers for {self.where} exceeds limit of {limit}")
        self.clients.append(client)
        if len(self.clients) == 1:
            self._upstream.demand_changed()

    def remove_client(self, client: Subscriber) -> None:
        """Unsubscribe; its in-flight messages time out as in nsqd. An ephemeral
        channel goes away with its last client."""
        try:
            self.clients.remove(client)
        except ValueError:
            return
        if self.ephemeral and not self.clients and not self.exiting:
            self._on_empty()

    # ---------------------------------------------------------------- timers

    def process_timers(self) -> bool:
        """Requeue expired in-flight messages and release due deferred ones.

        Returns True if anything moved. Called by the broker's scanner task.
        """
        now = trio.current_time()
        expired = self.in_flight_timers.pop_due(now)
        owners: dict[int, tuple[Subscriber, list[Message]]] = {}
        for msg in expired:
            del self.in_flight[msg.id]
            client = msg.client
            msg.client = None
            if client is not None:
                client.in_flight_count -= 1
                client.timeout_count += 1
                owners.setdefault(id(client), (client, []))[1].append(msg)
            self.timeout_count += 1
        for client, msgs in owners.values():
            # a frame still queued behind a write that did not progress never
            # reached the socket: that delivery was not an attempt
            for msg in client.unsent(msgs):
                msg.attempts -= 1
        due = self.deferred.pop_due(now)
        if expired:
            self._host.copies.requeued(self.topic_name, self.name, expired)
            if self.leases:
                self.leases.forget(expired)
            if not self.retention.requeue(expired):
                # keep them (and their records) until the disk takes a write again
                self._keep_in_flight_until(expired, now + RETRY_DELAY)
        if due:
            self.retention.release(due)
        self.in_flight_timers.compact(len(self.in_flight))
        self.deferred.compact()
        if expired or due:
            self.dispatch()
            return True
        return False

    # ---------------------------------------------------------------- inspection

    def peek_ready(self, n: int) -> list[Message]:
        """The next ``n`` ready messages in delivery order (memory, then disk, then what the
        topic holds for the channel), unchanged."""
        msgs = self.ready.peek(n)
        if len(msgs) < n:
            msgs.extend(self._upstream.peek_held(self.name, n - len(msgs)))
        return msgs

    def peek_deferred(self, n: int) -> list[Message]:
        """The ``n`` deferred messages due first, unchanged."""
        return heapq.nsmallest(n, self.deferred.values(), key=lambda m: (m.due_ns, m.id))

    def peek_in_flight(self, n: int) -> list[Message]:
        """The ``n`` in-flight messages whose timeout comes first, unchanged."""
        return heapq.nsmallest(n, self.in_flight.values(), key=lambda m: (m.deadline, m.id))

    # ---------------------------------------------------------------- admin

    def pause(self) -> None:
        self.paused = True

    def unpause(self) -> None:
        self.paused = False
        self._upstream.demand_changed()
        self.dispatch()

    def empty(self) -> None:
        """Drop every ready, in-flight and deferred message (``/channel/empty``); buried ones stay."""
        for msg in self.in_flight.values():
            if msg.client is not None:
                msg.client.in_flight_count -= 1
                msg.client = None
        self.in_flight.clear()
        self.leases.clear()
        self.deferred.clear()
        self.in_flight_timers.clear()
        self.retention.empty()
        self._upstream.channel_emptied(self.name)
        for client in self.clients:
            client.wake_writer()
        self.dispatch()
