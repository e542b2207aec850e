"""Delivery: how a channel hands its ready messages to its subscribers.

A base class of :class:`~broker.core.channel.Channel`, in its own module because it is the
hot path and reads best alone; what it uses of the channel is declared on it. Delivery is
synchronous: whenever something changes that could let a message move (a put, RDY, FIN, a
new subscriber, unpause, a timeout) the owner calls :meth:`Delivery.dispatch`, which hands
every ready message that fits into the subscribers' RDY windows (``in_flight < rdy``),
round robin, and queues the frames in their output buffers, no more at once than a
buffer's room (a client whose socket does not drain gets nothing more). Popping from the
queue and recording the message as in flight is one synchronous step, so no lock is needed.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from typing import Protocol

import trio

from broker.core.deadletter import BuriedSet
from broker.core.host import CoreHost, Subscriber
from broker.core.leases import Leases
from broker.core.message import Message
from broker.core.retention import RETRY_DELAY, MemoryRetention
from broker.core.spill import SpillQueue
from broker.core.sweeper import Sweeper
from broker.core.timers import TimerHeap
from broker.protocol import MESSAGE_HEADER_LENGTH

__all__ = ["Delivery", "Upstream", "MAX_RUN"]

log = logging.getLogger("pynsqd.channel")

#: A consumer with a wide RDY window takes the ready messages in runs of up to this many (a
#: quarter of its window at most), in turn: with many consumers a pass makes fewer, larger writes,
#: and over passes each consumer gets the same share (see :meth:`Delivery.dispatch`).
MAX_RUN = 64
#: A message frame's bytes besides the body: size and frame type, then the message header.
_FRAME_OVERHEAD = 8 + MESSAGE_HEADER_LENGTH


class Upstream(Protocol):
    """What a channel asks of its topic: the messages the topic holds for it (see
    :mod:`broker.core.fanout.plain`, "Holding"), and when it wants them handed over."""

    def held_for(self, channel: str) -> tuple[int, int]:
        """Messages the topic holds for ``channel``, and how many of them are on disk."""

    def peek_held(self, channel: str, n: int) -> list[Message]:
        """The first ``n`` messages held for ``channel``, in order, unchanged."""

    def demand_changed(self) -> None:
        """A channel gained a subscriber or was unpaused: held messages may have to move."""

    def channel_emptied(self, channel: str) -> None:
        """``channel`` was emptied: it must not get what is held for it now."""

    def moving(self) -> bool:
        """Whether the topic has messages its pump is about to hand over (a ranked channel
        waits for them: one of them may be more urgent than anything it has)."""


class Delivery:
    """The delivery of a channel; what it uses of it is declared here."""

    paused: bool
    exiting: bool
    ranked: bool
    clients: list[Subscriber]
    memory: deque[Message]
    ready: SpillQueue
    retention: MemoryRetention
    sweeper: Sweeper
    in_flight: dict[bytes, Message]
    in_flight_timers: TimerHeap
    leases: Leases
    buried: BuriedSet
    bury_after: int
    taken: set[bytes] | None
    topic_name: str
    name: str
    _host: CoreHost
    _upstream: Upstream
    _rr: int
    _all_full: bool

    @property
    def where(self) -> str:
        """``topic:channel``, as logs name the channel (the channel's)."""
        raise NotImplementedError

    # ---------------------------------------------------------------- delivery

    def dispatch(self, changed: Subscriber | None = None) -> None:
        """Hand ready messages to subscribers with room in their RDY window.

        ``changed`` names the one subscriber whose state changed since the last
        dispatch (it sent commands, or its socket drained). When the last
        dispatch left every subscriber full, only that one can take messages
        now, so the others are not scanned: with a thousand consumers, a FIN
        costs one delivery, not a pass over all of them.

        Shares: the ready messages are split evenly among the subscribers with
        room, starting after the one the last pass served last; a subscriber
        whose RDY window is wide takes a run of up to :data:`MAX_RUN` (at most a
        quarter of its window) even when the even split is smaller, so that 200
        messages for 64 consumers are a few writes of 64 messages, not 64 writes
        of 3. A consumer with a narrow window (slow work, RDY below 8) always
        gets the even split, so work is spread as widely as before.
        """
        if self.paused or not self.clients or self.exiting or not (self.memory or self.ready.depth):
            # nothing to hand out (or nobody to take it): whoever has room keeps it
            self._all_full = False
            return
        if self._host.fence.holds(self.topic_name):
            self._all_full = False  # the replication dispatches every channel when it opens
            return
        ranked = self.ranked
        if ranked and self._upstream.moving():
            self._all_full = False  # the topic's hand-over dispatches again
            return
        full_pass = changed is None or not self._all_full
        if changed is not None and not full_pass:
            if not changed.ready_for_more():
                return
            ready = [changed]
        else:
            # round robin: start after the subscriber the last full pass served last
            clients = self.clients
            start = self._rr % len(clients)
            ready = [c for c in clients[start:] + clients[:start] if c.ready_for_more()]
            if not ready:
                self._all_full = True
                return
        memory = self.memory
        now = trio.current_time()
        touched = []
        while ready:
            size = len(memory) if not ranked else self.ready.available()
            if not size:
                if ranked:
                    self.sweeper.start()  # which dispatches again once it is over
                    break
                if not self.retention.read_ahead(sum(c.rdy - c.in_flight_count for c in ready)):
                    break
                continue
            share = max(1, size // len(ready))
            for client in ready:
                if ranked:
                    size = self.ready.available()
                n = min(client.rdy - client.in_flight_count, max(share, min(MAX_RUN, client.rdy >> 2)),
                        len(memory) if not ranked else size)
                if n <= 0:
                    break
                self._deliver(client, n, now)
                touched.append(client)
            ready = [c for c in ready if c.ready_for_more()]
        # messages may be left only once nobody can take them
        self._all_full = not ready
        if touched and full_pass:
            self._rr = self.clients.index(touched[-1]) + 1
        for client in touched:
            client.wake_writer()

    def _deliver(self, client: Subscriber, n: int, now: float) -> None:
        memory = self.memory
        in_flight = self.in_flight
        deadline = now + client.msg_timeout
        sample_rate = client.sample_rate
        bury_after = self.bury_after
        taken = self.taken
        room = client.output_room()
        dead = None
        skipped = None
        sent = []
        for _ in range(n):
            msg = memory.popleft()
            if msg.shared:  # the topic's object, which other channels hold too: deliver our own
                msg = msg.copy()
            if ((sample_rate and random.randrange(100) >= sample_rate) or msg.id in in_flight
                    or (taken is not None and msg.id in taken)):
                # sampled out, or a second copy of a message in flight (a crash left both
                # records in durable mode; the one in flight keeps or replaces its own), or
                # one another node took over while this one was gone (--replicas)
                if skipped is None:
                    skipped = []
                skipped.append(msg)
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
            room -= _FRAME_OVERHEAD + len(msg.body)
            if room <= 0:
                break
        copies = self._host.copies
        replicated = sent and copies.replicas(self.topic_name) > 1
        if replicated:
            client.in_flight_count += len(sent)  # its RDY window is taken meanwhile
        else:
            client.send_messages(sent)
        if client.lease is not None and sent:
            self._lease_out(client, client.lease_owner, client.lease, sent)
        self.in_flight_timers.push_many(deadline, sent)
        if replicated:  # written once a majority of the cluster hears this node (see Copies.confirm)
            chosen = sent.copy()  # the timers keep (and may extend) ``sent``
            copies.confirm(self.topic_name, lambda: self._send_confirmed(client, chosen),
                           lambda: self._take_back(client, chosen))
        if skipped:
            self.retention.retire(skipped)
        if dead:
            if self.retention.bury(dead):
                log.info("channel %s: buried %d message(s) after %d attempts", self.where, len(dead),
                         bury_after)

    def _still_out(self, client: Subscriber, msgs: list[Message]) -> list[Message]:
        """Those of ``msgs``, chosen for ``client``, that are still in flight to it (or its lease)."""
        in_flight = self.in_flight
        return [msg for msg in msgs if in_flight.get(msg.id) is msg and (msg.client is client or msg.client is None)]

    def _send_confirmed(self, client: Subscriber, msgs: list[Message]) -> None:
        """Write the messages chosen for ``client`` that are still its own (not timed out meanwhile)."""
        sent = self._still_out(client, msgs)
        if sent:
            client.in_flight_count -= len(sent)  # counted again as they are sent
            client.send_messages(sent)
            client.wake_writer()
            self._host.copies.delivered(self.topic_name, self.name, sent)

    def _take_back(self, client: Subscriber, msgs: list[Message]) -> None:
        """Messages chosen for ``client`` that must not be written after all (replication could not
        confirm them): back to the queue, that delivery not counted as an attempt."""
        back = self._still_out(client, msgs)
        if not back:
            return
        for msg in back:
            del self.in_flight[msg.id]
            if msg.client is client:
                client.in_flight_count -= 1
            msg.client = None
            msg.attempts -= 1
        if self.leases:
            self.leases.forget(back)
        if not self.retention.requeue(back):  # the disk takes no write: they time out as usual
            self._keep_in_flight_until(back, trio.current_time() + RETRY_DELAY)

    def _keep_in_flight_until(self, msgs: list[Message], deadline: float) -> None:
        """Keep messages that could not go back to the queue in flight, owned by nobody, until ``deadline``."""
        for msg in msgs:
            msg.deadline = deadline
            self.in_flight[msg.id] = msg
            self.in_flight_timers.push(deadline, msg)

    def _lease_out(self, client: Subscriber, owner: str, token: str, sent: list[Message]) -> None:
        """Hand delivered messages to the lease of ``owner`` and ``token``: they leave the
        client's window, and each delivery spends one of the credit a leasing
        connection's RDYs add up to."""
        for msg in sent:
            msg.client = None
        client.in_flight_count -= len(sent)
        client.rdy = max(0, client.rdy - len(sent))
        self.leases.add(owner, token, sent)

