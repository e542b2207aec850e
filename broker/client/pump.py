"""A blocking socket to nsqd read as frames: heartbeats answered, fatal errors raised.

Reads wait in ``poll`` with their own timeout and feed what arrives to the protocol
package's :class:`~broker.protocol.FrameDecoder`; frames come back as ``(frame type,
data)`` pairs, which a reader of many messages can afford where an object per
message would cost it a third of its speed.
"""

from __future__ import annotations

import select
import socket
import threading
import time

from broker.protocol import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_RESPONSE,
    HEARTBEAT_FRAME,
    FrameDecoder,
    encode_nop,
)

from .errors import NsqError

__all__ = ["FramePump", "HEARTBEAT", "RESPONSE_TIMEOUT_S", "MAX_FRAME_SIZE"]

#: The data of the response frame nsqd sends as a heartbeat.
HEARTBEAT = HEARTBEAT_FRAME[8:]
#: How long one request may wait for its response, and a send for nsqd to drain it.
RESPONSE_TIMEOUT_S = 30.0
#: Frames larger than this are garbage: nsqd's limits stay far below it.
MAX_FRAME_SIZE = 64 * 1024 * 1024
#: Bytes asked of the socket per read.
_RECV_SIZE = 256 * 1024
#: How an HTTP server's answer begins; read where nsqd's first frame was due, it means the
#: address is nsqd's HTTP port (its first four bytes would read as a 1.2 GB frame size).
_HTTP_ANSWER = b"HTTP/"
_NOP = encode_nop()
_HEARTBEAT_PAIR = (FRAME_TYPE_RESPONSE, HEARTBEAT)

Frames = list[tuple[int, bytes]]


class FramePump:
    """One connected socket to nsqd at ``address``, read as frames.

    The pump owns ``sock`` and closes it in :meth:`close`. :meth:`send` may be called
    from any thread; reading belongs to one thread at a time. Errors are raised as
    ``error`` (:class:`NsqError` or a subclass that words them for its tool);
    ``http_hint`` describes what it means when an HTTP server answers.
    """

    __slots__ = (
        "address", "identity", "error", "_sock", "_poll", "_decoder", "_pending", "_send_lock", "_closed",
        "_received", "_http_hint",
    )

    def __init__(self, sock: socket.socket, address: object, *, http_hint: str = "answered in HTTP",
                 error: type[NsqError] = NsqError, send_timeout: float = RESPONSE_TIMEOUT_S):
        self.address = address
        #: nsqd's answer to IDENTIFY (empty when it answered a plain ``OK``); set by the handshake.
        self.identity: dict = {}
        self.error = error
        # Reads wait in poll() with their own timeout; the socket's timeout only
        # bounds a send that nsqd does not drain, whichever thread sends.
        sock.settimeout(send_timeout)
        self._sock = sock
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)
        self._decoder = FrameDecoder(MAX_FRAME_SIZE)
        self._pending: Frames = []
        self._send_lock = threading.Lock()
        self._closed = False
        self._received = False
        self._http_hint = http_hint

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def send(self, data: bytes) -> None:
        """Write ``data`` whole; raises ``error`` (``E_CONNECTION``) when the socket fails."""
        try:
            with self._send_lock:
                self._sock.sendall(data)
        except OSError as exc:
            raise self.error(self.address, "E_CONNECTION", f"send failed: {exc}") from exc

    def read(self, timeout: float | None) -> Frames:
        """The frames that arrive within ``timeout`` seconds: at least one, or none on timeout.

        Heartbeats are answered with NOP and not returned; a fatal error frame is
        raised, a non-fatal one (``E_FIN_FAILED``, ...) returned. Raises ``error`` with
        ``E_CONNECTION`` when nsqd closes the connection or the socket fails,
        ``E_BAD_FRAME`` for garbage, ``E_HTTP_PORT`` when the first answer is HTTP.
        """
        if self._pending:
            frames, self._pending = self._pending, []
            return frames
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            data = self._receive(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if not data:
                return []
            frames = self.feed(data)
            if frames:
                return frames

    def feed(self, data: bytes) -> Frames:
        """The frames ``data`` completes, handled as :meth:`read` handles them: for a
        caller that reads the socket itself (see :meth:`take_socket`)."""
        try:
            frames = self._decoder.feed_pairs(data)
        except Exception as exc:
            raise self.error(self.address, "E_BAD_FRAME", str(exc)) from exc
        heartbeats = 0
        for frame_type, payload in frames:
            if frame_type == FRAME_TYPE_RESPONSE:
                heartbeats += payload == HEARTBEAT
            elif frame_type == FRAME_TYPE_ERROR:
                error = self.error.from_frame(self.address, payload)
                if error.fatal:
                    raise error
        if heartbeats:
            self.send(_NOP * heartbeats)
            frames = [frame for frame in frames if frame != _HEARTBEAT_PAIR]
        return frames

    @property
    def buffered(self) -> int:
        """Bytes received of a frame not yet complete."""
        return self._decoder.buffered

    def read_response(self, timeout: float = RESPONSE_TIMEOUT_S) -> bytes:
        """The data of the next response frame; raises ``error`` for an error frame, or
        when none comes within ``timeout`` (``E_TIMEOUT``).

        Only for connections that receive no messages (yet): a message frame here is
        a protocol violation (``E_UNEXPECTED``).
        """
        frames = self.read(timeout)
        if not frames:
            raise self.error(self.address, "E_TIMEOUT", f"no response within {timeout:g}s")
        (frame_type, payload), self._pending = frames[0], frames[1:]
        if frame_type == FRAME_TYPE_ERROR:
            raise self.error.from_frame(self.address, payload)
        if frame_type != FRAME_TYPE_RESPONSE:
            raise self.error(self.address, "E_UNEXPECTED", "a message frame where a response was due")
        return payload

    def _receive(self, timeout: float | None) -> bytes:
        try:
            if not self._poll.poll(None if timeout is None else timeout * 1000):
                return b""
            data = self._sock.recv(_RECV_SIZE)
        except OSError as exc:
            raise self.error(self.address, "E_CONNECTION", f"receive failed: {exc}") from exc
        if not data:
            raise self.error(self.address, "E_CONNECTION", "connection closed by nsqd")
        if not self._received:
            self._received = True
            if _HTTP_ANSWER.startswith(data[:len(_HTTP_ANSWER)]):
                raise self.error(self.address, "E_HTTP_PORT", self._http_hint)
        return data

    def take_socket(self) -> socket.socket:
        """The socket, blocking without a timeout, for a caller that reads it from now on
        and hands what it reads to :meth:`feed`; the pump still owns and closes it."""
        self._sock.settimeout(None)
        return self._sock

    def shutdown_write(self) -> None:
        """Send EOF after what was written, so nsqd reads it all and closes its side.

        Closing a socket with unread input makes the kernel send a reset, which can
        discard commands nsqd has not yet read; a half-close does not.
        """
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        """Close the socket; idempotent and safe from any thread."""
        if self._closed:
            return
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
