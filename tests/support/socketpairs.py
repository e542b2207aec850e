"""Connected pairs of non-blocking sockets, for the server's pieces tested without a network."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["read_ready", "socket_pairs"]


@contextmanager
def socket_pairs(count: int) -> Iterator[list[tuple[socket.socket, socket.socket]]]:
    """``count`` connected pairs of non-blocking sockets, all closed afterwards."""
    made = [socket.socketpair() for _ in range(count)]
    try:
        for pair in made:
            for sock in pair:
                sock.setblocking(False)
        yield made
    finally:
        for pair in made:
            for sock in pair:
                sock.close()


def read_ready(sock: socket.socket) -> bytes:
    """Everything a non-blocking ``sock`` has received so far (up to the peer's close, if it closed)."""
    data = b""
    while True:
        try:
            chunk = sock.recv(1 << 20)
        except BlockingIOError:
            return data
        if not chunk:
            return data
        data += chunk
