"""Opening a benchmark connection: blocking set-up before the timed run.

Connecting, IDENTIFY and SUB happen before the start signal, on the shared blocking
client (:mod:`broker.client`); the timed loops in writer.py and reader.py then take
over the socket.
"""

from __future__ import annotations

import socket

from broker.client import CONNECT_TIMEOUT_S, Address, FramePump, NsqError, connect
from broker.protocol import encode_sub

__all__ = ["BenchConnection", "ServerError", "USER_AGENT"]

USER_AGENT = "pynsqd-bench"


class ServerError(NsqError):
    """The server answered with an error frame, closed the connection or cannot be reached.

    Worded for the command line: an error frame in the server's own words
    (``E_BAD_TOPIC ...``), anything else as the address and what went wrong.
    """

    def __str__(self) -> str:
        if self.from_server:
            return f"{self.code} {self.description}".rstrip()
        return f"{self.address} {self.description}"


class BenchConnection:
    """A connected, identified V2 socket (blocking until the timed loop takes it over).

    The caller owns it and closes it with ``close()``.
    """

    __slots__ = ("pump",)

    def __init__(self, pump: FramePump):
        self.pump = pump

    @classmethod
    def open(cls, host: str, port: int, client_id: str, identify: dict) -> BenchConnection:
        """Connect, send the magic and IDENTIFY, and wait for its answer.

        Raises ServerError when the server cannot be reached or refuses, ValueError
        when ``identify`` asks for TLS or compression, which this tool does not implement.
        """
        return cls(connect(Address(host, port), identify, user_agent=USER_AGENT, client_id=client_id,
                           port_option="--nsqd-tcp-address", error=ServerError))

    def subscribe(self, topic: str, channel: str) -> None:
        """SUB and wait for OK; raises ServerError."""
        self.pump.send(encode_sub(topic, channel))
        answer = self.pump.read_response(CONNECT_TIMEOUT_S)
        if answer != b"OK":
            raise ServerError(self.pump.address, "E_UNEXPECTED", f"SUB {topic} {channel}: unexpected answer {answer!r}")

    def take_over(self) -> socket.socket:
        """The socket, in blocking mode without timeout, for a timed loop (which hands
        what it reads to ``pump.feed`` or parses it itself)."""
        return self.pump.take_socket()

    def close(self) -> None:
        """Close the socket; safe to call twice."""
        self.pump.close()
