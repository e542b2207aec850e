"""An executor's read of one micro-batch partition under a lease (pynsqd only).

The partition says where to read and how much, not what: the executor connects,
IDENTIFYs with the partition's lease token, SUBs and asks for its messages with
RDY, which on a leasing connection is a credit. Messages delivered to it belong
to the token, so they stay in flight after the connection closes, until the
driver finishes the token when Spark commits the batch, or until their
msg_timeout, when the broker delivers them again.

Before reading, the reader gives back (``LEASE REQ``) whatever an earlier attempt
of the same partition leased: a retried task, or the replay of an uncommitted
batch after a restart, must not have those finished with its own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from broker.protocol import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    LEASE_IDENTIFY_FIELD,
    encode_lease,
    encode_rdy,
    encode_sub,
)

from .connection import CONNECT_TIMEOUT_S, Connection, NsqError
from .options import MAX_RDY_COUNT, Address
from .schema import MessageColumns

__all__ = ["LeasePartition", "lease_token", "ROWS_PER_RECORD_BATCH"]

#: Rows per Arrow record batch handed to Spark: big enough to amortise Arrow's calls.
ROWS_PER_RECORD_BATCH = 10_000


def lease_token(query: str, batch: int, partition: int) -> str:
    """The lease token of one partition of one micro-batch of one query."""
    return f"{query}.{batch}.{partition}"


class LeasePartition(InputPartition):
    """Where to read: ``count`` messages of ``topic`` from ``address``, leased under ``token``."""

    def __init__(self, address: Address, topic: str, count: int, token: str):
        super().__init__(None)
        self.address = address
        self.topic = topic
        self.count = count
        self.token = token

    def read(self, channel: str, msg_timeout_ms: int, drain_timeout_ms: int) -> Iterator[pa.RecordBatch]:
        """Lease up to ``count`` messages and yield them as record batches.

        Stops early once nothing arrives for ``drain_timeout_ms``. Raises
        :class:`NsqError` when the connection fails or the broker offers no lease.
        """
        conn = Connection.open(self.address, {"msg_timeout": msg_timeout_ms,
                                              LEASE_IDENTIFY_FIELD: self.token})
        try:
            if conn.identity.get(LEASE_IDENTIFY_FIELD) != self.token:
                raise NsqError(self.address, "E_NO_LEASE", "the broker offers no leases (not pynsqd)")
            window = MAX_RDY_COUNT
            max_rdy = conn.identity.get("max_rdy_count")
            if isinstance(max_rdy, int) and max_rdy > 0:
                window = min(window, max_rdy)
            conn.send(encode_sub(self.topic, channel) + encode_lease("REQ", self.token, 0))
            conn.read_response(CONNECT_TIMEOUT_S)
            conn.read_response(CONNECT_TIMEOUT_S)
            yield from self._receive(conn, window, drain_timeout_ms / 1000)
        finally:
            conn.close()

    def _receive(self, conn: Connection, window: int, idle_s: float) -> Iterator[pa.RecordBatch]:
        columns = MessageColumns()
        nsqd = str(self.address)
        topic = self.topic
        remaining = self.count
        while remaining > 0:
            credit = min(window, remaining)
            conn.send(encode_rdy(credit))
            got = _collect(conn, columns, topic, nsqd, credit, idle_s)
            remaining -= got
            if len(columns) >= ROWS_PER_RECORD_BATCH:
                yield columns.to_arrow()
                columns = MessageColumns()
            if got < credit:
                break
        # Credit left unspent may still bring messages, leased to us: RDY 0 stops
        # them, and everything sent before the answer to AVAILABLE is ours to return.
        conn.send(encode_rdy(0) + encode_lease("AVAILABLE"))
        _collect(conn, columns, topic, nsqd, None, CONNECT_TIMEOUT_S)
        if len(columns):
            yield columns.to_arrow()


def _collect(conn: Connection, columns: MessageColumns, topic: str, nsqd: str,
             count: int | None, idle_s: float) -> int:
    """Append arriving messages to ``columns`` until ``count`` came (None: until a
    response frame), or nothing arrived for ``idle_s``. Returns how many came."""
    got = 0
    append = columns.append_frame
    deadline = time.monotonic() + idle_s
    while count is None or got < count:
        frames = conn.read_frames(max(0.0, deadline - time.monotonic()))
        if not frames:
            break
        for frame in frames:
            kind = frame.frame_type
            if kind == FRAME_TYPE_MESSAGE:
                append(frame.data, topic, nsqd)
                got += 1
            elif kind == FRAME_TYPE_ERROR:
                raise NsqError.from_frame(conn.address, frame.data)
            elif kind == FRAME_TYPE_RESPONSE and count is None:
                return got
        deadline = time.monotonic() + idle_s
    return got
