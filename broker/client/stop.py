"""A consumer's clean stop: no message is left to time out, no FIN lost to a reset.

nsqd gives back the in-flight messages of a closed connection only when their
msg_timeout expires. So a consumer that stops sends ``RDY 0`` and ``CLS``, reads
until nsqd's ``CLOSE_WAIT`` (after which nsqd sends no message), REQs everything it
still holds, including messages that arrived meanwhile, and half-closes; reading on
until nsqd closes its side keeps those last commands from being discarded by the
reset a close with unread input would send.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from broker.protocol import (
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    decode_message,
    encode_cls,
    encode_rdy,
    encode_req,
)

from .errors import NsqError
from .pump import FramePump

__all__ = ["stop_delivery"]

_CLOSE_WAIT = b"CLOSE_WAIT"


def stop_delivery(pump: FramePump, held: Callable[[], Iterable[bytes]] = tuple, *, timeout: float) -> None:
    """Stop deliveries on ``pump``, REQ every message it holds and wait for nsqd to close.

    ``held`` is called once nsqd has sent its last message and returns the ids the
    caller still holds (none by default). Run it on the thread that reads ``pump``. Best effort within
    ``timeout`` seconds: a connection that fails meanwhile gives back nothing and its
    messages come back when their msg_timeout expires. The caller still closes ``pump``.
    """
    deadline = time.monotonic() + timeout
    try:
        pump.send(encode_rdy(0) + encode_cls())
        late = []
        waiting = True
        while waiting and time.monotonic() < deadline:
            for frame_type, payload in pump.read(max(0.0, deadline - time.monotonic())):
                if frame_type == FRAME_TYPE_MESSAGE:
                    late.append(decode_message(payload).id)
                elif frame_type == FRAME_TYPE_RESPONSE and payload == _CLOSE_WAIT:
                    waiting = False
        ids = [*held(), *late]
        if ids:
            pump.send(b"".join(encode_req(msg_id, 0) for msg_id in ids))
        pump.shutdown_write()
        while time.monotonic() < deadline:
            pump.read(max(0.0, deadline - time.monotonic()))
    except NsqError:
        pass
