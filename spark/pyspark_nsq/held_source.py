"""The driver-side path of the streaming source, for brokers without leases (nsqd).

nsqd accepts a FIN only from the connection that received the message, so the
driver process owns the subscriptions: it receives messages, keeps them in flight
(see :mod:`.subscription`), numbers them into batches (see :mod:`.ledger`) and ships
each batch's messages to the executors inside its input partitions. Every message
passes through the driver, so this path does not scale past one process; pynsqd's
lease extension lets :mod:`.leased_source` read on the executors instead.

A message is FIN'd only once the batch holding it is committed. Spark reports that
late (``commit`` of batch N-1 comes when batch N is planned), but every offset
below the ``start`` that Spark passes to ``latestOffset`` is already in the
checkpoint's commit log, so the messages below it are FIN'd there too; otherwise
the last batch of a quiet stream would stay in flight.
"""

from __future__ import annotations

import time

from pyspark.sql.datasource import InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows

from .consumer import Consumer, Delivery
from .ledger import Ledger
from .options import SourceOptions
from .schema import MessageColumns

__all__ = ["HeldSource", "MessagePartition", "MESSAGES_PER_PARTITION"]

#: A batch is split into Spark partitions of at most this many messages. A Python
#: data source task costs Spark about 0.1 s to start, as much as ~5,000 messages
#: cost to move, so a partition must be large to be worth its own task.
MESSAGES_PER_PARTITION = 20_000
#: After FIN'ing a full window, how long planning waits for nsqd to refill it.
#: Without the wait a batch holds only what arrived while the previous one ran,
#: and batch sizes alternate between the window's two halves.
_REFILL_WAIT_S = 0.05
#: How often a wait looks for newly arrived messages.
_POLL_S = 0.002


class MessagePartition(InputPartition):
    """One Spark partition of a micro-batch: the messages themselves, column-wise."""

    def __init__(self, columns: MessageColumns):
        super().__init__(None)
        self.columns = columns

    def read(self):
        """The partition's messages as one Arrow record batch (on an executor)."""
        if len(self.columns):
            yield self.columns.to_arrow()


class HeldSource:
    """Reads ``options.topics`` through ``options.channel`` on every nsqd listed, on the driver.

    Connections open on first use and close in ``stop``, which REQs every message
    not yet FIN'd so the next consumer gets it at once. Owned by the driver's
    source process; the stream reader calls it.
    """

    def __init__(self, options: SourceOptions):
        self._options = options
        self._consumer: Consumer | None = None
        self._ledger: Ledger[Delivery] = Ledger()
        self._cutoff_ns: int | None = None

    def initial_offset(self) -> dict:
        """Offset 0, after subscribing so that messages start arriving."""
        self._open()
        return {"offset": 0}

    def prepare_available_now(self) -> None:
        """Read only messages published before now, until none are left."""
        self._cutoff_ns = time.time_ns()

    def latest_offset(self, start: dict, limit: ReadLimit) -> dict:
        """FIN what Spark committed below ``start``, then plan the next batch."""
        consumer = self._open()
        begin = int(start["offset"])
        done = self._ledger.acknowledge(begin)
        window_was_full = consumer.window_full
        consumer.fin(done)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        self._collect()
        if done and window_was_full:
            self._await_refill(max_rows)
        if self._cutoff_ns is None:
            return {"offset": self._ledger.plan(begin, max_rows)}
        return {"offset": self._plan_available_now(begin, max_rows)}

    def _await_refill(self, max_rows: int | None) -> None:
        room = self._open().window - self._ledger.planned
        target = room if max_rows is None else min(room, max_rows)
        deadline = time.monotonic() + _REFILL_WAIT_S
        while self._ledger.pending < target and time.monotonic() < deadline:
            time.sleep(_POLL_S)
            self._collect()

    def _plan_available_now(self, begin: int, max_rows: int | None) -> int:
        cutoff = self._cutoff_ns

        def published_before(item) -> bool:
            return item[1].timestamp <= cutoff

        end = self._ledger.plan(begin, max_rows, published_before)
        # nsqd sends more only as earlier messages are FIN'd; give it the drain
        # timeout to do so before deciding the channel holds nothing older.
        deadline = time.monotonic() + self._options.drain_timeout_ms / 1000
        while end == begin and time.monotonic() < deadline:
            time.sleep(_POLL_S)
            if self._collect():
                end = self._ledger.plan(begin, max_rows, published_before)
        return end

    def partitions(self, start: dict, end: dict) -> list[MessagePartition]:
        """The messages of ``[start, end)`` in partitions of MESSAGES_PER_PARTITION."""
        self._open()
        items = self._ledger.batch(int(start["offset"]), int(end["offset"]))
        partitions = []
        for first in range(0, len(items), MESSAGES_PER_PARTITION):
            columns = MessageColumns()
            for subscription, message in items[first:first + MESSAGES_PER_PARTITION]:
                columns.append(message.id, message.timestamp, message.attempts, message.body,
                               subscription.topic, str(subscription.address), message.priority)
            partitions.append(MessagePartition(columns))
        return partitions

    def commit(self, end: dict) -> None:
        """FIN every message below ``end``: Spark has committed them."""
        if self._consumer is not None:
            self._consumer.fin(self._ledger.acknowledge(int(end["offset"])))

    def stop(self) -> None:
        """Close the subscriptions; messages not FIN'd are REQ'd for redelivery."""
        self._ledger.release()
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _open(self) -> Consumer:
        if self._consumer is None:
            consumer = Consumer(self._options)
            consumer.open()
            self._consumer = consumer
        return self._consumer

    def _collect(self) -> int:
        """Move arrived messages into the ledger; drop those of dead connections."""
        consumer = self._open()
        received = consumer.receive()
        self._ledger.receive(received)
        dead = consumer.replace_dead()
        if dead:
            self._ledger.discard(lambda delivery: delivery[0] in dead)
        return len(received)
