"""Frames: server-side encoders byte for byte, and the client-side FrameDecoder."""

from __future__ import annotations

import random
import struct

import pytest

from broker.protocol import (
    BAD_PROTOCOL_FRAME,
    CLOSE_WAIT_FRAME,
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    HEARTBEAT_FRAME,
    OK_FRAME,
    Frame,
    FrameDecoder,
    MessageFrame,
    ProtocolError,
    decode_message,
    encode_error,
    encode_frame,
    encode_message_frame,
    encode_response,
    message_frame_header,
)

ID = b"0123456789abcdef"


def test_frame_layout():
    assert encode_frame(0, b"OK") == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    assert encode_response(b"") == b"\x00\x00\x00\x04\x00\x00\x00\x00"
    assert encode_error(b"E_INVALID invalid command ASDF") == (
        struct.pack(">II", 4 + 30, 1) + b"E_INVALID invalid command ASDF"
    )
    assert OK_FRAME == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    assert CLOSE_WAIT_FRAME == b"\x00\x00\x00\x0e\x00\x00\x00\x00CLOSE_WAIT"
    assert HEARTBEAT_FRAME == b"\x00\x00\x00\x0f\x00\x00\x00\x00_heartbeat_"
    # nsqd/tcp.go: the bare code, framed as an error
    assert BAD_PROTOCOL_FRAME == b"\x00\x00\x00\x12\x00\x00\x00\x01E_BAD_PROTOCOL"


def test_message_frame_layout_byte_for_byte():
    frame = encode_message_frame(0x0102030405060708, 0x0A0B, ID, b"hello")
    assert frame == (
        b"\x00\x00\x00\x23"                      # size = 4 + 8 + 2 + 16 + 5 = len(data) + 4
        b"\x00\x00\x00\x02"                      # frame type: message
        b"\x01\x02\x03\x04\x05\x06\x07\x08"      # timestamp, int64 big-endian
        b"\x0a\x0b"                              # attempts, uint16 big-endian
        + ID                                     # 16-byte id
        + b"hello"
    )
    size, = struct.unpack(">I", frame[:4])
    assert size == len(frame) - 4


def test_message_frame_header_is_the_frame_minus_body():
    header = message_frame_header(1700000000123456789, 3, ID, 11)
    assert len(header) == 34
    assert header + b"hello world" == encode_message_frame(1700000000123456789, 3, ID, b"hello world")


def test_message_frame_edge_values():
    frame = encode_message_frame(-1, 65536 + 2, ID, b"")
    assert frame[8:16] == b"\xff" * 8   # nsqd writes uint64(timestamp)
    assert frame[16:18] == b"\x00\x02"  # attempts is a uint16 in nsqd: it wraps
    assert frame[:4] == b"\x00\x00\x00\x1e"
    with pytest.raises(ValueError):
        message_frame_header(0, 0, b"short", 0)


def test_decode_message():
    data = encode_message_frame(123456789, 7, ID, b"\x00body\n")[8:]
    assert decode_message(data) == MessageFrame(123456789, 7, ID, b"\x00body\n")
    assert decode_message(data[:26]) == MessageFrame(123456789, 7, ID, b"")
    with pytest.raises(ProtocolError) as err:
        decode_message(data[:25])
    assert err.value.payload == b"E_BAD_MESSAGE not enough data to decode valid message"


STREAM_FRAMES = [
    Frame(FRAME_TYPE_RESPONSE, b"OK"),
    Frame(FRAME_TYPE_RESPONSE, b"_heartbeat_"),
    Frame(FRAME_TYPE_MESSAGE, encode_message_frame(1, 1, ID, b"x" * 300)[8:]),
    Frame(FRAME_TYPE_ERROR, b"E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight"),
    Frame(FRAME_TYPE_RESPONSE, b""),
    Frame(FRAME_TYPE_MESSAGE, encode_message_frame(2, 9, ID, b"")[8:]),
]
STREAM = b"".join(encode_frame(f.frame_type, f.data) for f in STREAM_FRAMES)


@pytest.mark.parametrize("mode", ["whole", "bytes", "random"])
def test_decoder_split_anywhere(mode):
    decoder = FrameDecoder()
    if mode == "whole":
        chunks = [STREAM]
    elif mode == "bytes":
        chunks = [STREAM[i:i + 1] for i in range(len(STREAM))]
    else:
        rng = random.Random(3)
        chunks, i = [], 0
        while i < len(STREAM):
            n = rng.randint(1, 40)
            chunks.append(STREAM[i:i + n])
            i += n
    frames = []
    for chunk in chunks:
        frames += decoder.feed(chunk)
    assert frames == STREAM_FRAMES
    assert decode_message(frames[2].data).body == b"x" * 300


def test_decoder_rejects_oversized_frame_from_its_size_field():
    decoder = FrameDecoder(max_frame_size=100)
    assert decoder.feed(encode_frame(0, b"x" * 96)) == [Frame(0, b"x" * 96)]
    with pytest.raises(ProtocolError) as err:
        decoder.feed(struct.pack(">I", 101))
    assert err.value.code == "E_BAD_FRAME"
    with pytest.raises(ProtocolError):
        decoder.feed(b"more")


@pytest.mark.parametrize("garbage,fragment", [
    (struct.pack(">Ii", 3, 0), "too small"),
    (struct.pack(">Ii", 4, 3), "invalid frame type 3"),
    (struct.pack(">Ii", 6, -1) + b"OK", "invalid frame type -1"),
    (b"HTTP/1.1 400 Bad Request\r\n", "frame size"),
])
def test_decoder_rejects_garbage(garbage, fragment):
    decoder = FrameDecoder()
    with pytest.raises(ProtocolError) as err:
        decoder.feed(garbage)
    assert fragment in err.value.description
    assert err.value.fatal


def test_decoder_returns_good_frames_before_an_error():
    decoder = FrameDecoder()
    assert decoder.feed(OK_FRAME + struct.pack(">Ii", 4, 7)) == [Frame(0, b"OK")]
    with pytest.raises(ProtocolError):
        decoder.feed(b"")
