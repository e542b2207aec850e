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

The connection also asks for priorities (pynsqd grants them): each message's
priority, in front of its body, becomes the ``priority`` column.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from broker.client import FramePump
from broker.protocol import (
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    LEASE_IDENTIFY_FIELD,
    encode_cls,
    encode_lease,
    encode_rdy,
    encode_sub,
)
from broker.protocol.priorities import PRIORITIES_IDENTIFY_FIELD

from .dial import CONNECT_TIMEOUT_S, NsqError, dial
from .options import MAX_RDY_COUNT, Address
from .schema import MessageColumns

__all__ = ["LeasePartition", "lease_secret", "lease_token", "ROWS_PER_RECORD_BATCH"]

#: Rows per Arrow record batch handed to Spark: big enough to amortise Arrow's calls.
ROWS_PER_RECORD_BATCH = 10_000
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
    """Where to read: ``count`` messages of ``topic`` from ``address``, leased under ``token``,
    on a connection that IDENTIFYs as ``client_id`` (None: the host name)."""

    def __init__(self, address: Address, topic: str, count: int, token: str, client_id: str | None = None):
        super().__init__(None)
        self.address = address
        self.topic = topic
        self.count = count
        self.token = token
        self.client_id = client_id

    def read(self, channel: str, msg_timeout_ms: int, drain_timeout_ms: int, *,
             finish: bool = False) -> Iterator[pa.RecordBatch]:
        """Lease up to ``count`` messages and yield them as record batches.

        Stops early once nothing arrives for ``drain_timeout_ms``. With ``finish``
        (a batch read, which has no commit) the messages are finished once Spark has
        taken the last batch. Raises :class:`NsqError` when the connection fails or
        the broker offers no lease.
        """
        conn = dial(self.address, {"msg_timeout": msg_timeout_ms, LEASE_IDENTIFY_FIELD: self.token,
                                   PRIORITIES_IDENTIFY_FIELD: True}, self.client_id)
        try:
            if conn.identity.get(LEASE_IDENTIFY_FIELD) != self.token:
                raise NsqError(self.address, "E_NO_LEASE", "the broker offers no leases (not pynsqd)")
            credit = MAX_RDY_COUNT
            max_rdy = conn.identity.get("max_rdy_count")
            if isinstance(max_rdy, int) and max_rdy > 0:
                credit = min(credit, max_rdy)
            stream = _MessageStream(conn, self.topic, str(self.address),
                                    conn.identity.get(PRIORITIES_IDENTIFY_FIELD) is True)
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
    """Frames of one leasing connection taken straight into columns, without message objects;
    ``prioritised``: the connection negotiated priorities, which precede the bodies."""

    __slots__ = ("conn", "columns", "received", "_topic", "_nsqd", "_prioritised", "_responses")

    def __init__(self, conn: FramePump, topic: str, nsqd: str, prioritised: bool):
        self.conn = conn
        self.columns = MessageColumns()
        self.received = 0
        self._topic = topic
        self._nsqd = nsqd
        self._prioritised = prioritised
        self._responses: list[bytes] = []

    def take(self) -> pa.RecordBatch:
        """The messages taken so far as a record batch; starts new columns."""
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
        """Take the frames that arrive within ``timeout``; False when none did."""
        frames = self.conn.read(timeout)
        append = self.columns.append_frame
        topic, nsqd, prioritised = self._topic, self._nsqd, self._prioritised
        count = 0
        for frame_type, payload in frames:
            if frame_type == FRAME_TYPE_MESSAGE:
                append(payload, topic, nsqd, prioritised)
                count += 1
            elif frame_type == FRAME_TYPE_RESPONSE:
                self._responses.append(payload)
            else:  # a leasing connection settles nothing by id: even E_FIN_FAILED is a fault
                raise NsqError.from_frame(self.conn.address, payload)
        self.received += count
        return bool(frames)
