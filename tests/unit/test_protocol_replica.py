"""REPL, the node-to-node command (broker/protocol/replica.py): only on a connection that
negotiated the role; anywhere else nsqd's answer to an unknown command."""

from __future__ import annotations

import pytest

from broker.protocol import MAGIC_V2, ProtocolError, ServerConnection
from broker.protocol.replica import Repl, encode_repl, is_valid_node_id


def _parse(data: bytes, *, replica: bool) -> list:
    conn = ServerConnection()
    conn.replica = replica
    conn.receive_data(MAGIC_V2 + data)
    return conn.next_events()


def test_repl_is_an_unknown_command_on_an_ordinary_connection():
    with pytest.raises(ProtocolError) as caught:
        _parse(encode_repl(b"\x93\x01\x90\xc0"), replica=False)
    assert caught.value.payload == b"E_INVALID invalid command REPL" and caught.value.fatal


def test_repl_carries_its_body_on_a_peer_connection_and_may_arrive_in_pieces():
    body = bytes(range(256)) * 40
    data = encode_repl(body) + b"NOP\n"
    conn = ServerConnection()
    conn.replica = True
    conn.receive_data(MAGIC_V2)
    events = []
    for i in range(0, len(data), 1000):
        conn.receive_data(data[i:i + 1000])
        events += conn.next_events()
    assert events[0] == Repl(body) and len(events) == 2


def test_an_empty_repl_body_is_refused_as_nsqd_refuses_empty_bodies():
    with pytest.raises(ProtocolError) as caught:
        _parse(b"REPL\n\x00\x00\x00\x00", replica=True)
    assert caught.value.code == "E_BAD_BODY"


@pytest.mark.parametrize("value, valid", [("0" * 32, True), ("ab" * 16, True), ("AB" * 16, False),
                                          ("0" * 31, False), (32, False), ("g" * 32, False)])
def test_node_ids_are_32_lowercase_hex_digits(value, valid):
    assert is_valid_node_id(value) is valid
