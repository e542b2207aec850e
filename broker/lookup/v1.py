"""nsqlookupd's ``"  V1"`` TCP protocol as nsqd speaks it, with no I/O.

A client sends the magic once, then commands as text lines; ``IDENTIFY`` carries a
length-prefixed JSON body. Every answer, errors included, is ``[4-byte big-endian size][data]``
with no frame type; an error is text such as ``E_INVALID cannot IDENTIFY again`` and
lookupd closes the connection after it (``nsqlookupd/lookup_protocol_v1.go``).
"""

from __future__ import annotations

import json
import struct

__all__ = ["MAGIC_V1", "PING", "ResponseBuffer", "ResponseTooLarge", "describe", "identify", "register",
           "unregister"]

MAGIC_V1 = b"  V1"
PING = b"PING\n"

_SIZE = struct.Struct(">i")


def identify(info: dict) -> bytes:
    """``IDENTIFY`` with ``info`` as its JSON body (nsqd: ``broadcast_address``, ``hostname``, ports, ``version``)."""
    body = json.dumps(info, separators=(",", ":"), sort_keys=True).encode()
    return b"IDENTIFY\n" + _SIZE.pack(len(body)) + body


def _line(name: str, topic: str, channel: str | None) -> bytes:
    params = f"{topic} {channel}" if channel else topic
    return f"{name} {params}\n".encode()


def register(topic: str, channel: str | None = None) -> bytes:
    """``REGISTER topic [channel]``: this node produces ``topic`` (and has ``channel``)."""
    return _line("REGISTER", topic, channel)


def unregister(topic: str, channel: str | None = None) -> bytes:
    """``UNREGISTER topic [channel]``: the channel (or the whole topic) is gone from this node."""
    return _line("UNREGISTER", topic, channel)


def describe(command: bytes) -> str:
    """A command as nsqd logs it: its line without the newline (``IDENTIFY`` without its body)."""
    return command.split(b"\n", 1)[0].decode("utf-8", "replace")


class ResponseTooLarge(ValueError):
    """An answer announced more bytes than ``--max-body-size`` allows (nsqd's own bound)."""


class ResponseBuffer:
    """Collects bytes from lookupd and hands out whole answers."""

    def __init__(self, max_size: int):
        self._max_size = max_size
        self._data = bytearray()

    def feed(self, data: bytes | bytearray) -> None:
        """Add bytes read from the connection."""
        self._data += data

    def next_response(self) -> bytes | None:
        """The next whole answer, or None until more bytes arrive.

        Raises :class:`ResponseTooLarge` with nsqd's message for a size over the bound.
        """
        if len(self._data) < _SIZE.size:
            return None
        (size,) = _SIZE.unpack_from(self._data)
        if size > self._max_size or size < 0:
            raise ResponseTooLarge(f"response body size ({size}) is greater than limit ({self._max_size})")
        end = _SIZE.size + size
        if len(self._data) < end:
            return None
        response = bytes(self._data[_SIZE.size:end])
        del self._data[:end]
        return response
