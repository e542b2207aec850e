"""A blocking client connection to one nsqd, on the broker's sans-I/O protocol.

The socket, the magic, IDENTIFY and frame reading live here; what to send is up
to the publisher and the subscriber built on top. Heartbeats are answered
wherever frames are read, so a connection that is read now and then stays alive.
"""

from __future__ import annotations

import json
import select
import socket
import threading
from typing import Any

from broker.protocol import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_RESPONSE,
    MAGIC_V2,
    Frame,
    FrameDecoder,
    encode_identify,
    encode_nop,
)

from . import __version__
from .options import Address

__all__ = ["Connection", "NsqError", "CONNECT_TIMEOUT_S"]

#: How long opening a connection (TCP connect, IDENTIFY) may take.
CONNECT_TIMEOUT_S = 10.0
#: How long one request (e.g. an MPUB) may wait for its response.
RESPONSE_TIMEOUT_S = 30.0
#: Bytes asked of the socket per read.
_RECV_SIZE = 256 * 1024
#: Frames larger than this are garbage: nsqd's limits stay far below it.
_MAX_FRAME_SIZE = 64 * 1024 * 1024

_HEARTBEAT = b"_heartbeat_"
#: How an HTTP server's answer begins; read where nsqd's first frame was due, it means the
#: address is nsqd's HTTP port (its first four bytes would read as a 1.2 GB frame size).
_HTTP_ANSWER = b"HTTP/"
_HTTP_PORT_HINT = "answered in HTTP: this is the HTTP port; the nsqd option wants the TCP port (4150 by default)"
_NON_FATAL = frozenset({"E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"})


class NsqError(Exception):
    """nsqd answered with an error frame, or the connection failed.

    ``code`` is nsqd's ``E_*`` code (``"E_CONNECTION"`` when the socket failed),
    ``fatal`` says whether nsqd closes the connection after it.
    """

    def __init__(self, address: Address, code: str, description: str = ""):
        self.address = address
        self.code = code
        self.description = description
        self.fatal = code not in _NON_FATAL
        super().__init__(f"nsqd {address}: {code} {description}".rstrip())

    @classmethod
    def from_frame(cls, address: Address, data: bytes) -> NsqError:
        """Build the error an error frame's payload describes."""
        code, _, description = data.decode("utf-8", "replace").partition(" ")
        return cls(address, code, description)


class Connection:
    """One TCP connection to nsqd speaking protocol V2.

    ``open`` connects, sends the magic and IDENTIFY; the caller owns the result and
    must ``close`` it. ``send`` may be called from any thread; reading belongs to
    one thread at a time.
    """

    __slots__ = (
        "address", "identity", "_sock", "_poll", "_decoder", "_pending", "_send_lock", "_closed", "_received"
    )

    def __init__(self, address: Address, sock: socket.socket):
        self.address = address
        self.identity: dict[str, Any] = {}
        # Reads wait in poll() with their own timeout; the socket's timeout only
        # bounds a send that nsqd does not drain, whichever thread sends.
        sock.settimeout(RESPONSE_TIMEOUT_S)
        self._sock = sock
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)
        self._decoder = FrameDecoder(_MAX_FRAME_SIZE)
        self._pending: list[Frame] = []
        self._send_lock = threading.Lock()
        self._closed = False
        self._received = False

    @classmethod
    def open(cls, address: Address, identify: dict[str, Any]) -> Connection:
        """Connect to ``address`` and IDENTIFY with ``identify``.

        ``identity`` holds nsqd's feature-negotiation answer afterwards (empty when
        nsqd answered a plain ``OK``). Raises :class:`NsqError` when the connection
        or IDENTIFY fails.
        """
        try:
            sock = socket.create_connection((address.host, address.port), CONNECT_TIMEOUT_S)
        except OSError as exc:
            raise NsqError(address, "E_CONNECTION", f"cannot connect: {exc}") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = cls(address, sock)
        try:
            params = {
                "client_id": socket.gethostname(),
                "hostname": socket.gethostname(),
                "user_agent": f"pyspark_nsq/{__version__}",
                "feature_negotiation": True,
                **identify,
            }
            conn.send(MAGIC_V2 + encode_identify(params))
            answer = conn.read_response(CONNECT_TIMEOUT_S)
            if answer != b"OK":
                conn.identity = json.loads(answer)
        except BaseException:
            conn.close()
            raise
        return conn

    @property
    def closed(self) -> bool:
        """True once ``close`` was called."""
        return self._closed

    def send(self, data: bytes) -> None:
        """Write ``data`` whole; raises :class:`NsqError` when the socket fails."""
        try:
            with self._send_lock:
                self._sock.sendall(data)
        except OSError as exc:
            raise NsqError(self.address, "E_CONNECTION", f"send failed: {exc}") from exc

    def read_frames(self, timeout: float | None) -> list[Frame]:
        """Frames that arrive within ``timeout`` seconds (at least one, or none on timeout).

        Heartbeats are answered with NOP and not returned. Raises
        :class:`NsqError` when nsqd closes the connection or sends garbage, with
        code ``E_HTTP_PORT`` when the first answer is HTTP (the address is nsqd's
        HTTP port, not its TCP port).
        """
        if self._pending:
            frames, self._pending = self._pending, []
            return frames
        while True:
            try:
                if not self._poll.poll(None if timeout is None else timeout * 1000):
                    return []
                data = self._sock.recv(_RECV_SIZE)
            except OSError as exc:
                raise NsqError(self.address, "E_CONNECTION", f"receive failed: {exc}") from exc
            if not data:
                raise NsqError(self.address, "E_CONNECTION", "connection closed by nsqd")
            if not self._received:
                self._received = True
                if _HTTP_ANSWER.startswith(data[:len(_HTTP_ANSWER)]):
                    raise NsqError(self.address, "E_HTTP_PORT", _HTTP_PORT_HINT)
            try:
                frames = self._decoder.feed(data)
            except Exception as exc:
                raise NsqError(self.address, "E_BAD_FRAME", str(exc)) from exc
            kept = []
            for frame in frames:
                if frame.frame_type == FRAME_TYPE_RESPONSE and frame.data == _HEARTBEAT:
                    self.send(encode_nop())
                else:
                    kept.append(frame)
            if kept:
                return kept

    def read_raw(self, timeout: float | None) -> bytes:
        """The next bytes from nsqd, undecoded (``b""`` on timeout), for a caller that
        parses frames itself; only once nothing was left undelivered by :meth:`read_frames`.

        Raises :class:`NsqError` when nsqd closes the connection or the socket fails.
        """
        if self._pending:
            raise RuntimeError("frames already decoded are pending; read them with read_frames")
        try:
            if not self._poll.poll(None if timeout is None else timeout * 1000):
                return b""
            data = self._sock.recv(_RECV_SIZE)
        except OSError as exc:
            raise NsqError(self.address, "E_CONNECTION", f"receive failed: {exc}") from exc
        if not data:
            raise NsqError(self.address, "E_CONNECTION", "connection closed by nsqd")
        return data

    def read_response(self, timeout: float = RESPONSE_TIMEOUT_S) -> bytes:
        """The data of the next response frame; raises :class:`NsqError` on an error frame.

        Only for connections that receive no messages (yet): a message frame here
        is a protocol violation.
        """
        frames = self.read_frames(timeout)
        if not frames:
            raise NsqError(self.address, "E_TIMEOUT", f"no response within {timeout:g}s")
        first, self._pending = frames[0], frames[1:]
        if first.frame_type == FRAME_TYPE_ERROR:
            raise NsqError.from_frame(self.address, first.data)
        if first.frame_type != FRAME_TYPE_RESPONSE:
            raise NsqError(self.address, "E_UNEXPECTED", "a message frame where a response was due")
        return first.data

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
