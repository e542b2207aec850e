"""The LEASE command and its encoder, parsed whole, byte by byte and in random pieces."""

from __future__ import annotations

import pytest

from broker.protocol import Lease, State, encode_lease
from tests.unit.test_protocol_connection import check

SUB = State.SUBSCRIBED


@pytest.mark.parametrize(("state", "data", "events", "error"), [
    (SUB, b"LEASE FIN q1.7.0\n", [Lease("FIN", "q1.7.0")], None),
    (State.CLOSING, b"LEASE TOUCH q1.7.0\r\n", [Lease("TOUCH", "q1.7.0")], None),
    (SUB, b"LEASE AVAILABLE\nLEASE FIN a\n", [Lease("AVAILABLE"), Lease("FIN", "a")], None),
    (SUB, b"LEASE REQ q 250\n", [Lease("REQ", "q", 250)], None),
    (SUB, b"LEASE REQ q 99999999999\n", [Lease("REQ", "q", 3_600_000)], None),  # clamped like REQ
    (SUB, b"LEASE REQ q -5\n", [], b"E_INVALID LEASE REQ could not parse timeout -5"),  # as REQ
    (State.INIT, b"LEASE FIN q\n", [], b"E_INVALID cannot LEASE in current state"),
    (SUB, b"LEASE fin q\n", [], b'E_INVALID LEASE invalid operation "fin"'),
    (SUB, b"LEASE TOUCH\n", [], b"E_INVALID LEASE TOUCH insufficient number of params"),
    (SUB, b"LEASE FIN " + b"x" * 129 + b"\n", [],
     b'E_INVALID LEASE FIN invalid token "' + b"x" * 129 + b'"'),
    (SUB, b"LEASE FIN q\xff\n", [], b'E_INVALID LEASE FIN invalid token "q\\xff"'),
    (SUB, b"LEASE REQ q 1x\n", [], b"E_INVALID LEASE REQ could not parse timeout 1x"),
])
def test_lease_lines(state, data, events, error):
    check(data, events, error, state=state)


def test_encode_lease_round_trips_and_refuses_what_the_parser_would():
    assert encode_lease("REQ", "q.1.0", 10) == b"LEASE REQ q.1.0 10\n"
    assert encode_lease("AVAILABLE") == b"LEASE AVAILABLE\n"
    with pytest.raises(ValueError):
        encode_lease("FIN", "a b")
    with pytest.raises(ValueError):
        encode_lease("DROP", "q")
