"""The driver's side of pynsqd's lease extension: one control connection per nsqd and topic.

The connection IDENTIFYs with a lease of its own and SUBs to the channel without
ever sending RDY, so it receives no messages; it asks how many messages the
channel could deliver (``LEASE AVAILABLE``) and finishes the leases of committed
batches (``LEASE FIN <token>``), one pipelined write for many tokens. nsqd has no
such extension: its IDENTIFY answer lacks the ``lease`` field, which
:attr:`LeaseControl.offers_leases` reports.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from broker.client import FramePump
from broker.protocol import LEASE_IDENTIFY_FIELD, encode_lease, encode_sub

from .dial import CONNECT_TIMEOUT_S, NsqError, dial
from .options import Address

__all__ = ["LeaseControl"]

_log = logging.getLogger(__name__)


class LeaseControl:
    """Control connection to ``topic``/``channel`` on ``address``, IDENTIFYing as ``client_id``
    (None: the host name); connects lazily.

    The caller must ``close`` it. A connection that failed (nsqd drops a client
    idle for two heartbeats, e.g. between slow batches) is opened again once per
    request. Raises :class:`NsqError` when nsqd refuses.
    """

    __slots__ = ("address", "topic", "channel", "_token", "_client_id", "_conn", "_lock")

    def __init__(self, address: Address, topic: str, channel: str, token: str, client_id: str | None = None):
        self.address = address
        self.topic = topic
        self.channel = channel
        self._token = token
        self._client_id = client_id
        self._conn: FramePump | None = None
        self._lock = threading.Lock()  # the planning thread and the toucher share it

    @property
    def offers_leases(self) -> bool:
        """Whether the broker echoed the lease: pynsqd does, nsqd does not."""
        with self._lock:
            return self._connection().identity.get(LEASE_IDENTIFY_FIELD) == self._token

    def available(self) -> int:
        """Messages the channel holds ready now (``LEASE AVAILABLE``)."""
        return self._request(encode_lease("AVAILABLE"), 1)[0]

    def finish(self, tokens: Iterable[str]) -> int:
        """Finish every message leased under ``tokens``; returns how many were finished."""
        payload = b"".join(encode_lease("FIN", token) for token in tokens)
        return sum(self._request(payload, payload.count(b"\n"))) if payload else 0

    def requeue(self, tokens: Iterable[str]) -> int:
        """Give back every message leased under ``tokens`` for redelivery now; returns how many."""
        payload = b"".join(encode_lease("REQ", token, 0) for token in tokens)
        return sum(self._request(payload, payload.count(b"\n"))) if payload else 0

    def touch(self, tokens: Iterable[str]) -> int:
        """Restart the timeouts of the messages leased under ``tokens``; returns how many."""
        payload = b"".join(encode_lease("TOUCH", token) for token in tokens)
        return sum(self._request(payload, payload.count(b"\n"))) if payload else 0

    def _request(self, payload: bytes, answers: int) -> list[int]:
        with self._lock:
            return self._request_locked(payload, answers)

    def _request_locked(self, payload: bytes, answers: int) -> list[int]:
        for attempt in (1, 2):
            conn = self._connection()
            try:
                conn.send(payload)
                return [int(conn.read_response()) for _ in range(answers)]
            except NsqError as exc:
                self.close()
                if exc.code != "E_CONNECTION" or attempt == 2:
                    raise
                _log.info("nsq source: control connection to %s lost (%s); reconnecting",
                          self.address, exc)
        raise AssertionError("unreachable")

    def _connection(self) -> FramePump:
        if self._conn is None:
            conn = dial(self.address, {LEASE_IDENTIFY_FIELD: self._token}, self._client_id)
            try:
                conn.send(encode_sub(self.topic, self.channel))
                conn.read_response(CONNECT_TIMEOUT_S)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def close(self) -> None:
        """Close the connection, if open; idempotent."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
