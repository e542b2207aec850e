"""Publishing batches of messages to nsqd from one Spark task.

Bodies are sent as MPUB commands of at most ``batch_size`` messages (and at most
``MAX_MPUB_BYTES``), each answered by ``OK`` before the next is sent; deferred
messages go one DPUB each, pipelined. A connection that fails is replaced once
per batch and the batch is sent again: nsqd applies an MPUB whole or not at all,
so a resend can only duplicate what an unanswered MPUB already delivered.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from broker.protocol import encode_dpub, encode_mpub

from .connection import Connection, NsqError
from .options import Address

__all__ = ["Publisher", "MAX_MPUB_BYTES"]

#: nsqd's default --max-body-size (5 MiB) less room for the MPUB count and lengths.
MAX_MPUB_BYTES = 5 * 1024 * 1024 - 64 * 1024
#: Per-message framing inside an MPUB body (its 4-byte length).
_MPUB_ITEM_OVERHEAD = 4

_log = logging.getLogger(__name__)


class Publisher:
    """Publishes to the first reachable of ``addresses``, starting at ``first``.

    Connects lazily; the caller must ``close`` it. Raises :class:`NsqError` when
    nsqd rejects a batch (``E_BAD_MESSAGE``, ``E_BAD_TOPIC``, ...) or no address
    accepts a connection.
    """

    __slots__ = ("_addresses", "_next", "_batch_size", "_defer_ms", "_conn", "published")

    def __init__(self, addresses: Sequence[Address], *, batch_size: int, defer_ms: int = 0,
                 first: int = 0):
        self._addresses = tuple(addresses)
        self._next = first % len(self._addresses)
        self._batch_size = batch_size
        self._defer_ms = defer_ms
        self._conn: Connection | None = None
        #: Messages acknowledged by nsqd so far.
        self.published = 0

    def publish(self, topic: str, bodies: Sequence[bytes]) -> None:
        """Publish ``bodies`` to ``topic``, in batches; returns once nsqd has acknowledged all."""
        for start, end in self._slices(bodies):
            self._send_batch(topic, bodies[start:end])

    def _slices(self, bodies: Sequence[bytes]):
        start, size, count = 0, 0, 0
        for index, body in enumerate(bodies):
            if not body:
                raise ValueError(
                    "nsq data source: cannot publish an empty or null body (nsqd rejects them)"
                )
            item = len(body) + _MPUB_ITEM_OVERHEAD
            if count and (count == self._batch_size or size + item > MAX_MPUB_BYTES):
                yield start, index
                start, size, count = index, 0, 0
            size += item
            count += 1
        if count:
            yield start, len(bodies)

    def _send_batch(self, topic: str, bodies: Sequence[bytes]) -> None:
        if self._defer_ms:
            payload = b"".join(encode_dpub(topic, self._defer_ms, body) for body in bodies)
            responses = len(bodies)
        else:
            payload = encode_mpub(topic, bodies)
            responses = 1
        for attempt in (1, 2):
            conn = self._connection()
            try:
                conn.send(payload)
                for _ in range(responses):
                    conn.read_response()
            except NsqError as exc:
                conn.close()
                self._conn = None
                if exc.code != "E_CONNECTION" or attempt == 2:
                    raise
                _log.warning("publishing to %s failed (%s); reconnecting", conn.address, exc)
                continue
            self.published += len(bodies)
            return

    def _connection(self) -> Connection:
        if self._conn is not None:
            return self._conn
        errors: list[NsqError] = []
        for _ in range(len(self._addresses)):
            address = self._addresses[self._next]
            self._next = (self._next + 1) % len(self._addresses)
            try:
                self._conn = Connection.open(address, {})
                return self._conn
            except NsqError as exc:
                errors.append(exc)
        if len(errors) == 1:
            raise errors[0]
        raise NsqError(errors[0].address, "E_CONNECTION", "no nsqd accepts a connection: " + "; ".join(
            f"{exc.address} {exc.description}" for exc in errors))

    def close(self) -> None:
        """Close the connection, if any; idempotent."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
