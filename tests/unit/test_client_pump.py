"""The blocking client's frame pump over an in-memory socket pair: the server's side is written by hand."""

from __future__ import annotations

import socket

import pytest

from broker.client import HEARTBEAT, FramePump, NsqError
from broker.protocol import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    HEARTBEAT_FRAME,
    OK_FRAME,
    encode_error,
    encode_message_frame,
)

WAIT_S = 5.0  # a bound, never waited out: every read below has its bytes already sent


@pytest.fixture
def pair():
    client, server = socket.socketpair()
    server.settimeout(WAIT_S)
    pump = FramePump(client, "test:4150", http_hint="an HTTP answer")
    yield pump, server
    pump.close()
    server.close()


def test_a_heartbeat_is_answered_with_nop_and_not_returned(pair):
    pump, server = pair
    server.sendall(HEARTBEAT_FRAME + OK_FRAME)
    assert pump.read(WAIT_S) == [(FRAME_TYPE_RESPONSE, b"OK")]
    assert server.recv(100) == b"NOP\n"
    assert HEARTBEAT == b"_heartbeat_"


def test_a_heartbeat_alone_keeps_the_read_waiting(pair):
    pump, server = pair
    server.sendall(HEARTBEAT_FRAME)
    assert pump.read(0.05) == []
    assert server.recv(100) == b"NOP\n"


def test_a_fatal_error_frame_is_raised_with_its_code(pair):
    pump, server = pair
    server.sendall(encode_error(b"E_BAD_TOPIC SUB topic name is not valid"))
    with pytest.raises(NsqError) as caught:
        pump.read(WAIT_S)
    error = caught.value
    assert (error.code, error.description, error.fatal, error.from_server) == (
        "E_BAD_TOPIC", "SUB topic name is not valid", True, True)
    assert str(error) == "nsqd test:4150: E_BAD_TOPIC SUB topic name is not valid"


def test_a_non_fatal_error_frame_is_returned_but_raised_as_a_response(pair):
    pump, server = pair
    server.sendall(encode_error(b"E_FIN_FAILED FIN 0123 failed"))
    assert pump.read(WAIT_S) == [(FRAME_TYPE_ERROR, b"E_FIN_FAILED FIN 0123 failed")]
    server.sendall(encode_error(b"E_REQ_FAILED REQ 0123 failed"))
    with pytest.raises(NsqError) as caught:
        pump.read_response(WAIT_S)
    assert (caught.value.code, caught.value.fatal) == ("E_REQ_FAILED", False)


def test_a_frame_split_across_reads_comes_whole(pair):
    pump, server = pair
    frame = encode_message_frame(1_700_000_000_000_000_000, 1, b"0123456789abcdef", b"body" * 100)
    for cut in (3, 7, 30):  # inside the size, inside the type, inside the data
        server.sendall(frame[:cut])
        assert pump.read(0.05) == []
        server.sendall(frame[cut:])
        assert pump.read(WAIT_S) == [(FRAME_TYPE_MESSAGE, frame[8:])]
        assert pump.buffered == 0


def test_frames_read_past_a_response_wait_for_the_next_read(pair):
    pump, server = pair
    server.sendall(OK_FRAME + OK_FRAME)
    assert pump.read_response(WAIT_S) == b"OK"
    assert pump.read(0) == [(FRAME_TYPE_RESPONSE, b"OK")]


def test_a_closed_socket_is_an_error(pair):
    pump, server = pair
    server.close()
    with pytest.raises(NsqError) as caught:
        pump.read(WAIT_S)
    assert (caught.value.code, caught.value.description) == ("E_CONNECTION", "connection closed by nsqd")
    assert not caught.value.from_server


def test_an_http_answer_is_named(pair):
    pump, server = pair
    server.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    with pytest.raises(NsqError) as caught:
        pump.read(WAIT_S)
    assert (caught.value.code, caught.value.description) == ("E_HTTP_PORT", "an HTTP answer")


def test_garbage_is_a_bad_frame(pair):
    pump, server = pair
    server.sendall(b"\x00\x00\x00\x02xx")
    with pytest.raises(NsqError) as caught:
        pump.read(WAIT_S)
    assert caught.value.code == "E_BAD_FRAME"


def test_no_response_in_time_is_a_timeout(pair):
    pump, _ = pair
    with pytest.raises(NsqError) as caught:
        pump.read_response(0.01)
    assert caught.value.code == "E_TIMEOUT"


def test_errors_take_the_class_the_tool_asked_for(pair):
    class ToolError(NsqError):
        pass

    client, server = socket.socketpair()
    pump = FramePump(client, "test:4150", error=ToolError)
    try:
        server.sendall(encode_error(b"E_INVALID nope"))
        with pytest.raises(ToolError):
            pump.read(WAIT_S)
    finally:
        pump.close()
        server.close()


def test_close_is_idempotent(pair):
    pump, _ = pair
    pump.close()
    pump.close()
    assert pump.closed
