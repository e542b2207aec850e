"""The priority prefix of a prioritised connection: split exactly, or refused in nsqd's words."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.core.message import Message, decode, encode
from broker.protocol import ProtocolError
from broker.protocol.priorities import MAX_PRIORITY, prefix_priority, split_priorities, split_priority


@given(st.integers(0, MAX_PRIORITY), st.binary(max_size=64))
def test_prefix_and_split_are_inverse(priority: int, body: bytes) -> None:
    assert split_priority(prefix_priority(priority, body)) == (priority, body)


@given(st.lists(st.binary(max_size=12), min_size=1, max_size=8), st.sampled_from(["PUB", "DPUB", "MPUB"]),
       st.integers(1, 6))
def test_split_priorities_splits_every_message_or_fails_with_a_bad_message(messages, verb, max_body) -> None:
    try:
        priorities, bodies = split_priorities(verb, messages, max_body)
    except ProtocolError as exc:
        assert exc.code == "E_BAD_MESSAGE" and exc.fatal
        bad = [m for m in messages if not 4 < len(m) <= 4 + max_body]
        assert bad, messages
        return
    assert [prefix_priority(p, b) for p, b in zip(priorities, bodies)] == messages
    assert all(0 < len(b) <= max_body for b in bodies)


@pytest.mark.parametrize("priority", [0, 1, 2 ** 31, MAX_PRIORITY])
@pytest.mark.parametrize("due_ns", [0, 1_795_000_000_000_000_000])
def test_a_priority_survives_the_disk_record_with_or_without_a_due_time(priority: int, due_ns: int) -> None:
    msg = Message(b"0123456789abcdef", b"body", 42, attempts=3, due_ns=due_ns, priority=priority)
    record = encode(msg)
    back = decode(record)
    assert (back.id, back.body, back.timestamp, back.attempts, back.due_ns, back.priority) == \
        (msg.id, b"body", 42, 3, due_ns, priority)
    assert record.startswith(b"\xff" if due_ns else b"\xfd")


def test_a_message_without_priority_is_written_as_before() -> None:
    msg = Message(b"0123456789abcdef", b"body", 42, attempts=1)
    assert encode(msg) == struct.pack(">qH", 42, 1) + b"0123456789abcdef" + b"body"
    assert decode(encode(msg)).priority is None


@pytest.mark.parametrize("record, problem", [
    (b"\xfd\x01\x00\x00\x00\x07" + b"x" * 5, "prioritised record too short"),
    (b"\xfd\x02\x00\x00\x00\x07" + struct.pack(">qH", 1, 0) + b"0" * 16, "unknown priority version 2"),
])
def test_a_damaged_priority_prefix_is_an_unreadable_record(record: bytes, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        decode(record)


@pytest.mark.parametrize("msg", [
    Message(b"0123456789abcdef", b"body", 42, attempts=3),
    Message(b"0123456789abcdef", b"", 42, priority=7),
    Message(b"fedcba9876543210", b"x" * 300, 42, priority=0),
])
def test_a_records_rank_is_read_from_its_bytes_as_decoding_would_give_it(msg: Message) -> None:
    from broker.core.message import record_rank

    record = encode(msg)
    assert record_rank(record, 99) == (99 if msg.priority is None else msg.priority, msg.id)
    # a deferred record, a short one, an unknown priority version: decode them instead
    deferred = Message(msg.id, msg.body, 1, due_ns=5, priority=msg.priority)
    assert record_rank(encode(deferred), 99) is None
    assert record_rank(record[:10], 99) is None
    if msg.priority is not None:
        assert record_rank(record[:1] + b"\x02" + record[2:], 99) is None
