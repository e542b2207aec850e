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
"""

from __future__ import annotations

import logging
import random
from collections import deque
from typing import TYPE_CHECKING

import trio

from .inflight import TimerHeap
from .message import Message, decode, encode, now_ns
from .protocol import ProtocolError, is_ephemeral

if TYPE_CHECKING:
    from .client import Client
    from .topic import Topic

__all__ = ["Channel"]

log = logging.getLogger("pynsqd.channel")

#: Records pulled from disk into memory per refill at most.
REFILL_BATCH = 1024


def _deadline_of(msg: Message) -> float:
    return msg.deadline


def _failed(code: str, verb: str, msg_id: bytes, reason: bytes) -> ProtocolError:
    """nsqd's non-fatal ``E_<VERB>_FAILED <VERB> <id> failed <reason>``, id bytes as sent."""
    return ProtocolError.with_raw_description(code, verb.encode() + b" " + msg_id + b" failed " + reason, fatal=False)


class Channel:
    """A named channel of a topic; owned by its :class:`~broker.topic.Topic`.

    Owns its disk queue (None when ephemeral), its in-flight and deferred
    heaps, and the list of subscribed clients.
    """

    def __init__(self, topic: "Topic", name: str):
        self.topic = topic
        self.name = name
        self.ephemeral = is_ephemeral(name)
        broker = topic.broker
        self.broker = broker
        self.options = broker.options
        self.mem_limit = self.options.mem_queue_size
        self.memory: deque[Message] = deque()
        self.backend = None if self.ephemeral else broker.open_backend(f"{topic.name}:{name}")
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
        self._cancel_scope = trio.CancelScope()
        if self.backend is not None:
            broker.restore_deferred(self)

    # ---------------------------------------------------------------- lifecycle

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run the disk queue's sync policy until the channel is closed."""
        with self._cancel_scope:
            task_status.started()
            if self.backend is not None:
                await self.backend.run()
            else:
                await trio.sleep_forever()

    def load_deferred(self, records: list[bytes]) -> None:
        """Restore deferred messages written by :meth:`flush` before a restart."""
        for record in records:
            msg = decode(record)
            self._defer_until(msg, msg.due_ns)

    def flush_records(self) -> tuple[list[bytes], list[bytes]]:
        """Everything the channel holds in memory, as disk records, for shutdown.

        Returns ``(ready, deferred)``: ready messages in delivery order (memory
        first, then in-flight, which become ready again after a restart with
        their attempts kept) and deferred messages with their due times.
        """
        ready = [encode(m) for m in self.memory]
        ready.extend(encode(m) for m in self._in_flight_timers.live())
        deferred = [encode(m) for m in self._deferred_timers.live()]
        return ready, deferred

    def close(self) -> None:
        """Stop the background task; the owner closes the disk queue."""
        self.exiting = True
        self._cancel_scope.cancel()

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

    def put_deferred(self, msg: Message) -> None:
        """Accept a message from the topic that must wait until ``msg.due_ns``."""
        self.message_count += 1
        if msg.due_ns <= now_ns():
            msg.due_ns = 0
            self._enqueue([msg])
            self.dispatch()
        else:
            self._defer_until(msg, msg.due_ns)

    def _defer_until(self, msg: Message, due_ns: int) -> None:
        msg.due_ns = due_ns
        msg.deadline = trio.current_time() + max(0, due_ns - now_ns()) / 1e9
        msg.client = None
        self.deferred[msg.id] = msg
        self._deferred_timers.push(msg.deadline, msg)

    def _enqueue(self, msgs: list[Message]) -> None:
        """Append ready messages: memory while it has room and disk holds nothing unread."""
        backend = self.backend
        memory = self.memory
        if backend is not None and backend.depth:
            backend.put_many([encode(m) for m in msgs])
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
        backend.put_many([encode(m) for m in msgs])

    def _refill(self, want: int) -> bool:
        """Move up to ``want`` records from disk to memory; False if disk is empty."""
        backend = self.backend
        if backend is None or not backend.depth:
            return False
        records = backend.read_many(max(1, min(want, REFILL_BATCH)))
        if not records:
            return False
        wall = now_ns()
        for record in records:
            try:
                msg = decode(record)
            except ValueError as exc:
                log.error("channel %s:%s: skipping unreadable record: %s", self.topic.name, self.name, exc)
                continue
            if msg.due_ns > wall:
                self._defer_until(msg, msg.due_ns)
            else:
                msg.due_ns = 0
                self.memory.append(msg)
        return True

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

    def _deliver(self, client: "Client", n: int, now: float) -> None:
        memory = self.memory
        in_flight = self.in_flight
        timers = self._in_flight_timers
        deadline = now + client.msg_timeout
        sample_rate = client.sample_rate
        dead_letter = self.topic.broker.dead_letter
        for _ in range(n):
            msg = memory.popleft()
            if sample_rate and random.randrange(100) >= sample_rate:
                continue
            if dead_letter is not None and dead_letter.should_bury(self, msg):
                continue
            msg.attempts += 1
            msg.client = client
            msg.deadline = deadline
            msg.delivered_at = now
            in_flight[msg.id] = msg
            timers.push(deadline, msg)
            client.send_message(msg)

    # ---------------------------------------------------------------- client commands

    def _owned(self, client: "Client", msg_id: bytes, verb: str, code: str) -> Message:
        """The in-flight message ``msg_id`` of ``client``, or nsqd's non-fatal error."""
        msg = self.in_flight.get(msg_id)
        if msg is None:
            raise _failed(code, verb, msg_id, b"ID not in flight")
        if msg.client is not client:
            raise _failed(code, verb, msg_id, b"client does not own message")
        return msg

    def _pop_in_flight(self, client: "Client", msg_id: bytes, verb: str, code: str) -> Message:
        msg = self._owned(client, msg_id, verb, code)
        del self.in_flight[msg_id]
        msg.client = None
        client.in_flight_count -= 1
        return msg

    def finish(self, client: "Client", msg_id: bytes) -> None:
        """FIN: the message is done. Raises the non-fatal ``E_FIN_FAILED``."""
        msg = self._pop_in_flight(client, msg_id, "FIN", "E_FIN_FAILED")
        client.finish_count += 1
        self.e2e.record(now_ns() - msg.timestamp)
        self.topic.e2e.record(now_ns() - msg.timestamp)

    def requeue(self, client: "Client", msg_id: bytes, delay_ms: int) -> None:
        """REQ: back to the queue now, or after ``delay_ms``. Raises ``E_REQ_FAILED``."""
        if self.exiting:
            raise _failed("E_REQ_FAILED", "REQ", msg_id, b"exiting")
        msg = self._pop_in_flight(client, msg_id, "REQ", "E_REQ_FAILED")
        client.requeue_count += 1
        self.requeue_count += 1
        if delay_ms > 0:
            self._defer_until(msg, now_ns() + delay_ms * 1_000_000)
        else:
            self._enqueue([msg])

    def touch(self, client: "Client", msg_id: bytes) -> None:
        """TOUCH: restart the timeout, never past delivery + max-msg-timeout."""
        msg = self._owned(client, msg_id, "TOUCH", "E_TOUCH_FAILED")
        now = trio.current_time()
        deadline = min(now + client.msg_timeout, msg.delivered_at + self.options.max_msg_timeout)
        if deadline != msg.deadline:
            msg.deadline = deadline
            self._in_flight_timers.push(deadline, msg)

    # ---------------------------------------------------------------- subscribers

    def add_client(self, client: "Client") -> None:
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

    def remove_client(self, client: "Client") -> None:
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

    # ---------------------------------------------------------------- admin

    def pause(self) -> None:
        self.paused = True

    def unpause(self) -> None:
        self.paused = False
        self.dispatch()

    def empty(self) -> None:
        """Drop every ready, in-flight and deferred message (``/channel/empty``)."""
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
        for client in self.clients:
            client.wake_writer()
        self.dispatch()
