"""A blocking NSQ client on the sans-I/O :mod:`broker.protocol`, for tools outside the broker.

The bench tool and the Spark connector open their connections here: :func:`connect`
(TCP, the V2 magic, IDENTIFY), a :class:`FramePump` that reads frames from the
socket, answers heartbeats and raises fatal error frames as :class:`NsqError`, and
:func:`stop_delivery`, a consumer's clean stop. Plain sockets and threads, no trio:
it runs wherever the tools do, Spark's executors included.
"""

from .address import Address
from .errors import NON_FATAL_CODES, NsqError
from .handshake import CONNECT_TIMEOUT_S, connect
from .pump import HEARTBEAT, MAX_FRAME_SIZE, RESPONSE_TIMEOUT_S, FramePump
from .stop import stop_delivery

__all__ = [
    "Address", "NsqError", "NON_FATAL_CODES", "connect", "CONNECT_TIMEOUT_S", "FramePump", "HEARTBEAT",
    "MAX_FRAME_SIZE", "RESPONSE_TIMEOUT_S", "stop_delivery",
]
