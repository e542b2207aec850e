"""The client side of the transport upgrades, built on other implementations than the broker's.

Certificates come from trustme; snappy from python-snappy's framing and deflate from zlib,
so a test checks the broker's codecs against independent ones.
"""

from __future__ import annotations

import json
import ssl
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import snappy
import trio
import trustme

from broker.protocol import FRAME_TYPE_RESPONSE, encode_identify
from tests.support.v2client import V2Client

__all__ = ["Certificates", "make_certificates", "negotiate", "read_exactly", "upgrade_tls", "SnappyStream",
           "DeflateStream", "compress_with"]


async def read_exactly(stream: trio.abc.Stream, size: int) -> bytes:
    """``size`` bytes and not one more (what follows may belong to an upgraded stream)."""
    data = b""
    while len(data) < size:
        chunk = await stream.receive_some(size - len(data))
        if not chunk:
            raise EOFError(f"connection closed after {data!r}")
        data += chunk
    return data


async def negotiate(client: V2Client, **params) -> tuple[bytes, dict | None]:
    """Send a feature-negotiating IDENTIFY; returns the raw response frame and its JSON (None for
    an error frame), having read nothing past it."""
    await client.send(encode_identify({"feature_negotiation": True, **params}))
    with trio.fail_after(client.timeout):
        head = await read_exactly(client.stream, 8)
        size, frame_type = struct.unpack(">ii", head)
        body = await read_exactly(client.stream, size - 4)
    return head + body, json.loads(body) if frame_type == FRAME_TYPE_RESPONSE else None


@dataclass(frozen=True)
class Certificates:
    """A CA, the broker's certificate and key (one PEM file) and a client certificate, on disk."""

    ca: trustme.CA
    ca_file: Path
    server_file: Path
    client_file: Path

    def client_context(self, *, with_certificate: bool = False) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        if with_certificate:
            context.load_cert_chain(str(self.client_file))
        return context

    def broker_flags(self, *extra: str) -> tuple[str, ...]:
        return (f"--tls-cert={self.server_file}", f"--tls-key={self.server_file}", *extra)


def make_certificates(folder: Path) -> Certificates:
    """A fresh CA with a certificate for 127.0.0.1 and one for a client named ``client-one``."""
    folder.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("client-one@example.com", common_name="client-one")
    certs = Certificates(ca, folder / "ca.pem", folder / "server.pem", folder / "client.pem")
    ca.cert_pem.write_to_path(str(certs.ca_file))
    server.private_key_and_cert_chain_pem.write_to_path(str(certs.server_file))
    client.private_key_and_cert_chain_pem.write_to_path(str(certs.client_file))
    return certs


async def upgrade_tls(client: V2Client, context: ssl.SSLContext) -> None:
    """The client's TLS handshake after a ``tls_v1`` IDENTIFY response; then ``OK`` inside TLS."""
    tls = trio.SSLStream(client.stream, context, server_hostname="127.0.0.1")
    with trio.fail_after(client.timeout):
        await tls.do_handshake()
    client.stream = tls
    await client.expect_response(b"OK")


class _CodecStream(trio.abc.Stream):
    def __init__(self, inner: trio.abc.Stream):
        self.inner = inner

    def _compress(self, data: bytes) -> bytes:
        raise NotImplementedError

    def _decompress(self, data: bytes) -> bytes:
        raise NotImplementedError

    async def send_all(self, data) -> None:
        await self.inner.send_all(self._compress(bytes(data)))

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes=None) -> bytes:
        while True:
            data = await self.inner.receive_some(max_bytes)
            if not data:
                return b""
            plain = self._decompress(bytes(data))
            if plain:
                return plain

    async def send_raw(self, data: bytes) -> None:
        """Bytes as they are, bypassing compression (to send garbage)."""
        await self.inner.send_all(data)

    async def aclose(self) -> None:
        await self.inner.aclose()


class SnappyStream(_CodecStream):
    """Snappy framing in both directions (python-snappy's stream classes)."""

    def __init__(self, inner: trio.abc.Stream):
        super().__init__(inner)
        self._out = snappy.StreamCompressor()
        self._in = snappy.StreamDecompressor()

    def _compress(self, data: bytes) -> bytes:
        return self._out.add_chunk(data)

    def _decompress(self, data: bytes) -> bytes:
        return self._in.decompress(data)


class DeflateStream(_CodecStream):
    """Raw deflate with a sync flush per write, as go-nsq's writer does."""

    def __init__(self, inner: trio.abc.Stream, level: int = 6):
        super().__init__(inner)
        self._out = zlib.compressobj(level, zlib.DEFLATED, -15)
        self._in = zlib.decompressobj(-15)

    def _compress(self, data: bytes) -> bytes:
        return self._out.compress(data) + self._out.flush(zlib.Z_SYNC_FLUSH)

    def _decompress(self, data: bytes) -> bytes:
        return self._in.decompress(data)


async def compress_with(client: V2Client, stream_type: type[_CodecStream], **kwargs) -> None:
    """Switch ``client`` to a compressed stream after the IDENTIFY response; then ``OK`` through it."""
    client.stream = stream_type(client.stream, **kwargs)
    await client.expect_response(b"OK")
