"""An executor's read of one micro-batch partition under a lease (pynsqd only).

The partition says where to read and how much, not what: the executor connects,
IDENTIFYs with the partition's lease token, SUBs and asks for its messages with
RDY, which on a leasing connection is a credit. Messages delivered to it belong
to the token, so they stay in flight after the connection closes, until the
driver finishes the token when Spark commits the batch, or until their
msg_timeout, when the broker delivers them again.

Before reading, the reader gives back (``LEASE REQ``) whatever an earlier attempt
of the same partition leased: a retried task must not have those finished with
its own.

Without AUTH a lease token is the only proof of who may settle a lease, so each
token ends in a random part (:func:`lease_secret`, 128 bits) that the driver keeps
in memory and in the partitions it sends to the executors, never in an offset:
the checkpoint and Spark's progress reports show the query and batch, which do not
let anyone name the token.
"""

from __future__ import annotations

import secrets
import struct
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from broker.protocol import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    LEASE_IDENTIFY_FIELD,
    encode_cls,
    encode_lease,
    encode_nop,
    encode_rdy,
    encode_sub,
)

from .connection import CONNECT_TIMEOUT_S, Connection, NsqError
from .options import MAX_RDY_COUNT, Address
from .schema import MessageColumns

__all__ = ["LeasePartition", "lease_secret", "lease_token", "ROWS_PER_RECORD_BATCH"]

#: Rows per Arrow record batch handed to Spark: big enough to amortise Arrow's calls.
ROWS_PER_RECORD_BATCH = 10_000
#: A frame's size and type.
_FRAME_START = struct.Struct(">II")
#: Frames larger than this are garbage: nsqd's limits stay far below it.
_MAX_FRAME_SIZE = 64 * 1024 * 1024
_HEARTBEAT = b"_heartbeat_"
#: Random bytes in a lease token's secret part: 128 bits cannot be guessed.
LEASE_SECRET_BYTES = 16


def lease_secret() -> str:
    """A new random part for lease tokens: 22 characters of ``[A-Za-z0-9_-]``, valid in a token."""
    return secrets.token_urlsafe(LEASE_SECRET_BYTES)


def lease_token(query: str, batch: int, partition: int, secret: str) -> str:
    """The lease token of one partition of one micro-batch of one query, ending in ``secret``
    (from :func:`lease_secret`)."""
    return f"{query}.{batch}.{partition}.{secret}"


class LeasePartition(InputPartition):
    """Where to read: ``count`` messages of ``topic`` from ``address``, leased under ``token``."""

    def __init__(self, address: Address, topic: str, count: int, token: str):
        super().__init__(None)
        self.address = address
        self.topic = topic
        self.count = count
        self.token = token

    def read(self, channel: str, msg_timeout_ms: int, drain_timeout_ms: int, *,
             finish: bool = False) -> Iterator[pa.RecordBatch]:
        """Lease up to ``count`` messages and yield them as record batches.

        Stops early once nothing arrives for ``drain_timeout_ms``. With ``finish``
        (a batch read, which has no commit) the messages are finished once Spark has
        taken the last batch. Raises :class:`NsqError` when the connection fails or
        the broker offers no lease.
        """
        conn = Connection.open(self.address, {"msg_timeout": msg_timeout_ms,
                                              LEASE_IDENTIFY_FIELD: self.token})
        try:
            if conn.identity.get(LEASE_IDENTIFY_FIELD) != self.token:
                raise NsqError(self.address, "E_NO_LEASE", "the broker offers no leases (not pynsqd)")
            credit = MAX_RDY_COUNT
            max_rdy = conn.identity.get("max_rdy_count")
            if isinstance(max_rdy, int) and max_rdy > 0:
                credit = min(credit, max_rdy)
            stream = _MessageStream(conn, self.topic, str(self.address))
            conn.send(encode_sub(self.topic, channel) + encode_lease("REQ", self.token, 0))
            stream.expect_responses(2)
            yield from self._receive(stream, credit, drain_timeout_ms / 1000)
            if finish:
                conn.send(encode_lease("FIN", self.token))
                stream.expect_responses(1)
        finally:
            conn.close()

    def _receive(self, stream: _MessageStream, credit: int, idle_s: float) -> Iterator[pa.RecordBatch]:
        # RDY adds to a leasing connection's credit: granting half of it again each
        # time half has arrived keeps the broker sending while this task decodes.
        step = max(1, credit // 2)
        granted = min(credit, self.count)
        stream.conn.send(encode_rdy(granted))
        while stream.received < self.count:
            if not stream.receive(idle_s):
                break
            room = credit - (granted - stream.received)
            if granted < self.count and room >= step:
                more = min(room, self.count - granted)
                stream.conn.send(encode_rdy(more))
                granted += more
            if len(stream.columns) >= ROWS_PER_RECORD_BATCH:
                yield stream.take()
        # Credit left unspent may still bring messages, leased to us: CLS ends the
        # credit, and everything sent before its CLOSE_WAIT is ours to return.
        stream.conn.send(encode_cls())
        stream.expect_responses(1)
        if len(stream.columns):
            yield stream.take()


class _MessageStream:
    """Frames of one leasing connection parsed straight into columns, without frame objects."""

    __slots__ = ("conn", "columns", "received", "_topic", "_nsqd", "_buf", "_responses")

    def __init__(self, conn: Connection, topic: str, nsqd: str):
        self.conn = conn
        self.columns = MessageColumns()
        self.received = 0
        self._topic = topic
        self._nsqd = nsqd
        self._buf = bytearray()
        self._responses: list[bytes] = []

    def take(self) -> pa.RecordBatch:
        """The messages parsed so far as a record batch; starts new columns."""
        batch = self.columns.to_arrow()
        self.columns = MessageColumns()
        return batch

    def expect_responses(self, count: int) -> list[bytes]:
        """Read until ``count`` responses came (messages meanwhile are kept); raises
        :class:`NsqError` for an error frame or when none comes in time."""
        while len(self._responses) < count:
            if not self.receive(CONNECT_TIMEOUT_S):
                raise NsqError(self.conn.address, "E_TIMEOUT", "no response within "
                               f"{CONNECT_TIMEOUT_S:g}s")
        answers, self._responses = self._responses[:count], self._responses[count:]
        return answers

    def receive(self, timeout: float) -> bool:
        """Parse what arrives within ``timeout``; False when nothing did."""
        data = self.conn.read_raw(timeout)
        if not data:
            return False
        buf = self._buf
        buf += data
        end = len(buf)
        pos = 0
        append = self.columns.append_frame
        topic, nsqd = self._topic, self._nsqd
        count = 0
        while end - pos >= 8:
            size, kind = _FRAME_START.unpack_from(buf, pos)
            stop = pos + 4 + size
            if size < 4 or size > _MAX_FRAME_SIZE:
                raise NsqError(self.conn.address, "E_BAD_FRAME", f"frame size {size}")
            if stop > end:
                break
            if kind == FRAME_TYPE_MESSAGE:
                append(bytes(buf[pos + 8:stop]), topic, nsqd)
                count += 1
            elif kind == FRAME_TYPE_RESPONSE:
                answer = bytes(buf[pos + 8:stop])
                if answer == _HEARTBEAT:
                    self.conn.send(encode_nop())
                else:
                    self._responses.append(answer)
            elif kind == FRAME_TYPE_ERROR:
                raise NsqError.from_frame(self.conn.address, bytes(buf[pos + 8:stop]))
            else:
                raise NsqError(self.conn.address, "E_BAD_FRAME", f"invalid frame type {kind}")
            pos = stop
        del buf[:pos]
        self.received += count
        return True
