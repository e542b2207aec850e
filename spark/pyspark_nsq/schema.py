"""The source's row layout, and the checks on what the sink is given.

Rows leave the source as Arrow record batches built column by column, so a batch
of messages costs a handful of Arrow calls rather than per-value conversions.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import pyarrow as pa
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from .options import OptionError

__all__ = [
    "SOURCE_SCHEMA",
    "ARROW_SCHEMA",
    "MessageColumns",
    "check_source_schema",
    "check_sink_schema",
    "key_column",
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
    ]
)


#: A message frame's header: nanosecond timestamp, attempts, 16-byte id.
_MESSAGE_HEADER = struct.Struct(">qH16s")
_BODY_OFFSET = _MESSAGE_HEADER.size


class MessageColumns:
    """Messages of one partition, held column-wise so they pickle and convert cheaply.

    ``timestamps`` are microseconds since the epoch (nsqd sends nanoseconds).
    """

    __slots__ = ("ids", "timestamps", "attempts", "bodies", "topics", "nsqds")

    def __init__(self):
        self.ids: list[str] = []
        self.timestamps: list[int] = []
        self.attempts: list[int] = []
        self.bodies: list[bytes] = []
        self.topics: list[str] = []
        self.nsqds: list[str] = []

    def __len__(self) -> int:
        return len(self.ids)

    def __getstate__(self):
        return (self.ids, self.timestamps, self.attempts, self.bodies, self.topics, self.nsqds)

    def __setstate__(self, state):
        self.ids, self.timestamps, self.attempts, self.bodies, self.topics, self.nsqds = state

    def append(self, msg_id: bytes, timestamp_ns: int, attempts: int, body: bytes, topic: str,
               nsqd: str) -> None:
        """Add one message as it arrived in a message frame."""
        self.ids.append(msg_id.decode("ascii", "replace"))
        self.timestamps.append(timestamp_ns // 1000)
        self.attempts.append(attempts)
        self.bodies.append(body)
        self.topics.append(topic)
        self.nsqds.append(nsqd)

    def append_frame(self, data: bytes, topic: str, nsqd: str) -> None:
        """Add one message straight from a message frame's data (no message object)."""
        timestamp_ns, attempts, msg_id = _MESSAGE_HEADER.unpack_from(data)
        self.ids.append(msg_id.decode("ascii", "replace"))
        self.timestamps.append(timestamp_ns // 1000)
        self.attempts.append(attempts)
        self.bodies.append(data[_BODY_OFFSET:])
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

    Returns their positions (the optional ``key`` column is found by :func:`key_column`).
    Raises ``ValueError`` when ``body`` is missing or is neither binary nor string, when
    ``topic`` is not a string or ``key`` neither binary nor string, and
    :class:`OptionError` when there is neither a ``topic`` column nor option.
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
