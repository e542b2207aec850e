"""One nsqlookupd that a broker registers with, as nsqd's ``lookup_peer.go`` keeps it.

The connection is opened lazily by the first command and again by the first command
after it broke; every (re)connection runs the owner's ``on_connect`` (IDENTIFY, then
REGISTER of everything the broker holds) before the command itself. Dialling and each
write and read have nsqd's one-second deadline, so an nsqlookupd that never answers costs
its own peer task a second per command and nothing else.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from broker.gocompat.netaddr import AddrError, lookup_port, split_host_port
from broker.gocompat.unmarshal import GO_INT, GO_STRING, GoStruct, unmarshal
from broker.lookup.v1 import MAGIC_V1, ResponseBuffer, ResponseTooLarge

__all__ = ["LookupPeer", "LookupPeerError", "PeerInfo", "dial_error", "split_address"]

log = logging.getLogger("pynsqd.lookup")

#: nsqd's deadline for dialling, and for each write and read, in seconds.
IO_TIMEOUT = 1.0

_READ_SIZE = 65536
#: nsqd's ``peerInfo``, as lookupd's IDENTIFY answer is decoded into it
_PEER_INFO = GoStruct("nsqd.peerInfo", {"tcp_port": GO_INT, "http_port": GO_INT, "version": GO_STRING,
                                        "broadcast_address": GO_STRING})


class LookupPeerError(OSError):
    """A round-trip with nsqlookupd failed; the connection was closed and the next command reconnects."""


@dataclass(frozen=True, slots=True)
class PeerInfo:
    """What nsqlookupd said about itself in answer to IDENTIFY."""

    tcp_port: int
    http_port: int
    version: str
    broadcast_address: str

    def __str__(self) -> str:
        # nsqd logs its peerInfo struct with %+v
        return (f"{{TCPPort:{self.tcp_port} HTTPPort:{self.http_port} Version:{self.version} "
                f"BroadcastAddress:{self.broadcast_address}}}")

    @classmethod
    def parse(cls, response: bytes) -> PeerInfo:
        """The IDENTIFY answer's fields; raises ValueError when it is not such a JSON object."""
        data = unmarshal(response, _PEER_INFO)
        return cls(data["tcp_port"], data["http_port"], data["version"], data["broadcast_address"])

    def http_address(self) -> str | None:
        """``host:port`` of the lookupd's HTTP API, or None without a broadcast address."""
        if not self.broadcast_address:
            return None
        host = self.broadcast_address
        return f"[{host}]:{self.http_port}" if ":" in host else f"{host}:{self.http_port}"


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` as ``(host, port)``, as Go's dial reads it; raises
    :class:`~broker.gocompat.netaddr.AddrError` (a ``ValueError``) in Go's words where the dial
    would refuse it (``address 99999: invalid port``; :func:`dial_error` words the failure)."""
    host, port = split_host_port(address)
    return host, lookup_port("tcp", port)


def dial_error(exc: BaseException) -> str:
    """Why dialling failed, as nsqd words it where Go refuses the address itself
    (``dial tcp: address 99999: invalid port``)."""
    return f"dial tcp: {exc}" if isinstance(exc, AddrError) else _reason(exc)


class LookupPeer:
    """The connection to one ``--lookupd-tcp-address``; used by one task at a time.

    ``on_connect`` runs after every successful dial and the magic; it talks through
    :meth:`roundtrip` and raises :class:`LookupPeerError` to drop the connection.
    """

    def __init__(self, address: str, max_response_size: int,
                 on_connect: Callable[[LookupPeer], Awaitable[None]]):
        self.address = address
        self.info: PeerInfo | None = None
        self._max_response_size = max_response_size
        self._on_connect = on_connect
        self._stream: trio.abc.Stream | None = None
        self._buffer = ResponseBuffer(max_response_size)

    def __str__(self) -> str:
        return self.address

    @property
    def connected(self) -> bool:
        """True while a connection is open and lookupd has answered IDENTIFY."""
        return self._stream is not None and self.info is not None

    async def command(self, command: bytes | None) -> bytes | None:
        """Send ``command`` (None: only connect) and return lookupd's answer.

        Connects first if needed. Raises :class:`LookupPeerError` (the connection is then closed).
        """
        if self._stream is None:
            await self._connect()
        if command is None:
            return None
        return await self.roundtrip(command)

    async def roundtrip(self, command: bytes) -> bytes:
        """Write ``command`` and read one answer on the open connection; raises :class:`LookupPeerError`."""
        stream = self._stream
        if stream is None:
            raise LookupPeerError("not connected")
        try:
            with trio.fail_after(IO_TIMEOUT):
                await stream.send_all(command)
            with trio.fail_after(IO_TIMEOUT):
                while (response := self._buffer.next_response()) is None:
                    data = await stream.receive_some(_READ_SIZE)
                    if not data:
                        raise LookupPeerError("EOF")
                    self._buffer.feed(data)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError,
                ResponseTooLarge) as exc:
            await self.close()
            if isinstance(exc, LookupPeerError):
                raise
            raise LookupPeerError(_reason(exc)) from exc
        return response

    async def close(self) -> None:
        """Close the connection (idempotent); the next command reconnects."""
        stream, self._stream = self._stream, None
        self.info = None
        self._buffer = ResponseBuffer(self._max_response_size)
        if stream is not None:
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _connect(self) -> None:
        log.info("LOOKUP connecting to %s", self.address)
        try:
            host, port = split_address(self.address)
            with trio.fail_after(IO_TIMEOUT):
                stream = await trio.open_tcp_stream(host, port)
        except (OSError, ValueError, trio.TooSlowError) as exc:
            raise LookupPeerError(dial_error(exc)) from exc
        self._stream = stream
        try:
            with trio.fail_after(IO_TIMEOUT):
                await stream.send_all(MAGIC_V1)
        except (OSError, trio.BrokenResourceError, trio.TooSlowError) as exc:
            await self.close()
            raise LookupPeerError(_reason(exc)) from exc
        try:
            await self._on_connect(self)
        except BaseException:
            await self.close()
            raise
        if self._stream is None:
            raise LookupPeerError("lookupPeer connectCallback() failed")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, trio.TooSlowError):
        return "i/o timeout"
    return str(exc) or type(exc).__name__
