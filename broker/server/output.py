"""One client's output: the bytes queued for its socket and the messages among them.

nsqd writes to each client through a ``bufio.Writer`` of ``output_buffer_size``
bytes; its message pump stops taking messages while a write to a client that
does not read is blocked. pynsqd keeps the same bound on what it holds for a
client, and knows which message frames have not been handed to the socket yet:
a delivery attempt counts only once its frame was (see
:meth:`OutputBuffer.unsent`).

Offsets count bytes since the connection opened: ``queued`` is the offset after
the last byte queued, ``queued - size`` the offset after the last byte handed
to the socket.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from typing import TYPE_CHECKING

from broker.protocol import FRAME_TYPE_MESSAGE, MESSAGE_HEADER_LENGTH, pack_message_frame_header

if TYPE_CHECKING:
    from broker.core.message import Message

__all__ = ["OutputBuffer", "MESSAGE_FRAME_OVERHEAD"]

#: A message frame's bytes around its body: size, frame type, then timestamp, attempts and id.
MESSAGE_FRAME_OVERHEAD = 4 + 4 + MESSAGE_HEADER_LENGTH
#: A message frame's size field: what follows it (frame type, message header, body) less the body.
_FRAME_SIZE = 4 + MESSAGE_HEADER_LENGTH
_PRIORITY = struct.Struct(">I")


class OutputBuffer:
    """Frames queued for one socket, oldest first; owned by its :class:`~broker.server.client.Client`.

    ``chunks`` holds what the writer has not taken yet; ``size`` counts every
    byte not handed to the socket, including a send in progress.
    """

    __slots__ = ("chunks", "size", "queued", "_ends", "_msgs")

    def __init__(self) -> None:
        self.chunks: list[bytes | memoryview] = []
        self.size = 0
        self.queued = 0
        self._ends: list[int] = []  # offset after each message frame not fully handed yet
        self._msgs: list[Message] = []  # the message of each of those frames

    def add(self, frame: bytes) -> None:
        """Queue a response, error or heartbeat frame."""
        self.chunks.append(frame)
        self.size += len(frame)
        self.queued += len(frame)

    def add_messages(self, msgs: list[Message]) -> None:
        """Queue a message frame for each of ``msgs``, with its current attempts."""
        append = self.chunks.append
        end = self._ends.append
        pack = pack_message_frame_header
        pos = start = self.queued
        for msg in msgs:
            body = msg.body
            size = len(body)
            append(pack(_FRAME_SIZE + size, FRAME_TYPE_MESSAGE, msg.timestamp, msg.attempts & 0xFFFF, msg.id))
            append(body)
            pos += MESSAGE_FRAME_OVERHEAD + size
            end(pos)
        self._msgs.extend(msgs)
        self.size += pos - start
        self.queued = pos

    def add_prioritised(self, msgs: list[Message], default: int) -> None:
        """:meth:`add_messages` for a client that negotiated priorities: each body is preceded by
        its priority (``default`` for a message without one), see :mod:`broker.protocol.priorities`."""
        append = self.chunks.append
        end = self._ends.append
        pack = pack_message_frame_header
        pos = start = self.queued
        for msg in msgs:
            body = _PRIORITY.pack(default if msg.priority is None else msg.priority) + msg.body
            size = len(body)
            append(pack(_FRAME_SIZE + size, FRAME_TYPE_MESSAGE, msg.timestamp, msg.attempts & 0xFFFF, msg.id))
            append(body)
            pos += MESSAGE_FRAME_OVERHEAD + size
            end(pos)
        self._msgs.extend(msgs)
        self.size += pos - start
        self.queued = pos

    def take(self) -> bytes | memoryview:
        """Everything not taken yet, as one buffer for one send; the caller reports :meth:`handed`."""
        chunks = self.chunks
        data = b"".join(chunks) if len(chunks) > 1 else chunks[0]
        chunks.clear()
        return data

    def put_back(self, rest: memoryview) -> None:
        """The part of the last :meth:`take` the socket did not accept: it goes first again."""
        self.chunks.insert(0, rest)

    def handed(self, n: int) -> None:
        """The socket accepted ``n`` more bytes."""
        self.size -= n
        if not self.size:
            self._ends.clear()
            self._msgs.clear()
        elif self._ends and n:
            done = bisect_right(self._ends, self.queued - self.size)
            if done:
                del self._ends[:done]
                del self._msgs[:done]

    def unsent(self, msgs: list[Message]) -> list[Message]:
        """Those of ``msgs`` whose frame has not been wholly handed to the socket."""
        if not self._msgs:
            return []
        waiting = set(map(id, self._msgs))
        return [msg for msg in msgs if id(msg) in waiting]
