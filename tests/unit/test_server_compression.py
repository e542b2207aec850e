"""The broker's snappy framing and deflate codecs against python-snappy and zlib."""

from __future__ import annotations

import os
import tracemalloc
import zlib

import pytest
import snappy

from broker.server.compression import MAX_PIECE, CompressionError, DeflateCodec, SnappyCodec

#: The most plain bytes a connection's reader is handed at once (what one read may bring).
PIECE_BOUND = 256 * 1024
PLAIN = os.urandom(3000) + b"nsq " * 50_000  # incompressible and compressible parts, several chunks


def test_snappy_output_is_read_by_python_snappy():
    codec = SnappyCodec()
    out = codec.compress(PLAIN) + codec.compress(b"second write")
    assert out.startswith(b"\xff\x06\x00\x00sNaPpY")
    assert out.count(b"sNaPpY") == 1
    assert snappy.StreamDecompressor().decompress(out) == PLAIN + b"second write"


@pytest.mark.parametrize("step", [1, 7, 65536, len(PLAIN) * 2])
def test_snappy_input_is_decoded_whatever_the_pieces(step):
    encoded = snappy.StreamCompressor().add_chunk(PLAIN)
    codec = SnappyCodec()
    got = b"".join(piece for i in range(0, len(encoded), step) for piece in codec.decompress(encoded[i:i + step]))
    assert got == PLAIN


@pytest.mark.parametrize(("stream", "error"), [
    (b"\x00\x08\x00\x00abcdefgh", "no stream identifier"),
    (b"\xff\x06\x00\x00sNaPpX", "bad stream identifier"),
    (b"\xff\x06\x00\x00sNaPpY\x05\x01\x00\x00x", "reserved chunk type 0x05"),
    (b"\xff\x06\x00\x00sNaPpY\x01\x05\x00\x00\x00\x00\x00\x00x", "bad checksum"),
    (b"\xff\x06\x00\x00sNaPpY\x80\xff\xff\xff", "chunk too large"),
])
def test_snappy_refuses_corrupt_input(stream, error):
    with pytest.raises(CompressionError, match=error):
        list(SnappyCodec().decompress(stream))


def test_deflate_writes_are_sync_flushed_raw_deflate():
    codec = DeflateCodec(6)
    first = codec.compress(b"hello")
    assert first.endswith(b"\x00\x00\xff\xff")
    reader = zlib.decompressobj(-15)
    assert reader.decompress(first) == b"hello"
    assert reader.decompress(codec.compress(b" again")) == b" again"


def test_deflate_hands_on_bounded_pieces_of_a_bomb():
    bomb = zlib.compressobj(9, zlib.DEFLATED, -15)
    data = bomb.compress(b"\0" * 20_000_000) + bomb.flush(zlib.Z_SYNC_FLUSH)
    tracemalloc.start()
    try:
        sizes = [len(piece) for piece in DeflateCodec(6).decompress(data)]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert max(sizes) <= PIECE_BOUND
    assert sum(sizes) == 20_000_000
    assert peak < 8 * PIECE_BOUND  # a piece at a time and the inflater, never the 20 MB


@pytest.mark.parametrize("size", [MAX_PIECE - 1, MAX_PIECE, MAX_PIECE + 1, 3 * MAX_PIECE, 3 * MAX_PIECE + 5])
def test_deflate_pieces_add_up_at_every_boundary(size):
    plain = (b"NOP\n" * size)[:size]
    writer = zlib.compressobj(9, zlib.DEFLATED, -15)
    data = writer.compress(plain) + writer.flush(zlib.Z_SYNC_FLUSH)
    assert b"".join(DeflateCodec(6).decompress(data)) == plain


def test_snappy_hands_on_bounded_pieces_and_joins_small_chunks():
    writer = snappy.StreamCompressor()
    large = writer.add_chunk(b"NOP\n" * 4_000_000)
    small = b"".join(writer.add_chunk(b"PUB t\n") for _ in range(100))
    codec = SnappyCodec()
    sizes = [len(piece) for piece in codec.decompress(large)]
    assert max(sizes) <= PIECE_BOUND
    assert sum(sizes) == 16_000_000
    assert list(codec.decompress(small)) == [b"PUB t\n" * 100]  # one piece, not one per chunk


def test_deflate_refuses_garbage_and_a_final_block():
    with pytest.raises(CompressionError, match="corrupt input"):
        list(DeflateCodec(6).decompress(b"\xff\xff\xff\xff"))
    ended = zlib.compressobj(6, zlib.DEFLATED, -15)
    with pytest.raises(CompressionError, match="ended"):
        list(DeflateCodec(6).decompress(ended.compress(b"x") + ended.flush()))
