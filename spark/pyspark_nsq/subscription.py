"""A consumer connection that keeps its messages in flight until told otherwise.

The streaming source holds messages from the moment they arrive until Spark has
committed the batch that contains them, which may be longer than nsqd's
msg_timeout. A daemon thread per connection therefore reads frames as they come
(its pump answers heartbeats), queues messages in ``inbox`` and TOUCHes every message
still held once half of the negotiated msg_timeout has passed since it arrived or
was last touched. The owner FINs or REQs messages from its own thread.

nsqd does not give back the in-flight messages of a connection that closes; they
come back when their msg_timeout expires. ``close`` therefore has the thread stop
delivery and REQ everything still held (:func:`broker.client.stop_delivery`) before
the connection closes, so a clean stop hands the messages to the next consumer at
once; after a crash they return on timeout.

A subscription asks for priorities (a pynsqd extension, see
:mod:`broker.protocol.priorities`); on a broker that grants them each message frame's
body starts with the message's priority, which the thread cuts off into
:attr:`Message.priority`. From nsqd, which ignores the request, it is None.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Iterable
from typing import NamedTuple

from broker.client import FramePump, stop_delivery
from broker.protocol import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    decode_message,
    encode_fin,
    encode_rdy,
    encode_req,
    encode_sub,
    encode_touch,
)
from broker.protocol.priorities import PRIORITIES_IDENTIFY_FIELD, split_priority

from .dial import CONNECT_TIMEOUT_S, NsqError, dial
from .options import Address

__all__ = ["Subscription", "Message"]

#: The reader thread wakes at least this often to send due TOUCHes and to see a stop asked for.
_TICK_S = 0.25
#: How long a clean stop may take: nsqd's CLOSE_WAIT, the REQs, nsqd closing its side.
_STOP_S = 4.0

_log = logging.getLogger(__name__)


class Message(NamedTuple):
    """A message a subscription received: its frame's fields (``body`` without a priority),
    and its priority when the broker sends priorities, else None."""

    timestamp: int
    attempts: int
    id: bytes
    body: bytes
    priority: int | None


def decode(payload: bytes, prioritised: bool) -> Message:
    """The message in a message frame's ``payload``, from a connection that negotiated
    priorities or not; raises ProtocolError or ValueError when it is too short."""
    timestamp, attempts, msg_id, body = decode_message(payload)
    if not prioritised:
        return Message(timestamp, attempts, msg_id, body, None)
    priority, body = split_priority(body)
    return Message(timestamp, attempts, msg_id, body, priority)


class Subscription:
    """One SUB to ``topic``/``channel`` on one nsqd, serviced by a daemon thread.

    ``start`` connects and subscribes (raises :class:`NsqError`); the owner must
    ``close`` it. Received messages appear in ``inbox`` (a deque the owner pops
    from); each stays held, and touched, until ``fin`` or ``req`` names it.
    """

    __slots__ = (
        "address", "topic", "channel", "inbox", "error", "prioritised",
        "_identify", "_rdy", "_conn", "_thread", "_lock", "_held", "_touch_s", "_stopping",
    )

    def __init__(self, address: Address, topic: str, channel: str, *, max_in_flight: int,
                 msg_timeout_ms: int):
        self.address = address
        self.topic = topic
        self.channel = channel
        self.inbox: collections.deque[Message] = collections.deque()
        #: Why the connection ended, when it ended unasked.
        self.error: NsqError | None = None
        #: Whether the broker sends priorities (pynsqd); known once started.
        self.prioritised = False
        self._identify = {"msg_timeout": msg_timeout_ms, PRIORITIES_IDENTIFY_FIELD: True}
        self._rdy = max_in_flight
        self._conn: FramePump | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # msg id -> monotonic time of its next TOUCH; insertion order is due order
        # because every entry is (re)inserted with the same interval.
        self._held: dict[bytes, float] = {}
        self._touch_s = msg_timeout_ms / 2000
        self._stopping = threading.Event()

    def start(self) -> None:
        """Connect, IDENTIFY, SUB and open the RDY window; raises :class:`NsqError`."""
        conn = dial(self.address, self._identify)
        try:
            self.prioritised = conn.identity.get(PRIORITIES_IDENTIFY_FIELD) is True
            msg_timeout = conn.identity.get("msg_timeout")
            if isinstance(msg_timeout, int) and msg_timeout > 0:
                self._touch_s = msg_timeout / 2000
            max_rdy = conn.identity.get("max_rdy_count")
            if isinstance(max_rdy, int) and 0 < max_rdy < self._rdy:
                self._rdy = max_rdy
            conn.send(encode_sub(self.topic, self.channel))
            conn.read_response(CONNECT_TIMEOUT_S)
            conn.send(encode_rdy(self._rdy))
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self._thread = threading.Thread(
            target=self._run, name=f"nsq-sub-{self.address}-{self.topic}", daemon=True
        )
        self._thread.start()

    @property
    def window(self) -> int:
        """The RDY count in effect: how many messages nsqd keeps in flight to us at most."""
        return self._rdy

    @property
    def held(self) -> int:
        """Messages received and neither FIN'd nor REQ'd."""
        return len(self._held)

    def fin(self, ids: Iterable[bytes]) -> None:
        """FIN the messages ``ids``; a dead connection drops them silently (nsqd requeues)."""
        self._finish(ids, encode_fin)

    def req(self, ids: Iterable[bytes], delay_ms: int = 0) -> None:
        """REQ the messages ``ids`` with ``delay_ms``; a dead connection drops them."""
        self._finish(ids, lambda msg_id: encode_req(msg_id, delay_ms))

    def _finish(self, ids: Iterable[bytes], encode) -> None:
        with self._lock:
            ids = [msg_id for msg_id in ids if self._held.pop(msg_id, None) is not None]
        if ids and self._conn is not None and self.error is None:
            try:
                self._conn.send(b"".join(map(encode, ids)))
            except NsqError as exc:
                self._fail(exc)

    def _fail(self, exc: NsqError) -> None:
        if self.error is None and not self._stopping.is_set():
            self.error = exc
            _log.warning("nsq subscription %s/%s on %s ended: %s",
                         self.topic, self.channel, self.address, exc)
        if self._conn is not None:
            self._conn.close()

    def _run(self) -> None:
        conn = self._conn
        assert conn is not None  # started only after start() connected
        try:
            while not self._stopping.is_set():
                for frame_type, payload in conn.read(_TICK_S):
                    self._on_frame(frame_type, payload)
                self._touch_due()
        except NsqError as exc:
            self._fail(exc)
            return
        except Exception as exc:  # a bug must end the subscription visibly, not silently
            self._fail(NsqError(self.address, "E_INTERNAL", repr(exc)))
            return
        stop_delivery(conn, self._take_held, timeout=_STOP_S)

    def _on_frame(self, frame_type: int, payload: bytes) -> None:
        if frame_type == FRAME_TYPE_MESSAGE:
            message = decode(payload, self.prioritised)
            with self._lock:
                self._held[message.id] = time.monotonic() + self._touch_s
            self.inbox.append(message)
        elif frame_type == FRAME_TYPE_ERROR:
            # E_FIN_FAILED etc.: the message timed out and went to another consumer
            # (the pump raises the fatal errors).
            _log.info("%s", NsqError.from_frame(self.address, payload))

    def _take_held(self) -> list[bytes]:
        with self._lock:
            ids, self._held = list(self._held), {}
        return ids

    def _touch_due(self) -> None:
        now = time.monotonic()
        due = []
        with self._lock:
            for msg_id, deadline in self._held.items():
                if deadline > now:
                    break
                due.append(msg_id)
            for msg_id in due:
                del self._held[msg_id]
                self._held[msg_id] = now + self._touch_s
        if due:
            conn = self._conn
            assert conn is not None  # called from _run, which holds the connection
            conn.send(b"".join(map(encode_touch, due)))

    def begin_close(self) -> None:
        """Ask the thread to stop delivery and REQ every held message, without waiting:
        closing many subscriptions, ask each first, then :meth:`close` each."""
        self._stopping.set()

    def close(self) -> None:
        """Stop delivery, REQ every held message, close; idempotent.

        Waits for the thread, which does the stopping (up to a tick to notice, then
        until nsqd has closed its side).
        """
        self._stopping.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(_STOP_S + 2 * _TICK_S)
        if self._conn is not None:
            self._conn.close()
