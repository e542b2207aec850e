"""Server-to-client frames: encoders (server side) and a decoder (client side).

Layout (``internal/protocol/protocol.go`` ``SendFramedResponse``)::

    [4-byte big-endian size][4-byte big-endian frame type][data]

where ``size = len(data) + 4`` (it covers the frame type). A message frame's
data is ``[8-byte int64 timestamp ns][2-byte uint16 attempts][16-byte id][body]``
(``nsqd/message.go`` ``WriteTo``).
"""

from __future__ import annotations

import struct
from copy import copy
from typing import NamedTuple

from .errors import ProtocolError
from .limits import DEFAULT_MAX_MSG_SIZE

__all__ = [
    "MAGIC_V2",
    "FRAME_TYPE_RESPONSE",
    "FRAME_TYPE_ERROR",
    "FRAME_TYPE_MESSAGE",
    "MSG_ID_LENGTH",
    "MESSAGE_HEADER_LENGTH",
    "MAX_ATTEMPTS",
    "DEFAULT_MAX_FRAME_SIZE",
    "Frame",
    "MessageFrame",
    "FrameDecoder",
    "encode_frame",
    "encode_response",
    "encode_error",
    "encode_message_frame",
    "message_frame_header",
    "pack_message_frame_header",
    "decode_message",
    "OK_FRAME",
    "CLOSE_WAIT_FRAME",
    "HEARTBEAT_FRAME",
    "BAD_PROTOCOL_FRAME",
]

MAGIC_V2 = b"  V2"
FRAME_TYPE_RESPONSE, FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE = 0, 1, 2
MSG_ID_LENGTH = 16
#: The most attempts a message frame can report (a uint16), and so the highest dead-letter limit.
MAX_ATTEMPTS = 0xFFFF
#: timestamp + attempts + id: the bytes of a message frame's data before the body.
MESSAGE_HEADER_LENGTH = 8 + 2 + MSG_ID_LENGTH
#: A frame carrying the largest default message: frame type + message header + body.
DEFAULT_MAX_FRAME_SIZE = 4 + MESSAGE_HEADER_LENGTH + DEFAULT_MAX_MSG_SIZE

_FRAME_HEADER = struct.Struct(">II")
_SIZE_AND_TYPE = struct.Struct(">Ii")
_MESSAGE_FRAME_HEADER = struct.Struct(">IIqH16s")
_MESSAGE_HEADER = struct.Struct(">qH")
_VALID_FRAME_TYPES = (FRAME_TYPE_RESPONSE, FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE)


class Frame(NamedTuple):
    """One decoded frame: its type and its data (the payload after the type)."""

    frame_type: int
    data: bytes


class MessageFrame(NamedTuple):
    """The data of a message frame, decoded."""

    timestamp: int
    attempts: int
    id: bytes
    body: bytes


def encode_frame(frame_type: int, data: bytes) -> bytes:
    """``[size][frame type][data]`` with ``size = len(data) + 4``."""
    return _FRAME_HEADER.pack(len(data) + 4, frame_type) + data


def encode_response(data: bytes) -> bytes:
    """A response frame (type 0): ``OK``, ``CLOSE_WAIT``, JSON, ``_heartbeat_``."""
    return _FRAME_HEADER.pack(len(data) + 4, FRAME_TYPE_RESPONSE) + data


def encode_error(payload: bytes) -> bytes:
    """An error frame (type 1) carrying a :attr:`ProtocolError.payload`."""
    return _FRAME_HEADER.pack(len(payload) + 4, FRAME_TYPE_ERROR) + payload


#: ``pack_message_frame_header(body_len + 4 + MESSAGE_HEADER_LENGTH, FRAME_TYPE_MESSAGE, timestamp_ns,
#: attempts & 0xFFFF, msg_id)`` is :func:`message_frame_header` without the call and the id check,
#: for a caller whose ids are 16 bytes by construction (a broker's messages).
pack_message_frame_header = _MESSAGE_FRAME_HEADER.pack


def message_frame_header(timestamp_ns: int, attempts: int, msg_id: bytes, body_len: int) -> bytes:
    """The 34 bytes that precede a message body on the wire.

    ``header + body`` is the whole frame, so a caller can hand both to one
    vectored write without copying the body. ``attempts`` wraps at 2**16 as
    nsqd's ``uint16`` does. Raises ValueError unless ``msg_id`` is 16 bytes.
    """
    if len(msg_id) != MSG_ID_LENGTH:
        raise ValueError(f"message id must be {MSG_ID_LENGTH} bytes, got {len(msg_id)}")
    return _MESSAGE_FRAME_HEADER.pack(
        body_len + 4 + MESSAGE_HEADER_LENGTH, FRAME_TYPE_MESSAGE, timestamp_ns, attempts & 0xFFFF, msg_id
    )


def encode_message_frame(timestamp_ns: int, attempts: int, msg_id: bytes, body: bytes) -> bytes:
    """A whole message frame (type 2)."""
    return message_frame_header(timestamp_ns, attempts, msg_id, len(body)) + body


OK_FRAME = encode_response(b"OK")
CLOSE_WAIT_FRAME = encode_response(b"CLOSE_WAIT")
HEARTBEAT_FRAME = encode_response(b"_heartbeat_")
#: What nsqd writes before closing a connection whose magic is not ``"  V2"``
#: (``nsqd/tcp.go``): an error frame with the bare code, no description.
BAD_PROTOCOL_FRAME = encode_error(b"E_BAD_PROTOCOL")


def decode_message(data: bytes) -> MessageFrame:
    """Decode a message frame's data; raises ProtocolError if shorter than 26 bytes."""
    if len(data) < MESSAGE_HEADER_LENGTH:
        raise ProtocolError("E_BAD_MESSAGE", "not enough data to decode valid message")
    timestamp, attempts = _MESSAGE_HEADER.unpack_from(data)
    return MessageFrame(timestamp, attempts, bytes(data[10:MESSAGE_HEADER_LENGTH]), bytes(data[MESSAGE_HEADER_LENGTH:]))


class FrameDecoder:
    """Client side: bytes from the server in, complete frames out.

    A frame whose size field exceeds ``max_frame_size`` is rejected as soon as
    its 4 size bytes arrive, so the decoder never buffers more than one
    bounded frame. Malformed input (size below 4, unknown frame type) raises a
    fatal ProtocolError with code ``E_BAD_FRAME``; once raised, every later
    :meth:`feed` raises it again.
    """

    __slots__ = ("max_frame_size", "_buf", "_error")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE):
        self.max_frame_size = max_frame_size
        self._buf = bytearray()
        self._error: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held of a frame not yet complete."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[Frame]:
        """Buffer ``data`` and return every frame it completes, in order."""
        return [Frame(frame_type, payload) for frame_type, payload in self.feed_pairs(data)]

    def feed_pairs(self, data: bytes) -> list[tuple[int, bytes]]:
        """:meth:`feed`, as ``(frame type, data)`` pairs: a tuple costs a fifteenth of a
        :class:`Frame`, which matters to a client reading hundreds of thousands of messages a second."""
        if self._error is not None:
            raise copy(self._error)
        buf = self._buf
        buf += data
        frames: list[tuple[int, bytes]] = []
        append = frames.append
        end = len(buf)
        pos = 0
        try:
            while end - pos >= 4:
                if end - pos >= 8:
                    size, frame_type = _SIZE_AND_TYPE.unpack_from(buf, pos)
                else:  # the size alone is enough to reject an oversized frame early
                    size, frame_type = int.from_bytes(buf[pos:pos + 4], "big"), None
                if size < 4:
                    raise ProtocolError("E_BAD_FRAME", f"frame size {size} is too small")
                if size > self.max_frame_size:
                    raise ProtocolError("E_BAD_FRAME", f"frame size {size} > {self.max_frame_size}")
                if frame_type is None:
                    break
                if frame_type not in _VALID_FRAME_TYPES:
                    raise ProtocolError("E_BAD_FRAME", f"invalid frame type {frame_type}")
                stop = pos + 4 + size
                if stop > end:
                    break
                append((frame_type, bytes(buf[pos + 8:stop])))
                pos = stop
        except ProtocolError as exc:
            self._error = copy(exc)  # without its traceback, whose frames hold this decoder
            if not frames:
                raise
        del buf[:pos]
        return frames
