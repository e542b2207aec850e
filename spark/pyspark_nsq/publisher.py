"""Publishing batches of messages to nsqd from one Spark task.

Bodies are sent as MPUB commands of at most ``batch_size`` messages (and at most
``MAX_MPUB_BYTES``), pipelined: up to ``PIPELINE_DEPTH`` commands are on the wire
before the publisher waits for the oldest ``OK``, so the socket and nsqd stay busy
while the task encodes the next batch. Deferred messages go one DPUB each. A
connection that fails is replaced and every unanswered command is sent again:
nsqd applies an MPUB whole or not at all, so a resend can only duplicate what an
unanswered MPUB already delivered.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Sequence

from broker.client import FramePump
from broker.protocol import encode_dpub, encode_mpub

from .dial import NsqError, dial
from .options import Address

__all__ = ["Publisher", "MAX_MPUB_BYTES", "PIPELINE_DEPTH"]

#: Commands sent ahead of their answers.
PIPELINE_DEPTH = 8

#: nsqd's default --max-body-size (5 MiB) less room for the MPUB count and lengths.
MAX_MPUB_BYTES = 5 * 1024 * 1024 - 64 * 1024
#: Per-message framing inside an MPUB body (its 4-byte length).
_MPUB_ITEM_OVERHEAD = 4

_log = logging.getLogger(__name__)


class Publisher:
    """Publishes to the first reachable of ``addresses``, starting at ``first``, on connections
    that IDENTIFY as ``client_id`` (None: the host name).

    Connects lazily; the caller must ``close`` it. Raises :class:`NsqError` when
    nsqd rejects a batch (``E_BAD_MESSAGE``, ``E_BAD_TOPIC``, ...) or no address
    accepts a connection.
    """

    __slots__ = ("_addresses", "_next", "_batch_size", "_defer_ms", "_client_id", "_conn", "_unanswered",
                 "_retried", "published")

    def __init__(self, addresses: Sequence[Address], *, batch_size: int, defer_ms: int = 0,
                 first: int = 0, client_id: str | None = None):
        self._addresses = tuple(addresses)
        self._client_id = client_id
        self._next = first % len(self._addresses)
        self._batch_size = batch_size
        self._defer_ms = defer_ms
        self._conn: FramePump | None = None
        # (payload, answers due, messages) of each command sent and not yet answered
        self._unanswered: collections.deque[tuple[bytes, int, int]] = collections.deque()
        self._retried = False  # reconnected since nsqd last answered
        #: Messages acknowledged by nsqd so far.
        self.published = 0

    def publish(self, topic: str, bodies: Sequence[bytes]) -> None:
        """Send ``bodies`` to ``topic`` in batches; some may still await nsqd's answer
        when this returns (see :meth:`flush`)."""
        for start, end in self._slices(bodies):
            self._send_batch(topic, bodies[start:end])

    def flush(self) -> None:
        """Return once nsqd has acknowledged everything sent."""
        self._await_answers(0)

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
            answers = len(bodies)
        else:
            payload = encode_mpub(topic, bodies)
            answers = 1
        self._unanswered.append((payload, answers, len(bodies)))
        try:
            self._connection().send(payload)
        except NsqError as exc:
            self._resend(exc)
        self._await_answers(PIPELINE_DEPTH - 1)

    def _await_answers(self, keep: int) -> None:
        """Read answers until at most ``keep`` commands are unanswered."""
        unanswered = self._unanswered
        while len(unanswered) > keep:
            payload, answers, messages = unanswered[0]
            conn = self._connection()
            try:
                for _ in range(answers):
                    conn.read_response()
            except NsqError as exc:
                self._resend(exc)
                continue
            unanswered.popleft()
            self.published += messages
            self._retried = False

    def _resend(self, exc: NsqError) -> None:
        """After ``exc``: raise it, or reconnect once and send every unanswered command again."""
        failed = self._conn
        self.close()
        if exc.code != "E_CONNECTION" or failed is None or self._retried:
            raise exc
        self._retried = True
        _log.warning("publishing to %s failed (%s); reconnecting", failed.address, exc)
        conn = self._connection()
        try:
            conn.send(b"".join(payload for payload, _, _ in self._unanswered))
        except NsqError:
            self.close()
            raise

    def _connection(self) -> FramePump:
        if self._conn is not None:
            return self._conn
        errors: list[NsqError] = []
        for _ in range(len(self._addresses)):
            address = self._addresses[self._next]
            self._next = (self._next + 1) % len(self._addresses)
            try:
                self._conn = dial(address, {}, self._client_id)
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
