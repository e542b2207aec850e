"""Upgrading a V2 connection after IDENTIFY: TLS first, then snappy or deflate, in nsqd's order.

nsqd answers a negotiating IDENTIFY in plain text, then (if agreed) completes the TLS
handshake and sends a framed ``OK`` inside TLS, then (if agreed) starts the compressed
stream and sends a framed ``OK`` through it. Here the connection's writer task performs
those steps (:func:`perform`, awaited from ``Client.run_writer`` in
:mod:`broker.server.client`) when it reaches the IDENTIFY response in its output, so
that everything queued before it goes out plain and everything after through the upgraded
stream (:mod:`broker.server.transport` holds what was agreed, the
:class:`~broker.server.transport.Upgrade`, and the result); the reader waits for
:attr:`~broker.server.transport.Upgrade.done` before reading again.

Loaded by the writer of the first connection that upgrades, so that a start does not pay
for TLS (as :mod:`broker.server.identify` loads compression).
"""

from __future__ import annotations

import logging
import ssl
from typing import TYPE_CHECKING, Protocol

import trio

from broker.protocol import encode_error, encode_response
from broker.server.compression import DeflateCodec
from broker.server.net import describe_address
from broker.server.tls import describe_session

if TYPE_CHECKING:
    from broker.server.output import OutputBuffer
    from broker.server.transport import Transport, Upgrade

__all__ = ["Upgrading", "PrefixedStream", "UpgradeFailed", "TLS_HANDSHAKE_TIMEOUT", "UPGRADE_ERROR_GRACE", "perform",
           "tls_handshake"]

log = logging.getLogger("pynsqd.client")

#: Seconds a client gets to complete the TLS handshake (nsqd's deadline in ``UpgradeTLS``).
TLS_HANDSHAKE_TIMEOUT = 5.0
#: Seconds to try telling a client its TLS handshake failed, in plain text as nsqd does.
UPGRADE_ERROR_GRACE = 1.0


class Upgrading(Protocol):
    """What an upgrade touches of its connection (a :class:`~broker.server.client.Client`)."""

    transport: Transport
    output: OutputBuffer
    remote_address: str
    closing: bool


class UpgradeFailed(Exception):
    """The TLS handshake failed; the message is the cause nsqd puts after ``IDENTIFY failed``."""


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


async def perform(client: Upgrading, upgrade: Upgrade) -> None:
    """Send ``client``'s output queued up to the IDENTIFY response plain, then upgrade its
    transport and send the framed ``OK`` of each step; the writer calls this. Marks the
    upgrade done either way (``failed``: the connection ends)."""
    transport = client.transport
    output = client.output
    chunks = output.chunks
    plain = b"".join(chunks[:upgrade.plain_frames])
    del chunks[:upgrade.plain_frames]
    try:
        if plain:
            # a second IDENTIFY's answer goes through the stream it replaces, as nsqd's does
            codec = transport.codec
            await transport.stream.send_all(plain if codec is None else codec.compress(plain))
            output.handed(len(plain))
        if upgrade.tls:
            assert transport.ssl_context is not None
            log.info("PROTOCOL(V2): [%s] upgrading connection to TLS", client.remote_address)
            try:
                tls_stream = await tls_handshake(transport.stream, upgrade.leftover, transport.ssl_context)
            except UpgradeFailed as exc:
                upgrade.failed = True
                await _refuse(client, str(exc))
                return
            upgrade.leftover = b""
            transport.stream = tls_stream
            transport.tls_version, transport.tls_cipher_suite, transport.tls_common_name = describe_session(tls_stream)
            transport.tls = True
            await tls_stream.send_all(encode_response(b"OK"))
        codec = upgrade.codec
        if codec is not None:
            if isinstance(codec, DeflateCodec):
                log.info("PROTOCOL(V2): [%s] upgrading connection to deflate (level %d)", client.remote_address,
                         codec.level)
                transport.deflate, transport.deflate_level = True, codec.level
            else:
                log.info("PROTOCOL(V2): [%s] upgrading connection to snappy", client.remote_address)
                transport.snappy = True
            transport.codec = codec
            await transport.stream.send_all(codec.compress(encode_response(b"OK")))
    except BaseException:
        upgrade.failed = True
        raise
    finally:
        transport.upgrade = None
        upgrade.done.set()


async def _refuse(client: Upgrading, cause: str) -> None:
    """Tell the client its handshake failed, in plain text as nsqd does, and close."""
    log.info("TCP: client(%s) error: E_IDENTIFY_FAILED IDENTIFY failed %s", client.remote_address, cause)
    client.closing = True
    client.output.chunks.clear()
    with trio.move_on_after(UPGRADE_ERROR_GRACE):
        try:
            await client.transport.stream.send_all(encode_error(b"E_IDENTIFY_FAILED IDENTIFY failed " + cause.encode()))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
