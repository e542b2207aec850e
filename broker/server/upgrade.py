"""Upgrading a V2 connection after IDENTIFY: TLS first, then snappy or deflate, in nsqd's order.

nsqd answers a negotiating IDENTIFY in plain text, then (if agreed) completes the TLS
handshake and sends a framed ``OK`` inside TLS, then (if agreed) starts the compressed
stream and sends a framed ``OK`` through it. Here the connection's writer task performs
those steps (``Client._perform_upgrade`` in :mod:`broker.server.connection`) when it
reaches the IDENTIFY response in its output, so that everything queued before it goes out
plain and everything after through the upgraded stream; the reader waits for :attr:`Upgrade.done` before reading again.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field

import trio

from broker.server.compression import Codec
from broker.server.net import describe_address

__all__ = ["Upgrade", "PrefixedStream", "UpgradeFailed", "TLS_HANDSHAKE_TIMEOUT", "tls_handshake"]

#: Seconds a client gets to complete the TLS handshake (nsqd's deadline in ``UpgradeTLS``).
TLS_HANDSHAKE_TIMEOUT = 5.0


class UpgradeFailed(Exception):
    """The TLS handshake failed; the message is the cause nsqd puts after ``IDENTIFY failed``."""


@dataclass(eq=False)
class Upgrade:
    """What one IDENTIFY agreed, handed from the reader to the writer.

    ``plain_frames`` is how many queued output items (up to the IDENTIFY response) go out
    before the upgrade; ``leftover`` the bytes the reader had received past IDENTIFY,
    which belong to the upgraded stream. ``done`` is set once the writer has finished
    (``failed`` tells how).
    """

    tls: bool
    codec: Codec | None
    plain_frames: int = 0
    leftover: bytes = b""
    failed: bool = False
    done: trio.Event = field(default_factory=trio.Event)


class PrefixedStream(trio.abc.Stream):
    """A stream whose first bytes were already read from it: they are received again first.

    The TLS handshake starts with bytes the reader may have received together with
    IDENTIFY; this puts them back in front of the socket for :class:`trio.SSLStream`.
    """

    def __init__(self, stream: trio.abc.Stream, prefix: bytes):
        self._stream = stream
        self._prefix = prefix

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self._prefix:
            data = self._prefix if max_bytes is None else self._prefix[:max_bytes]
            self._prefix = self._prefix[len(data):]
            await trio.lowlevel.checkpoint()
            return data
        return await self._stream.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self._stream.aclose()


async def tls_handshake(stream: trio.abc.Stream, prefix: bytes, context: ssl.SSLContext) -> trio.SSLStream:
    """The server side of a TLS handshake on ``stream`` within :data:`TLS_HANDSHAKE_TIMEOUT`.

    Raises :class:`UpgradeFailed` when the client sends something other than a good
    handshake, goes away, or takes too long. The caller owns the returned stream.
    """
    tls_stream = trio.SSLStream(PrefixedStream(stream, prefix), context, server_side=True)
    try:
        with trio.fail_after(TLS_HANDSHAKE_TIMEOUT):
            await tls_stream.do_handshake()
    except trio.TooSlowError as exc:
        raise UpgradeFailed(f"read tcp {_connection_text(stream)}: i/o timeout") from exc
    except trio.BrokenResourceError as exc:
        cause = exc.__cause__
        if isinstance(cause, ssl.SSLError) and cause.reason in _NOT_TLS:
            raise UpgradeFailed("tls: first record does not look like a TLS handshake") from exc
        raise UpgradeFailed(f"tls: {cause or 'connection closed during the handshake'}") from exc
    return tls_stream


#: OpenSSL's reasons for a first record that is not TLS at all (Go's crypto/tls has one text for them).
_NOT_TLS = frozenset({"WRONG_VERSION_NUMBER", "HTTP_REQUEST", "HTTPS_PROXY_REQUEST", "UNKNOWN_PROTOCOL",
                      "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG"})


def _connection_text(stream: trio.abc.Stream) -> str:
    """``local->remote`` as Go's net errors name a connection."""
    sock = getattr(stream, "socket", None)
    if sock is None:
        return "connection"
    try:
        local, remote = sock.getsockname(), sock.getpeername()
    except OSError:
        return "connection"
    if isinstance(local, str):
        return f"{local}->{remote}"
    return f"{describe_address(local)}->{describe_address(remote)}"
