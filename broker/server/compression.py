"""The compressed streams a V2 client may negotiate: deflate and snappy, as nsqd speaks them.

Each codec turns the connection's whole output chunk into one compressed piece
(:meth:`compress`) and decompresses input incrementally (:meth:`decompress`), yielding
pieces of at most :data:`MAX_PIECE` plain bytes, each decompressed only when asked for:
a small compressed input (deflate expands up to 1032-fold, snappy's framing about
20-fold) can make the broker neither hold a large plain one nor spend long on it
before the connection's reader has applied a piece and let the others run.

* **deflate**: raw DEFLATE (no zlib header, ``wbits=-15``), each output chunk ending in a
  sync flush, as Go's ``flate.Writer.Flush`` does after every nsqd write.
* **snappy**: the framing format (``framing_format.txt`` of google/snappy) that go-nsq,
  pynsq and nsqjs speak: a stream identifier, then chunks of at most 65536 bytes, each
  compressed (type 0) or stored (type 1) with the masked CRC-32C of its plain bytes.
  Raw blocks are compressed by cramjam (a maintained Rust binding with wheels for every
  platform; python-snappy itself is now a wrapper over it); the framing is done here so
  that input can be decoded chunk by chunk as it arrives.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

from diskqueue.checksum import crc32c

__all__ = ["CompressionError", "Codec", "DeflateCodec", "SnappyCodec", "MAX_PIECE"]

#: The most plain bytes in one piece :meth:`Codec.decompress` yields (one snappy chunk at most),
#: and so the most plain bytes decompressed in one step.
MAX_PIECE = 256 * 1024


class CompressionError(Exception):
    """The client's compressed stream is corrupt; the connection cannot go on."""


class Codec:
    """One direction-pair of a compressed stream; owned by one connection."""

    name = ""

    def compress(self, data: bytes | memoryview) -> bytes:
        """The compressed form of ``data``, complete (flushed) so the peer can read all of it."""
        raise NotImplementedError

    def decompress(self, data: bytes) -> Iterator[bytes]:
        """The plain bytes ``data`` completes, in pieces of at most :data:`MAX_PIECE` bytes, each
        decompressed when the next is asked for; raises :class:`CompressionError`. The caller
        takes every piece before passing more input."""
        raise NotImplementedError


class DeflateCodec(Codec):
    """Raw deflate at ``level`` with a sync flush per output chunk."""

    name = "deflate"

    def __init__(self, level: int):
        self.level = level
        self._compressor = zlib.compressobj(level, zlib.DEFLATED, -15)
        self._decompressor = zlib.decompressobj(-15)

    def compress(self, data: bytes | memoryview) -> bytes:
        compressor = self._compressor
        return compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH)

    def decompress(self, data: bytes) -> Iterator[bytes]:
        decompressor = self._decompressor
        pending = data
        while True:
            try:
                piece = decompressor.decompress(pending, MAX_PIECE)
            except zlib.error as exc:
                raise CompressionError(f"flate: corrupt input - {exc}") from exc
            pending = decompressor.unconsumed_tail
            if decompressor.eof:
                # a final block ends the stream: Go's reader then reports EOF
                raise CompressionError("flate: stream ended by the client")
            if piece:
                yield piece
            # a full piece may leave output in the inflater even when all input was taken
            if not pending and len(piece) < MAX_PIECE:
                return


# --- snappy framing (google/snappy framing_format.txt) -------------------------------------

_STREAM_IDENTIFIER = b"\xff\x06\x00\x00sNaPpY"
_CHUNK_COMPRESSED = 0x00
_CHUNK_UNCOMPRESSED = 0x01
_CHUNK_PADDING = 0xFE
_CHUNK_STREAM_ID = 0xFF
#: The most plain bytes in one chunk, and the largest chunk body a reader must accept
#: (a compressed chunk may be a little larger than its plain bytes).
_MAX_BLOCK = 65536
_MAX_CHUNK_BODY = 4 + 32 + _MAX_BLOCK + _MAX_BLOCK // 6


def _masked_crc(data: bytes | memoryview) -> int:
    crc = crc32c(data, 0)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _uvarint(data: bytes) -> int:
    """The length prefix of a raw snappy block; -1 if malformed."""
    value = shift = 0
    for i, byte in enumerate(data[:5]):
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value if i < 4 or byte < 0x10 else -1
        shift += 7
    return -1


class SnappyCodec(Codec):
    """Snappy's framing format: output starts with the stream identifier, input must too."""

    name = "snappy"

    def __init__(self) -> None:
        import cramjam  # loaded by the first snappy client: a start does not load it

        self._snappy = cramjam.snappy
        self._decompression_error: type[Exception] = cramjam.DecompressionError
        self._header_sent = False
        self._buf = bytearray()
        self._identified = False

    def compress(self, data: bytes | memoryview) -> bytes:
        out: list[bytes] = []
        if not self._header_sent:
            out.append(_STREAM_IDENTIFIER)
            self._header_sent = True
        view = memoryview(data)
        for start in range(0, len(view), _MAX_BLOCK):
            block = view[start:start + _MAX_BLOCK]
            crc = _masked_crc(block)
            packed = bytes(self._snappy.compress_raw(block))
            # Go's snappy writer keeps a chunk compressed only when that saves at least 1/8
            if len(packed) < len(block) - len(block) // 8:
                kind, body = _CHUNK_COMPRESSED, packed
            else:
                kind, body = _CHUNK_UNCOMPRESSED, bytes(block)
            size = len(body) + 4
            out.append(bytes((kind, size & 0xFF, (size >> 8) & 0xFF, size >> 16)))
            out.append(crc.to_bytes(4, "little"))
            out.append(body)
        return b"".join(out)

    def decompress(self, data: bytes) -> Iterator[bytes]:
        buf = self._buf
        buf += data
        pos = 0
        pieces: list[bytes] = []
        size_out = 0
        failure: CompressionError | None = None
        try:
            while len(buf) - pos >= 4:
                kind = buf[pos]
                length = buf[pos + 1] | buf[pos + 2] << 8 | buf[pos + 3] << 16
                if kind == _CHUNK_STREAM_ID:
                    if length != 6:
                        raise CompressionError("snappy: corrupt input - bad stream identifier")
                elif not self._identified:
                    raise CompressionError("snappy: corrupt input - no stream identifier")
                elif kind in (_CHUNK_COMPRESSED, _CHUNK_UNCOMPRESSED):
                    if length < 4:
                        raise CompressionError("snappy: corrupt input - bad chunk length")
                elif kind < 0x80:
                    raise CompressionError(f"snappy: unsupported input - reserved chunk type 0x{kind:02x}")
                if length > _MAX_CHUNK_BODY:
                    raise CompressionError("snappy: unsupported input - chunk too large")
                if len(buf) - pos < 4 + length:
                    break
                body = bytes(buf[pos + 4:pos + 4 + length])
                pos += 4 + length
                if kind == _CHUNK_STREAM_ID:
                    if body != _STREAM_IDENTIFIER[4:]:
                        raise CompressionError("snappy: corrupt input - bad stream identifier")
                    self._identified = True
                    continue
                if kind not in (_CHUNK_COMPRESSED, _CHUNK_UNCOMPRESSED):
                    continue  # padding and skippable chunks
                size = self._plain_size(kind, body)
                if pieces and size_out + size > MAX_PIECE:
                    # the piece is full: hand it on before decompressing this chunk
                    yield b"".join(pieces)
                    pieces.clear()
                    size_out = 0
                plain = self._block(kind, body, size)
                if int.from_bytes(body[:4], "little") != _masked_crc(plain):
                    raise CompressionError("snappy: corrupt input - bad checksum")
                if plain:
                    pieces.append(plain)
                    size_out += len(plain)
        except CompressionError as exc:
            failure = exc  # the good chunks before the bad one still count, as in Go's reader
        finally:
            del buf[:pos]
        if pieces:
            yield b"".join(pieces)
        if failure is not None:
            raise failure

    @staticmethod
    def _plain_size(kind: int, body: bytes) -> int:
        """How many plain bytes a data chunk holds, as its header says (checked by :meth:`_block`)."""
        if kind == _CHUNK_UNCOMPRESSED:
            return len(body) - 4
        return _uvarint(body[4:9])

    def _block(self, kind: int, body: bytes, size: int) -> bytes:
        payload = body[4:]
        if kind == _CHUNK_UNCOMPRESSED:
            if size > _MAX_BLOCK:
                raise CompressionError("snappy: corrupt input - chunk too large")
            return payload
        if size < 0 or size > _MAX_BLOCK:
            raise CompressionError("snappy: corrupt input - block too large")
        try:
            return bytes(self._snappy.decompress_raw(payload))
        except self._decompression_error as exc:
            raise CompressionError(f"snappy: corrupt input - {exc}") from exc
