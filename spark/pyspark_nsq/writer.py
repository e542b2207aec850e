"""The sink and the batch writer: each Spark task publishes its rows with MPUB.

Rows arrive as Arrow record batches; bodies are buffered per topic and published
``batchSize`` at a time. nsq has no transactions, so delivery is at-least-once: a
task that fails after publishing some rows publishes them again when Spark retries
it, and a streaming batch replayed after a restart is published again. Commit and
abort therefore have nothing to undo.
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
from .schema import check_sink_schema

__all__ = ["NsqWriter", "NsqStreamWriter", "PublishReceipt", "publish_batches"]

_log = logging.getLogger(__name__)

#: The local property that holds the id of the micro-batch a task belongs to.
_BATCH_ID_PROPERTY = "streaming.sql.batchId"


@dataclass(frozen=True, slots=True)
class PublishReceipt(WriterCommitMessage):
    """What one task published: its partition and the number of messages."""

    partition: int
    messages: int


def _registered_nodes(options: SinkOptions) -> tuple[Address, ...]:
    """With ``lookupd``: every nsqd registered there; raises DiscoveryError when there is none."""
    nodes = tuple(all_nodes(options.lookupd))
    if not nodes:
        raise DiscoveryError("nsq data source: no nsqd is registered with nsqlookupd at "
                             + ", ".join(str(a) for a in options.lookupd))
    return nodes


def publish_batches(options: SinkOptions, schema: StructType,
                    batches: Iterator[pa.RecordBatch]) -> PublishReceipt:
    """Publish the ``body`` column of ``batches``; returns once nsqd acknowledged all.

    Raises ``ValueError`` for a null or empty body or a bad topic value, and
    :class:`~broker.client.NsqError` when nsqd refuses a batch.
    """
    body_index, topic_index = check_sink_schema(schema, options.topic)
    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    # Spark sets this local property on the jobs of a streaming micro-batch
    batch = context.getLocalProperty(_BATCH_ID_PROPERTY) if context is not None else None
    name = (client_name("write", "partition", partition) if batch is None
            else client_name("write batch", batch, "partition", partition))
    publisher = Publisher(options.nsqd or _registered_nodes(options), batch_size=options.batch_size,
                          defer_ms=options.defer_ms, first=partition, client_id=name)
    buffers: dict[str, list[bytes]] = {}
    checked: set[str] = set()
    try:
        for batch in batches:
            bodies = batch.column(body_index)
            if not pa.types.is_binary(bodies.type):
                bodies = pc.cast(bodies, pa.binary())
            bodies = bodies.to_pylist()
            if topic_index is None:
                buffers.setdefault(_check_topic(options.topic), []).extend(bodies)
            else:
                for value, body in zip(batch.column(topic_index).to_pylist(), bodies):
                    topic = value or options.topic
                    if topic is None or topic not in checked:
                        topic = _check_topic(topic)
                        checked.add(topic)
                    buffers.setdefault(topic, []).append(body)
            for topic, pending in buffers.items():
                if len(pending) >= options.batch_size:
                    full = len(pending) - len(pending) % options.batch_size
                    publisher.publish(topic, pending[:full])
                    del pending[:full]
        for topic, pending in buffers.items():
            if pending:
                publisher.publish(topic, pending)
        publisher.flush()
    finally:
        publisher.close()
    return PublishReceipt(partition, publisher.published)


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

    def abort(self, messages) -> None:
        """Nothing to undo; rows of tasks that failed may already be published."""
        _log.warning("nsq write aborted; some rows may have been published already")


class NsqStreamWriter(_PartitionPublisher, DataSourceStreamArrowWriter):
    """``df.writeStream.format("nsq")``: publishes each micro-batch, at least once."""

    def commit(self, messages, batchId: int) -> None:
        """Nothing to do: every message was acknowledged by nsqd before its task ended."""

    def abort(self, messages, batchId: int) -> None:
        """Nothing to undo; the batch is published again when Spark retries it."""
        _log.warning("nsq sink: batch %d aborted; it will be published again on retry", batchId)
