"""nsqlookupd's V1 commands as pynsqd writes them, and its answers read whole and byte by byte."""

from __future__ import annotations

import pytest

from broker.lookup.v1 import (
    PING,
    ResponseBuffer,
    ResponseTooLarge,
    describe,
    identify,
    register,
    unregister,
)


def test_commands_are_nsqds_bytes():
    assert register("t") == b"REGISTER t\n"
    assert register("t", "c") == b"REGISTER t c\n"
    assert unregister("t") == b"UNREGISTER t\n"
    assert unregister("t", "c#ephemeral") == b"UNREGISTER t c#ephemeral\n"
    assert PING == b"PING\n"


def test_identify_body_is_sorted_compact_json_after_its_size():
    command = identify({"version": "1.3.0", "tcp_port": 4150, "broadcast_address": "h"})
    body = b'{"broadcast_address":"h","tcp_port":4150,"version":"1.3.0"}'
    assert command == b"IDENTIFY\n" + len(body).to_bytes(4, "big") + body
    assert describe(command) == "IDENTIFY"
    assert describe(register("t", "c")) == "REGISTER t c"


ANSWERS = b"\x00\x00\x00\x02OK" + b"\x00\x00\x00\x0bE_INVALID x" + b"\x00\x00\x00\x00"


@pytest.mark.parametrize("chunk", [len(ANSWERS), 1])
def test_answers_are_split_on_their_sizes(chunk):
    buffer = ResponseBuffer(1024)
    answers = []
    for start in range(0, len(ANSWERS), chunk):
        buffer.feed(ANSWERS[start:start + chunk])
        while (answer := buffer.next_response()) is not None:
            answers.append(answer)
    assert answers == [b"OK", b"E_INVALID x", b""]


def test_an_answer_over_the_bound_is_refused_with_nsqds_message():
    buffer = ResponseBuffer(10)
    buffer.feed(b"\x00\x00\x00\x0b")
    with pytest.raises(ResponseTooLarge, match=r"^response body size \(11\) is greater than limit \(10\)$"):
        buffer.next_response()
