"""The source's row layout, and the checks on what the sink is given.

Rows leave the source as Arrow record batches built column by column, so a batch
of messages costs a handful of Arrow calls rather than per-value conversions.

A message from a connection that negotiated priorities (a pynsqd extension, see
:mod:`broker.protocol.priorities`) carries its priority before its body; it becomes
the ``priority`` column, which is null for a message from nsqd.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import pyarrow as pa
from pyspark.sql.types import (
    BinaryType,
    ByteType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from broker.protocol.priorities import MAX_PRIORITY, PRIORITY_SIZE

from .options import OptionError

__all__ = [
    "SOURCE_SCHEMA",
    "ARROW_SCHEMA",
    "MessageColumns",
    "check_source_schema",
    "check_sink_schema",
    "key_column",
    "priority_column",
]

#: The schema of every DataFrame the source produces.
SOURCE_SCHEMA = StructType(
    [
        StructField("id", StringType()),
        StructField("timestamp", TimestampType()),
        StructField("attempts", IntegerType()),
        StructField("body", BinaryType()),
        StructField("topic", StringType()),
        StructField("nsqd", StringType()),
        StructField("priority", LongType()),
    ]
)

#: SOURCE_SCHEMA as Spark expects it back from a Python data source (UTC timestamps).
ARROW_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("attempts", pa.int32()),
        pa.field("body", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("nsqd", pa.string()),
        pa.field("priority", pa.int64()),
    ]
)


#: A message frame's header: nanosecond timestamp, attempts, 16-byte id.
_MESSAGE_HEADER = struct.Struct(">qH16s")
_BODY_OFFSET = _MESSAGE_HEADER.size
#: The same on a prioritised connection, followed by the message's priority.
_PRIORITISED_HEADER = struct.Struct(">qH16sI")
_PRIORITISED_BODY_OFFSET = _PRIORITISED_HEADER.size


class MessageColumns:
    """Messages of one partition, held column-wise so they pickle and convert cheaply.

    ``timestamps`` are microseconds since the epoch (nsqd sends nanoseconds);
    ``priorities`` are None for messages from a connection without priorities (nsqd).
    """

    __slots__ = ("ids", "timestamps", "attempts", "bodies", "topics", "nsqds", "priorities")

    def __init__(self):
        self.ids: list[str] = []
        self.timestamps: list[int] = []
        self.attempts: list[int] = []
        self.bodies: list[bytes] = []
        self.topics: list[str] = []
        self.nsqds: list[str] = []
        self.priorities: list[int | None] = []

    def __len__(self) -> int:
        return len(self.ids)

    def __getstate__(self):
        return (self.ids, self.timestamps, self.attempts, self.bodies, self.topics, self.nsqds, self.priorities)

    def __setstate__(self, state):
        self.ids, self.timestamps, self.attempts, self.bodies, self.topics, self.nsqds, self.priorities = state

    def append(self, msg_id: bytes, timestamp_ns: int, attempts: int, body: bytes, topic: str,
               nsqd: str, priority: int | None = None) -> None:
        """Add one message as it arrived in a message frame (its body without a priority)."""
        self.ids.append(msg_id.decode("ascii", "replace"))
        self.timestamps.append(timestamp_ns // 1000)
        self.attempts.append(attempts)
        self.bodies.append(body)
        self.topics.append(topic)
        self.nsqds.append(nsqd)
        self.priorities.append(priority)

    def append_frame(self, data: bytes, topic: str, nsqd: str, prioritised: bool = False) -> None:
        """Add one message straight from a message frame's data (no message object).

        ``prioritised``: the frame came on a connection that negotiated priorities, so its
        body starts with the message's priority. Raises ValueError when it is too short
        for one.
        """
        if prioritised:
            if len(data) < _PRIORITISED_BODY_OFFSET:
                raise ValueError(f"nsq data source: a message frame of {len(data)} bytes on a prioritised "
                                 f"connection has no room for a priority ({PRIORITY_SIZE} bytes)")
            timestamp_ns, attempts, msg_id, priority = _PRIORITISED_HEADER.unpack_from(data)
            self.bodies.append(data[_PRIORITISED_BODY_OFFSET:])
            self.priorities.append(priority)
        else:
            timestamp_ns, attempts, msg_id = _MESSAGE_HEADER.unpack_from(data)
            self.bodies.append(data[_BODY_OFFSET:])
            self.priorities.append(None)
        self.ids.append(msg_id.decode("ascii", "replace"))
        self.timestamps.append(timestamp_ns // 1000)
        self.attempts.append(attempts)
        self.topics.append(topic)
        self.nsqds.append(nsqd)

    def to_arrow(self) -> pa.RecordBatch:
        """One record batch in :data:`ARROW_SCHEMA`."""
        return pa.RecordBatch.from_arrays(
            [
                pa.array(self.ids, pa.string()),
                pa.array(self.timestamps, pa.timestamp("us", tz="UTC")),
                pa.array(self.attempts, pa.int32()),
                pa.array(self.bodies, pa.binary()),
                pa.array(self.topics, pa.string()),
                pa.array(self.nsqds, pa.string()),
                pa.array(self.priorities, pa.int64()),
            ],
            schema=ARROW_SCHEMA,
        )


def check_source_schema(schema: StructType) -> None:
    """Reject a user-supplied read schema other than :data:`SOURCE_SCHEMA`."""
    if schema is not None and [(f.name, f.dataType) for f in schema.fields] != [
        (f.name, f.dataType) for f in SOURCE_SCHEMA.fields
    ]:
        raise ValueError(
            "nsq data source: the schema is fixed and cannot be specified; expected "
            f"{SOURCE_SCHEMA.simpleString()}, got {schema.simpleString()}"
        )


def check_sink_schema(schema: StructType, default_topic: str | None) -> tuple[int, int | None]:
    """Find the ``body`` and optional ``topic`` columns of a DataFrame being written.

    Returns their positions (the optional ``key`` and ``priority`` columns are found by
    :func:`key_column` and :func:`priority_column`). Raises ``ValueError`` when ``body``
    is missing or is neither binary nor string, when ``topic`` is not a string, ``key``
    neither binary nor string or ``priority`` not an integer, and :class:`OptionError`
    when there is neither a ``topic`` column nor option.
    """
    names: Sequence[str] = [f.name.lower() for f in schema.fields]
    if "body" not in names:
        raise ValueError(
            "nsq data source: the DataFrame to write needs a 'body' column (binary or string); "
            f"it has {schema.simpleString()}"
        )
    body = names.index("body")
    if not isinstance(schema.fields[body].dataType, (BinaryType, StringType)):
        raise ValueError(
            "nsq data source: column 'body' must be binary or string, got "
            f"{schema.fields[body].dataType.simpleString()}"
        )
    topic = names.index("topic") if "topic" in names else None
    if topic is not None and not isinstance(schema.fields[topic].dataType, StringType):
        raise ValueError(
            "nsq data source: column 'topic' must be a string, got "
            f"{schema.fields[topic].dataType.simpleString()}"
        )
    key_column(schema)
    priority_column(schema)
    if topic is None and default_topic is None:
        raise OptionError("topic", "is required when the DataFrame has no 'topic' column")
    return body, topic


def key_column(schema: StructType) -> int | None:
    """The position of the ``key`` column of a DataFrame being written, None without one.

    Rows with a key are published as keyed publishes (a pynsqd extension), which the
    broker stores once per key and topic within its ``--dedup-window``. Raises
    ``ValueError`` when ``key`` is neither binary nor string.
    """
    names = [f.name.lower() for f in schema.fields]
    if "key" not in names:
        return None
    key = names.index("key")
    if not isinstance(schema.fields[key].dataType, (BinaryType, StringType)):
        raise ValueError(
            "nsq data source: column 'key' must be binary or string, got "
            f"{schema.fields[key].dataType.simpleString()}"
        )
    return key


#: The Spark types a ``priority`` column may have.
_PRIORITY_TYPES = (ByteType, ShortType, IntegerType, LongType)


def priority_column(schema: StructType) -> int | None:
    """The position of the ``priority`` column of a DataFrame being written, None without one.

    Rows are then published with their priority (a pynsqd extension), 0 the most urgent
    and at most :data:`~broker.protocol.priorities.MAX_PRIORITY`; a null one stands for
    the broker's ``--default-priority``. Raises ``ValueError`` when ``priority`` is not
    an integer column (tinyint, smallint, int or bigint).
    """
    names = [f.name.lower() for f in schema.fields]
    if "priority" not in names:
        return None
    priority = names.index("priority")
    if not isinstance(schema.fields[priority].dataType, _PRIORITY_TYPES):
        raise ValueError(
            f"nsq data source: column 'priority' must be an integer (tinyint, smallint, int or bigint; "
            f"0 to {MAX_PRIORITY}), got {schema.fields[priority].dataType.simpleString()}"
        )
    return priority
