"""Publishing batches of messages to nsqd from one Spark task.

Bodies are sent as MPUB commands of at most ``batch_size`` messages (and at most
``MAX_MPUB_BYTES``), pipelined: up to ``PIPELINE_DEPTH`` commands are on the wire
before the publisher waits for the oldest ``OK``, so the socket and nsqd stay busy
while the task encodes the next batch. Deferred messages go one DPUB each. A
connection that fails is replaced and every unanswered command is sent again:
nsqd applies an MPUB whole or not at all, so a resend can only duplicate what an
unanswered MPUB already delivered.

With keys (the sink's ``key`` column) the publisher asks for *keyed publishes*, a
pynsqd extension (:mod:`broker.protocol.keys`): each message goes with its key, and
the broker stores a key once per topic within its ``--dedup-window``, answering
``DUPLICATE`` for a message whose key it already holds. A resend after a lost
connection is then harmless: it goes to the same nsqd first, which drops what the
unanswered commands had already stored. Duplicates count as published, and are
counted apart in :attr:`Publisher.duplicates`. nsqd offers no keyed publishes: a
keyed publisher refuses to publish there rather than silently publish unkeyed.

With priorities (the sink's ``priority`` column) the publisher asks for prioritised
messages, another pynsqd extension (:mod:`broker.protocol.priorities`): each message
goes with its priority, after its key on a connection that is keyed too, and a
message without one goes with the ``default_priority`` the broker's IDENTIFY answer
gives. A prioritised publisher refuses nsqd, which has no priorities, in the same way.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Sequence
from itertools import repeat

from broker.client import FramePump
from broker.protocol import encode_dpub, encode_mpub
from broker.protocol.keys import KEYS_IDENTIFY_FIELD, MAX_KEY_LENGTH, duplicates_in_answer, prefix_key
from broker.protocol.priorities import (
    DEFAULT_PRIORITY_FIELD,
    MAX_PRIORITY,
    PRIORITIES_IDENTIFY_FIELD,
    PRIORITY_SIZE,
    prefix_priority,
)

from .dial import NsqError, dial
from .options import Address

__all__ = ["Publisher", "MAX_MPUB_BYTES", "PIPELINE_DEPTH"]

#: Commands sent ahead of their answers.
PIPELINE_DEPTH = 8

#: nsqd's default --max-body-size (5 MiB) less room for the MPUB count and lengths.
MAX_MPUB_BYTES = 5 * 1024 * 1024 - 64 * 1024
#: Per-message framing inside an MPUB body (its 4-byte length).
_MPUB_ITEM_OVERHEAD = 4
#: What a key adds to a message on a keyed connection, besides the key: its length byte.
_KEY_OVERHEAD = 1

_log = logging.getLogger(__name__)


class Publisher:
    """Publishes to the first reachable of ``addresses``, starting at ``first``, on connections
    that IDENTIFY as ``client_id`` (None: the host name).

    With ``keyed`` the connections ask for keyed publishes and :meth:`publish` takes a key
    per message; with ``prioritised`` they ask for priorities and it takes a priority per
    message. Connects lazily; the caller must ``close`` it. Raises :class:`NsqError`
    when nsqd rejects a batch (``E_BAD_MESSAGE``, ``E_BAD_TOPIC``, ...) or no address
    accepts a connection, and ``ValueError`` when a keyed or prioritised publisher
    reaches an nsqd that has no keyed publishes or no priorities.
    """

    __slots__ = ("_addresses", "_next", "_at", "_batch_size", "_defer_ms", "_client_id", "_keyed", "_prioritised",
                 "_default_priority", "_conn", "_unanswered", "_retried", "published", "duplicates")

    def __init__(self, addresses: Sequence[Address], *, batch_size: int, defer_ms: int = 0,
                 first: int = 0, client_id: str | None = None, keyed: bool = False, prioritised: bool = False):
        self._addresses = tuple(addresses)
        self._client_id = client_id
        self._next = first % len(self._addresses)
        self._at = self._next  # the index of the address of the open (or last) connection
        self._batch_size = batch_size
        self._defer_ms = defer_ms
        self._keyed = keyed
        self._prioritised = prioritised
        self._default_priority = 0  # the broker's, from the IDENTIFY answer of a prioritised connection
        self._conn: FramePump | None = None
        # (payload, answers due, messages) of each command sent and not yet answered
        self._unanswered: collections.deque[tuple[bytes, int, int]] = collections.deque()
        self._retried = False  # reconnected since nsqd last answered
        #: Messages acknowledged by nsqd so far (duplicates included).
        self.published = 0
        #: Of those, the keyed ones nsqd did not store: their key was stored already.
        self.duplicates = 0

    def publish(self, topic: str, bodies: Sequence[bytes], keys: Sequence[bytes | None] | None = None,
                priorities: Sequence[int | None] | None = None) -> None:
        """Send ``bodies`` to ``topic`` in batches; some may still await nsqd's answer
        when this returns (see :meth:`flush`).

        ``keys`` (a keyed publisher only) gives each body's key, None for an unkeyed one;
        a key is 1 to ``MAX_KEY_LENGTH`` bytes, else ValueError. ``priorities`` (a
        prioritised publisher only) gives each body's priority, 0 to ``MAX_PRIORITY``
        (else ValueError), None for the broker's default.
        """
        if keys is not None:
            if not self._keyed:
                raise ValueError("keys given to a publisher made without keyed=True")
            if len(keys) != len(bodies):
                raise ValueError(f"{len(keys)} keys for {len(bodies)} bodies")
        if priorities is not None:
            if not self._prioritised:
                raise ValueError("priorities given to a publisher made without prioritised=True")
            if len(priorities) != len(bodies):
                raise ValueError(f"{len(priorities)} priorities for {len(bodies)} bodies")
        for start, end in self._slices(bodies, keys, priorities):
            self._send_batch(topic, bodies[start:end], None if keys is None else keys[start:end],
                             None if priorities is None else priorities[start:end])

    def flush(self) -> None:
        """Return once nsqd has acknowledged everything sent."""
        self._await_answers(0)

    def _slices(self, bodies: Sequence[bytes], keys: Sequence[bytes | None] | None,
                priorities: Sequence[int | None] | None):
        start, size, count = 0, 0, 0
        overhead = (_MPUB_ITEM_OVERHEAD + (_KEY_OVERHEAD if self._keyed else 0)
                    + (PRIORITY_SIZE if self._prioritised else 0))
        for index, body in enumerate(bodies):
            if not body:
                raise ValueError(
                    "nsq data source: cannot publish an empty or null body (nsqd rejects them)"
                )
            item = len(body) + overhead
            if keys is not None and (key := keys[index]) is not None:
                if not 0 < len(key) <= MAX_KEY_LENGTH:
                    raise ValueError(
                        f"nsq data source: a 'key' must be 1 to {MAX_KEY_LENGTH} bytes (a string's UTF-8) "
                        f"or null, got {'an empty one' if not key else f'{len(key)} bytes'}"
                    )
                item += len(key)
            if priorities is not None and (priority := priorities[index]) is not None \
                    and not 0 <= priority <= MAX_PRIORITY:
                raise ValueError(
                    f"nsq data source: a 'priority' must be 0 to {MAX_PRIORITY} or null, got {priority}"
                )
            if count and (count == self._batch_size or size + item > MAX_MPUB_BYTES):
                yield start, index
                start, size, count = index, 0, 0
            size += item
            count += 1
        if count:
            yield start, len(bodies)

    def _send_batch(self, topic: str, bodies: Sequence[bytes], keys: Sequence[bytes | None] | None,
                    priorities: Sequence[int | None] | None) -> None:
        if self._prioritised:
            # on a prioritised connection every message carries a priority: the broker's
            # default for none (that of the broker this connects to; a resend elsewhere keeps it)
            self._connection()
            default = self._default_priority
            bodies = [prefix_priority(default if priority is None else priority, body)
                      for priority, body in zip(priorities or repeat(None), bodies)]
        if self._keyed:
            # on a keyed connection every message carries a key length, 0 for none
            bodies = [prefix_key(key, body) for key, body in zip(keys or repeat(None), bodies)]
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
            duplicates = 0
            try:
                for _ in range(answers):
                    answer = conn.read_response()
                    if self._keyed:
                        duplicates += self._duplicates(conn, answer)
            except NsqError as exc:
                self._resend(exc)
                continue
            unanswered.popleft()
            self.published += messages
            self.duplicates += duplicates
            self._retried = False

    @staticmethod
    def _duplicates(conn: FramePump, answer: bytes) -> int:
        """The duplicates a keyed publish's ``answer`` reports; NsqError when it is no such answer."""
        try:
            return duplicates_in_answer(answer)
        except ValueError as exc:
            raise NsqError(conn.address, "E_UNEXPECTED", str(exc)) from exc

    def _resend(self, exc: NsqError) -> None:
        """After ``exc``: raise it, or reconnect once and send every unanswered command again.

        Unkeyed, the new connection goes to the next address. Keyed, it goes to the same
        nsqd first: there the resent messages whose first sending was stored are dropped
        as duplicates, where another nsqd would store them a second time (a node of a
        pynsqd cluster with ``--replicas`` knows them too: the keys travel with the copies).
        """
        failed = self._conn
        self.close()
        if exc.code != "E_CONNECTION" or failed is None or self._retried:
            raise exc
        self._retried = True
        _log.warning("publishing to %s failed (%s); reconnecting", failed.address, exc)
        if self._keyed:
            self._next = self._at
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
        identify: dict[str, bool] = {}
        if self._keyed:
            identify[KEYS_IDENTIFY_FIELD] = True
        if self._prioritised:
            identify[PRIORITIES_IDENTIFY_FIELD] = True
        for _ in range(len(self._addresses)):
            index = self._next
            address = self._addresses[index]
            self._next = (index + 1) % len(self._addresses)
            try:
                conn = dial(address, identify, self._client_id)
            except NsqError as exc:
                errors.append(exc)
                continue
            if self._keyed and conn.identity.get(KEYS_IDENTIFY_FIELD) is not True:
                conn.close()
                raise ValueError(f"nsq data source: the 'key' column needs keyed publishes, which {address} "
                                 "does not offer (nsqd has none; pynsqd has them)")
            if self._prioritised:
                self._default_priority = self._broker_default(conn)
            self._conn, self._at = conn, index
            return conn
        if len(errors) == 1:
            raise errors[0]
        raise NsqError(errors[0].address, "E_CONNECTION", "no nsqd accepts a connection: " + "; ".join(
            f"{exc.address} {exc.description}" for exc in errors))

    @staticmethod
    def _broker_default(conn: FramePump) -> int:
        """The default priority of the broker ``conn`` is to, which must offer priorities;
        closes ``conn`` and raises ValueError (nsqd) or NsqError (a malformed answer) otherwise."""
        if conn.identity.get(PRIORITIES_IDENTIFY_FIELD) is not True:
            conn.close()
            raise ValueError(f"nsq data source: the 'priority' column needs prioritised messages, which "
                             f"{conn.address} does not offer (nsqd has none; pynsqd has them)")
        default = conn.identity.get(DEFAULT_PRIORITY_FIELD)
        if isinstance(default, bool) or not isinstance(default, int) or not 0 <= default <= MAX_PRIORITY:
            conn.close()
            raise NsqError(conn.address, "E_UNEXPECTED", f"IDENTIFY answered priorities with "
                           f"{DEFAULT_PRIORITY_FIELD} {default!r}, not a priority")
        return default

    def close(self) -> None:
        """Close the connection, if any; idempotent."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
