"""One benchmark connection: blocking set-up before the timed run.

Connecting, IDENTIFY and SUB happen before the start signal, with ordinary
blocking socket calls and the protocol package's encoders and frame decoder;
the timed loops in writer.py and reader.py then take over the socket.
"""

from __future__ import annotations

import json
import socket

from broker.protocol import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_RESPONSE,
    MAGIC_V2,
    FrameDecoder,
    encode_identify,
    encode_nop,
    encode_sub,
)

__all__ = ["BenchConnection", "ServerError", "HEARTBEAT", "USER_AGENT"]

USER_AGENT = "pynsqd-bench"
HEARTBEAT = b"_heartbeat_"
CONNECT_TIMEOUT = 10.0
_RECV_SIZE = 65536
# upgrades this tool does not implement; asking for them would garble the stream
_UNSUPPORTED_IDENTIFY = ("tls_v1", "snappy", "deflate")
# How an HTTP answer begins: the address given is nsqd's HTTP port.
_HTTP_ANSWER = b"HTTP/"


class ServerError(Exception):
    """The server answered with an error frame or closed the connection."""


class BenchConnection:
    """A connected, identified V2 socket (blocking until the timed loop takes it over).

    The caller owns the socket and closes it with ``close()``.
    """

    __slots__ = ("sock", "server_info", "_decoder", "_frames", "_peer", "_received")

    def __init__(self, sock: socket.socket, peer: str = ""):
        self.sock = sock
        self.server_info: dict = {}
        self._decoder = FrameDecoder()
        self._frames: list = []
        self._peer = peer  # host:port, for errors
        self._received = False

    @classmethod
    def open(cls, host: str, port: int, client_id: str, identify: dict) -> BenchConnection:
        """Connect, send the magic and IDENTIFY, and wait for its answer.

        Raises OSError when the server cannot be reached, ServerError when it refuses.
        """
        for key in _UNSUPPORTED_IDENTIFY:
            if identify.get(key):
                raise ValueError(f"IDENTIFY {key} is not supported by the benchmark tool")
        sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT)
        conn = cls(sock, f"{host}:{port}")
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            params = {
                "client_id": client_id,
                "hostname": socket.gethostname(),
                "user_agent": USER_AGENT,
                "feature_negotiation": True,
                **identify,
            }
            sock.sendall(MAGIC_V2 + encode_identify(params))
            answer = conn.read_response()
            if answer != b"OK":
                conn.server_info = json.loads(answer)
        except BaseException:
            sock.close()
            raise
        return conn

    def subscribe(self, topic: str, channel: str) -> None:
        """SUB and wait for OK; raises ServerError."""
        self.sock.sendall(encode_sub(topic, channel))
        answer = self.read_response()
        if answer != b"OK":
            raise ServerError(f"SUB {topic} {channel}: unexpected answer {answer!r}")

    def read_response(self) -> bytes:
        """The next response frame's data, answering heartbeats on the way.

        Raises ServerError on an error frame, when the server closes, or when it answers
        in HTTP (the address is nsqd's HTTP port).
        """
        while True:
            while self._frames:
                frame = self._frames.pop(0)
                if frame.frame_type == FRAME_TYPE_ERROR:
                    raise ServerError(frame.data.decode("utf-8", "replace"))
                if frame.frame_type != FRAME_TYPE_RESPONSE:
                    raise ServerError(f"unexpected frame type {frame.frame_type} during set-up")
                if frame.data == HEARTBEAT:
                    self.sock.sendall(encode_nop())
                    continue
                return frame.data
            data = self.sock.recv(_RECV_SIZE)
            if not data:
                raise ServerError("connection closed by the server")
            if not self._received:
                self._received = True
                if _HTTP_ANSWER.startswith(data[:len(_HTTP_ANSWER)]):
                    raise ServerError(f"{self._peer} answered in HTTP: this is the HTTP port; "
                                      "--nsqd-tcp-address wants the TCP port (4150 by default)")
            self._frames.extend(self._decoder.feed(data))

    def take_over(self) -> socket.socket:
        """The socket, in blocking mode without timeout, for a timed loop."""
        self.sock.settimeout(None)
        return self.sock

    def close(self) -> None:
        """Close the socket; safe to call twice."""
        self.sock.close()
