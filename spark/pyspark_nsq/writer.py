"""The sink and the batch writer: each Spark task publishes its rows with MPUB.

Rows arrive as Arrow record batches; bodies are buffered per topic and published
``batchSize`` at a time. nsq has no transactions, so delivery is at-least-once: a
task that fails after publishing some rows publishes them again when Spark retries
it, and a streaming batch replayed after a restart is published again. Commit and
abort therefore have nothing to undo.

A ``key`` column turns that into exactly once within the broker's dedup window: its
rows go out as keyed publishes (pynsqd only), and the broker stores each key once
per topic, answering ``DUPLICATE`` for the rows a retry or a replay publishes again.
The tasks count those duplicates in their :class:`PublishReceipt`, and the driver
logs them when the write or the micro-batch commits.

A ``priority`` column (an integer, 0 the most urgent) publishes each row with its
priority (pynsqd only), a null one with the broker's ``--default-priority``: the
channels of the topic deliver in (priority, publish order) order.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from broker.protocol import is_valid_name

from .dial import client_name
from .discovery import DiscoveryError, all_nodes
from .options import Address, SinkOptions
from .publisher import Publisher
from .schema import check_sink_schema, key_column, priority_column

__all__ = ["NsqWriter", "NsqStreamWriter", "PublishReceipt", "publish_batches"]

_log = logging.getLogger(__name__)

#: The local property that holds the id of the micro-batch a task belongs to.
_BATCH_ID_PROPERTY = "streaming.sql.batchId"


@dataclass(frozen=True, slots=True)
class PublishReceipt(WriterCommitMessage):
    """What one task published: its partition, the number of messages nsqd acknowledged,
    and how many of them were keyed duplicates the broker did not store again."""

    partition: int
    messages: int
    duplicates: int = 0


def _registered_nodes(options: SinkOptions) -> tuple[Address, ...]:
    """With ``lookupd``: every nsqd registered there; raises DiscoveryError when there is none."""
    nodes = tuple(all_nodes(options.lookupd))
    if not nodes:
        raise DiscoveryError("nsq data source: no nsqd is registered with nsqlookupd at "
                             + ", ".join(str(a) for a in options.lookupd))
    return nodes


def publish_batches(options: SinkOptions, schema: StructType,
                    batches: Iterator[pa.RecordBatch]) -> PublishReceipt:
    """Publish the ``body`` column of ``batches``, keyed by the ``key`` column and with the
    priorities of the ``priority`` column when there are such; returns once nsqd
    acknowledged all.

    Raises ``ValueError`` for a null or empty body, an empty or over-long key, a priority
    outside 0..2**32-1, a bad topic value or a keyed or prioritised write to an nsqd
    without keyed publishes or priorities, and :class:`~broker.client.NsqError` when nsqd
    refuses a batch.
    """
    body_index, topic_index = check_sink_schema(schema, options.topic)
    key_index = key_column(schema)
    priority_index = priority_column(schema)
    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    # Spark sets this local property on the jobs of a streaming micro-batch
    batch = context.getLocalProperty(_BATCH_ID_PROPERTY) if context is not None else None
    name = (client_name("write", "partition", partition) if batch is None
            else client_name("write batch", batch, "partition", partition))
    publisher = Publisher(options.nsqd or _registered_nodes(options), batch_size=options.batch_size,
                          defer_ms=options.defer_ms, first=partition, client_id=name,
                          keyed=key_index is not None, prioritised=priority_index is not None)
    pending: dict[str, _Waiting] = {}  # per topic: the rows waiting
    checked: set[str] = set()
    try:
        for record_batch in batches:
            bodies = _binary(record_batch.column(body_index)).to_pylist()
            keys = _binary(record_batch.column(key_index)).to_pylist() if key_index is not None else None
            priorities = (record_batch.column(priority_index).to_pylist() if priority_index is not None
                          else None)
            if topic_index is None:
                default = _check_topic(options.topic)
                _waiting(pending, default).extend(bodies, keys, priorities)
            else:
                values = record_batch.column(topic_index).to_pylist()
                for row, value in enumerate(values):
                    topic = value or options.topic
                    if topic is None or topic not in checked:
                        topic = _check_topic(topic)
                        checked.add(topic)
                    _waiting(pending, topic).add_row(row, bodies, keys, priorities)
            for topic, waiting in pending.items():
                if len(waiting.bodies) >= options.batch_size:
                    waiting.publish(publisher, topic, len(waiting.bodies) - len(waiting.bodies) % options.batch_size)
        for topic, waiting in pending.items():
            if waiting.bodies:
                waiting.publish(publisher, topic, len(waiting.bodies))
        publisher.flush()
    finally:
        publisher.close()
    if publisher.duplicates:
        _log.info("nsq sink: partition %d: %d of %d messages were duplicates of keys already stored; "
                  "nsqd did not store them again", partition, publisher.duplicates, publisher.published)
    return PublishReceipt(partition, publisher.published, publisher.duplicates)


class _Waiting:
    """The rows of one topic waiting to be published: their bodies, and their keys and
    priorities when the DataFrame has those columns (else those lists stay empty)."""

    __slots__ = ("bodies", "keys", "priorities")

    def __init__(self):
        self.bodies: list[bytes] = []
        self.keys: list[bytes | None] = []
        self.priorities: list[int | None] = []

    def extend(self, bodies: list[bytes], keys: list[bytes | None] | None,
               priorities: list[int | None] | None) -> None:
        """Add the rows of a record batch."""
        self.bodies.extend(bodies)
        if keys is not None:
            self.keys.extend(keys)
        if priorities is not None:
            self.priorities.extend(priorities)

    def add_row(self, row: int, bodies: list[bytes], keys: list[bytes | None] | None,
                priorities: list[int | None] | None) -> None:
        """Add row ``row`` of a record batch."""
        self.bodies.append(bodies[row])
        if keys is not None:
            self.keys.append(keys[row])
        if priorities is not None:
            self.priorities.append(priorities[row])

    def publish(self, publisher: Publisher, topic: str, count: int) -> None:
        """Publish the first ``count`` rows (at least one) to ``topic`` and forget them."""
        # with the column, a list is as long as the bodies, so empty means without it
        publisher.publish(topic, self.bodies[:count], self.keys[:count] or None, self.priorities[:count] or None)
        del self.bodies[:count], self.keys[:count], self.priorities[:count]


def _waiting(pending: dict[str, _Waiting], topic: str) -> _Waiting:
    """The rows of ``topic`` in ``pending``, a new entry for a topic seen first."""
    waiting = pending.get(topic)
    if waiting is None:
        waiting = pending[topic] = _Waiting()
    return waiting


def _binary(column: pa.Array) -> pa.Array:
    """``column`` as binary: a string column's values as their UTF-8 bytes (nulls stay null)."""
    return column if pa.types.is_binary(column.type) else pc.cast(column, pa.binary())


def _log_duplicates(what: str, messages) -> None:
    """Log at INFO how many of the messages a write's tasks published were keyed duplicates."""
    receipts = [m for m in messages if isinstance(m, PublishReceipt)]
    duplicates = sum(r.duplicates for r in receipts)
    if duplicates:
        _log.info("nsq sink: %s: %d of %d messages were duplicates of keys the broker already stored, "
                  "not stored again", what, duplicates, sum(r.messages for r in receipts))


def _check_topic(topic: str | None) -> str:
    """``topic`` if it is a valid topic name; ``ValueError`` otherwise."""
    if topic is None:
        raise ValueError(
            "nsq data source: a row has a null 'topic' and no 'topic' option gives a default"
        )
    if not is_valid_name(topic):
        raise ValueError(f"nsq data source: a row names an invalid topic '{topic}'")
    return topic


class _PartitionPublisher:
    """What the batch and the streaming writer share: each task publishes its partition."""

    def __init__(self, options: SinkOptions, schema: StructType):
        check_sink_schema(schema, options.topic)
        self._options = options
        self._schema = schema

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PublishReceipt:
        """Publish one partition's rows (of the write, or of a micro-batch)."""
        return publish_batches(self._options, self._schema, iterator)


class NsqWriter(_PartitionPublisher, DataSourceArrowWriter):
    """``df.write.format("nsq")``: publishes every row once per successful task attempt."""

    def commit(self, messages) -> None:
        """Nothing to do but say how many keyed rows the broker dropped as duplicates."""
        _log_duplicates("write", messages)

    def abort(self, messages) -> None:
        """Nothing to undo; rows of tasks that failed may already be published."""
        _log.warning("nsq write aborted; some rows may have been published already")


class NsqStreamWriter(_PartitionPublisher, DataSourceStreamArrowWriter):
    """``df.writeStream.format("nsq")``: publishes each micro-batch, at least once (with a
    ``key`` column, once within the broker's dedup window)."""

    def commit(self, messages, batchId: int) -> None:
        """Nothing to do (every message was acknowledged by nsqd before its task ended) but
        say how many keyed rows the broker dropped as duplicates."""
        _log_duplicates(f"batch {batchId}", messages)

    def abort(self, messages, batchId: int) -> None:
        """Nothing to undo; the batch is published again when Spark retries it (its keyed
        rows then come back as duplicates, which the broker does not store)."""
        _log.warning("nsq sink: batch %d aborted; it will be published again on retry", batchId)
