"""Codec tests for the disk queue's record frame, segment header and checkpoint."""

from __future__ import annotations

import struct
import zlib

import pytest

from diskqueue import FormatVersionError
from diskqueue.checkpoint import Checkpoint, Cursor, decode_checkpoint, encode_checkpoint
from diskqueue.checksum import crc32c, software_crc32c
from diskqueue.format import (
    EMPTY_PAYLOAD_CRC,
    HEADER_SIZE,
    SegmentHeader,
    decode_header,
    decode_records,
    encode_header,
    frame_records,
    meta_filename,
    next_record_size,
    segment_filename,
    segment_number,
    segment_pattern,
)

MAX = 1 << 20
PAYLOADS = [b"", b"a", b"hello world", bytes(range(256)) * 4, b"\0" * 100]


def encoded(payloads: list[bytes]) -> bytes:
    return b"".join(frame_records(payloads, [len(p) for p in payloads]))


def test_file_names_match_nsqd() -> None:
    assert segment_filename("topic:chan", 7) == "topic:chan.diskqueue.000007.dat"
    assert segment_filename("t", 1234567) == "t.diskqueue.1234567.dat"
    assert meta_filename("t") == "t.diskqueue.meta.dat"
    pattern = segment_pattern("a.b")
    assert pattern.fullmatch("a.b.diskqueue.000001.dat")
    assert not pattern.fullmatch("axb.diskqueue.000001.dat")  # the dot is literal
    assert not pattern.fullmatch("a.b.diskqueue.000001.dat.bad")
    assert not pattern.fullmatch("a.b:c.diskqueue.000001.dat")


@pytest.mark.parametrize("filename", [
    "a.b.diskqueue.000001.dat", "a.b.diskqueue.1234567.dat", "axb.diskqueue.000001.dat",
    "a.b.diskqueue.000001.dat.bad", "a.b:c.diskqueue.000001.dat", "a.b.diskqueue.00001.dat",
    "a.b.diskqueue.meta.dat", "a.b.diskqueue.00000x.dat", "a.b.diskqueue.000001.dat.diskqueue.000002.dat",
    "a.b.diskqueue..dat", "a.b.diskqueue.\u0661\u0662\u0663\u0664\u0665\u0666.dat",
])
def test_segment_number_agrees_with_the_pattern(filename: str) -> None:
    match = segment_pattern("a.b").fullmatch(filename)
    assert segment_number("a.b", filename) == (int(match.group(1)) if match else None)


def test_record_layout_is_length_crc_payload() -> None:
    data = encoded([b"abc"])
    assert data == struct.pack(">II", 3, crc32c(b"abc")) + b"abc"


def test_empty_payload_stores_a_nonzero_checksum() -> None:
    assert crc32c(b"") == 0
    assert encoded([b""]) == struct.pack(">II", 0, EMPTY_PAYLOAD_CRC)
    data = encoded([b"a", b"", b"", b"b"])
    assert decode_records(data, 0, 10, 0, MAX) == ([b"a", b"", b"", b"b"], len(data), None)


def test_record_checksum_is_crc32c() -> None:
    assert software_crc32c(b"123456789") == 0xE3069283  # the standard CRC-32C check value
    for data in (b"", b"x", bytes(range(256)) * 3):
        for seed in (0, 0x5A17C0DE):
            assert crc32c(data, seed) == software_crc32c(data, seed)
    assert crc32c(b"world", crc32c(b"hello ")) == crc32c(b"hello world")


def test_round_trip() -> None:
    data = encoded(PAYLOADS)
    got, off, problem = decode_records(data, 0, 100, 0, MAX)
    assert got == PAYLOADS
    assert off == len(data)
    assert problem is None


def test_decode_stops_at_want() -> None:
    data = encoded(PAYLOADS)
    got, off, problem = decode_records(data, 0, 2, 0, MAX)
    assert got == PAYLOADS[:2]
    rest, end, _ = decode_records(data, off, 100, 0, MAX)
    assert rest == PAYLOADS[2:] and end == len(data) and problem is None


def test_decode_every_prefix_yields_only_complete_records() -> None:
    data = encoded(PAYLOADS)
    boundaries = [0]
    for p in PAYLOADS:
        boundaries.append(boundaries[-1] + 8 + len(p))
    for cut in range(len(data) + 1):
        got, off, problem = decode_records(data[:cut], 0, 100, 0, MAX)
        complete = max(i for i, b in enumerate(boundaries) if b <= cut)
        assert problem is None
        assert got == PAYLOADS[:complete]
        assert off == boundaries[complete]


def test_zero_filled_region_is_not_a_record() -> None:
    got, off, problem = decode_records(bytes(64), 0, 10, 0, MAX)
    assert got == [] and off == 0 and problem == "record checksum mismatch"


@pytest.mark.parametrize("target", ["length", "crc", "payload"])
def test_garbled_record_after_valid_ones(target: str) -> None:
    data = bytearray(encoded([b"one", b"two", b"three"]))
    second = 8 + 3
    index = {"length": second + 3, "crc": second + 5, "payload": second + 9}[target]
    data[index] ^= 0x01
    got, off, problem = decode_records(bytes(data), 0, 10, 0, MAX)
    assert got == [b"one"]
    assert off == second
    assert problem is not None


def test_size_bounds_are_enforced_on_decode() -> None:
    data = encoded([b"12345", b"1"])
    got, off, problem = decode_records(data, 0, 10, 2, MAX)
    assert got == [b"12345"] and off == 13 and "outside" in (problem or "")
    got, off, problem = decode_records(data, 0, 10, 0, 4)
    assert got == [] and off == 0 and "outside" in (problem or "")


def test_next_record_size() -> None:
    data = encoded([b"x" * 10])
    assert next_record_size(data[:3], 0, MAX) == (8, None)
    assert next_record_size(data[:9], 0, MAX) == (18, None)
    size, problem = next_record_size(data, 0, 9)
    assert size == 0 and "exceeds" in (problem or "")


def test_header_round_trip() -> None:
    raw = encode_header(12, 3456)
    assert len(raw) == HEADER_SIZE and raw[:4] == b"PDQS"
    assert decode_header(raw, 12) == (SegmentHeader(12, 3456), None)


@pytest.mark.parametrize(
    "raw, reason",
    [
        (encode_header(1, 0)[:20], "header is 20 bytes"),
        (b"X" + encode_header(1, 0)[1:], "checksum"),
        (bytes(HEADER_SIZE), "checksum"),
    ],
)
def test_header_invalid(raw: bytes, reason: str) -> None:
    header, problem = decode_header(raw, 1)
    assert header is None and reason in (problem or "")


def test_header_of_other_segment() -> None:
    header, problem = decode_header(encode_header(2, 0), 3)
    assert header is None and "names segment 2" in (problem or "")


def test_header_newer_version_refused() -> None:
    body = struct.pack(">4sHHIIQI", b"PDQS", 2, 32, 1, 0, 0, 0)
    raw = body + struct.pack(">I", zlib.crc32(body))
    with pytest.raises(FormatVersionError):
        decode_header(raw, 1)


CHECKPOINT = Checkpoint(Cursor(3, 100, 40), Cursor(5, 32, 90), 47, ((4, 500),), (4,))


def test_checkpoint_round_trip() -> None:
    assert decode_checkpoint(encode_checkpoint(CHECKPOINT)) == CHECKPOINT


def test_checkpoint_every_byte_flip_detected() -> None:
    data = encode_checkpoint(CHECKPOINT)
    for i in range(len(data)):
        garbled = bytearray(data)
        garbled[i] ^= 0x40
        with pytest.raises(ValueError):
            decode_checkpoint(bytes(garbled))


@pytest.mark.parametrize("data", [b"", b"\x00", b"garbage", encode_checkpoint(CHECKPOINT)[:-3]])
def test_checkpoint_garbage(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode_checkpoint(data)
