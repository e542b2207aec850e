"""The per-client output buffer: bytes in order, and which message frames have not gone out."""

from __future__ import annotations

import pytest

from broker.core.message import Message
from broker.protocol import FrameDecoder, decode_message, encode_response
from broker.server.output import MESSAGE_FRAME_OVERHEAD, OutputBuffer


def _msgs(*bodies: bytes) -> list[Message]:
    return [Message(b"%016d" % i, body, 1_700_000_000_000_000_000 + i, attempts=1) for i, body in enumerate(bodies)]


def test_taken_bytes_are_the_frames_in_order():
    out = OutputBuffer()
    msgs = _msgs(b"a" * 10, b"b" * 20)
    out.add(encode_response(b"OK"))
    out.add_messages(msgs)
    data = bytes(out.take())
    assert out.size == len(data) == len(encode_response(b"OK")) + 2 * MESSAGE_FRAME_OVERHEAD + 30
    frames = FrameDecoder().feed(data)
    assert frames[0].data == b"OK"
    assert [decode_message(f.data).body for f in frames[1:]] == [b"a" * 10, b"b" * 20]


@pytest.mark.parametrize("handed, unsent", [
    (0, [0, 1, 2]),
    (MESSAGE_FRAME_OVERHEAD + 99, [0, 1, 2]),  # one byte short of the first frame
    (MESSAGE_FRAME_OVERHEAD + 100, [1, 2]),
    (2 * MESSAGE_FRAME_OVERHEAD + 200, [2]),
    (3 * MESSAGE_FRAME_OVERHEAD + 300, []),
])
def test_a_message_is_sent_once_its_whole_frame_was_handed(handed, unsent):
    out = OutputBuffer()
    msgs = _msgs(b"x" * 100, b"y" * 100, b"z" * 100)
    out.add_messages(msgs)
    data = out.take()
    # the socket takes the bytes in two pieces, as a partial send would
    out.handed(handed // 2)
    out.handed(handed - handed // 2)
    if handed < len(data):
        out.put_back(memoryview(data)[handed:])
    assert out.unsent(msgs) == [msgs[i] for i in unsent]
    assert out.size == len(data) - handed


def test_what_is_put_back_goes_out_before_what_came_later():
    out = OutputBuffer()
    out.add(b"first")
    data = out.take()
    out.add(b"later")
    out.handed(2)
    out.put_back(memoryview(data)[2:])
    assert bytes(out.take()) == b"rstlater"
    assert out.size == len(b"rstlater")
