"""What nodes send each other (broker/replication/wire.py): every request round-trips through its
wire form; every field of every kind is checked, so that a body with anything wrong is refused
whole; and no byte string whatever gets past the decoder as anything but a checked request or
a ``WireError`` (property tests, as tests/unit/test_fuzz_protocol.py runs them)."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.core.message import Message
from broker.replication.answers import (
    decode_hello_answer,
    decode_hello_holding,
    decode_holds_answer,
    decode_keys_answer,
)
from broker.replication.wire import (
    ADD,
    CHANNELS,
    DROP,
    FIN,
    HELLO,
    HOLDS,
    KEYS,
    TAKEN,
    UPDATE,
    Add,
    Channels,
    Drop,
    Fin,
    Hello,
    Holds,
    Keys,
    Taken,
    Update,
    WireError,
    WireLimits,
    decode_request,
    decode_requests,
    encode_request,
    pack,
    pack_entries,
)
from tests.support.fuzzing import fuzz

LIMITS = WireLimits(max_msg_size=100)
A, B = "a" * 32, "b" * 32
ID = b"0123456789abcdef"


def _entries(n: int = 2, size: int = 5, **fields) -> tuple[list[bytes], bytes]:
    messages = [Message(b"%016x" % i, b"x" * size, 1_000, 0, 0, None) for i in range(n)]
    for name, value in fields.items():
        for message in messages:
            setattr(message, name, value)
    return [m.id for m in messages], pack_entries(messages)


@pytest.mark.parametrize("request_", [
    Hello(), Hello(lost_memory=True), Fin("t", "c", [ID]), Drop("t", [ID, ID]), Channels("t", []),
    Channels("t#ephemeral", ["c", "d#ephemeral"]), Taken(A, "t", [ID]), Add("t", (A, B), *_entries()),
    Add("t", (A, B), *_entries(priority=7, attempts=3, due_ns=5)),
    Add("t", (A, B), *_entries(), None, [b"k1", b""], 99), Add("t", (A, B), *_entries(), None, [b"k", b"l"], [5, 6]),
    Keys("t", [b"k", b"x" * 128]), Holds("t", [ID]), Holds("t", [ID, ID], (A, B)),
    Update("t", "c", [ID, ID], [3, 3], [0, 0]), Update("t", "c#ephemeral", [ID, ID], [1, 65535], [0, (1 << 63) - 1]),
])
def test_every_request_round_trips_through_its_wire_form(request_):
    wire = msgpack.unpackb(pack(encode_request(request_)), raw=False)
    assert decode_request(wire, LIMITS) == request_


def _add(**change) -> list:
    ids, entries = _entries()
    fields = {"topic": "t", "holders": [A, B], "ids": ids, "entries": entries, **change}
    return [ADD, fields["topic"], fields["holders"], fields["ids"], fields["entries"]]


def _keyed_add(keys: object = (b"k", b"l"), expires: object = 9) -> list:
    return [*_add(), list(keys) if isinstance(keys, tuple) else keys, expires]


def _columns(**change) -> bytes:
    ids, _ = _entries()
    columns = {"ids": ids, "bodies": [b"a", b"b"], "timestamps": 1, "attempts": 0, "due": 0, "priorities": None,
               "dones": None, **change}
    return msgpack.packb(list(columns.values()))


@pytest.mark.parametrize("item, problem", [
    ("ADD", "not a request"), ([], "not a request"), (["1"], "not a request"), ([99], "unknown request 99"),
    ([FIN, "t", "c"], "request 3 has 2 fields"), ([HELLO, {}, 1], "request 1 has 2 fields"),
    ([HELLO, [1]], "HELLO's flags must be a map"),
    ([CHANNELS, "t", 5], "channels must be a list"), ([CHANNELS, "t", ["c", "bad/name"]], "bad channel name"),
    ([CHANNELS, "t", [7]], "bad channel name"), ([CHANNELS, "bad/name", []], "bad topic name"),
    ([CHANNELS, "t" * 65, []], "bad topic name"), ([CHANNELS, b"t", []], "bad topic name"),
    ([FIN, "t", "c", 7], "ids must be a list"), ([FIN, "t", "c", []], "ids must be a list"),
    ([FIN, "t", "c", [b"short"]], "bad message id"), ([FIN, "t", "c", ["0123456789abcdef"]], "bad message id"),
    ([DROP, "t", [ID, 5]], "bad message id"), ([TAKEN, "nobody", "t", [ID]], "bad node id"),
    ([TAKEN, "A" * 32, "t", [ID]], "bad node id"),
    (_add(topic="bad/name"), "bad topic name"), (_add(topic="t" * 300), "bad topic name"),
    (_add(holders=[A]), "holders must be a list of 2"), (_add(holders=[A, A]), "named twice"),
    (_add(holders=[A, "x"]), "bad node id"), (_add(holders=[A] + [f"{n:032x}" for n in range(64)]), "holders"),
    (_add(entries="text"), "entries must be bytes"), (_add(entries=b"\xc1"), "not msgpack"),
    (_add(entries=msgpack.packb([1, 2])), "entries must be 7 columns"),
    (_add(entries=_entries(3)[1]), "not those of the ids"),
    (_add(entries=_columns(bodies=[b"a"])), "bodies: one per message"),
    (_add(entries=_columns(bodies=[b"a", 7])), "a body is not bytes"),
    (_add(entries=_columns(bodies=[b"a", b"x" * 101])), "at most 100"),
    (_add(entries=_columns(timestamps=-1)), "bad timestamp"),
    (_add(entries=_columns(timestamps=[1])), "timestamp: 1 values for 2"),
    (_add(entries=_columns(attempts=[0, 65536])), "bad attempts"),
    (_add(entries=_columns(due="soon")), "bad due time"),
    (_add(entries=_columns(priorities=[None, 1 << 32])), "bad priority"),
    (_add(entries=_columns(priorities=5)), "priorities must be a list"),
    (_add(entries=_columns(dones=[["c"]])), "done channels: one list"),
    (_add(entries=_columns(dones=[None, ["bad/name"]])), "bad channel name"),
    ([HOLDS, "t"], "request 11 has 1 fields"), ([HOLDS, "t", [ID], [A, B], 1], "request 11 has 4 fields"),
    ([HOLDS, "bad/name", [ID]], "bad topic name"), ([HOLDS, "t", []], "ids must be a list"),
    ([HOLDS, "t", [ID], [A]], "holders must be a list of 2"), ([HOLDS, "t", [ID], None], "holders must be a list"),
    ([HOLDS, "t", [ID], [A, "x"]], "bad node id"),
    ([*_add(), [b"k", b"l"]], "keys come with their expiry"), (_keyed_add(keys=(b"k",)), "keys must be a list of 2"),
    (_keyed_add(keys="kl"), "keys must be a list"), (_keyed_add(keys=(b"k", "l")), "bad publish key"),
    (_keyed_add(keys=(b"k", b"x" * 129)), "bad publish key"), (_keyed_add(expires=-1), "bad key expiry"),
    (_keyed_add(expires=[1]), "key expiry: 1 values for 2"), (_keyed_add(expires="later"), "bad key expiry"),
    ([KEYS, "t", []], "keys must be a list of 1 to"), ([KEYS, "t", [b""]], "bad publish key"),
    ([KEYS, "t", [b"x" * 129]], "bad publish key"), ([KEYS, "bad/name", [b"k"]], "bad topic name"),
    ([KEYS, "t", b"k"], "keys must be a list"),
    ([UPDATE, "t", "c", [ID], 1], "request 10 has 4 fields"), ([UPDATE, "t", "c", [ID], 1, 0, 0], "has 6 fields"),
    ([UPDATE, "bad/name", "c", [ID], 1, 0], "bad topic name"), ([UPDATE, "t", "c" * 65, [ID], 1, 0], "bad channel name"),
    ([UPDATE, "t", None, [ID], 1, 0], "bad channel name"), ([UPDATE, "t", "c", [], 1, 0], "ids must be a list"),
    ([UPDATE, "t", "c", [b"x" * 17], 1, 0], "bad message id"), ([UPDATE, "t", "c", [ID], 65536, 0], "bad attempts"),
    ([UPDATE, "t", "c", [ID], -1, 0], "bad attempts"), ([UPDATE, "t", "c", [ID], True, 0], "bad attempts"),
    ([UPDATE, "t", "c", [ID, ID], [1, 65536], 0], "bad attempts"),
    ([UPDATE, "t", "c", [ID, ID], [1], 0], "attempts: 1 values for 2"), ([UPDATE, "t", "c", [ID], "1", 0], "bad attempts"),
    ([UPDATE, "t", "c", [ID], 1, -1], "bad due time"), ([UPDATE, "t", "c", [ID], 1, 1 << 63], "bad due time"),
    ([UPDATE, "t", "c", [ID], 1, 1.5], "bad due time"), ([UPDATE, "t", "c", [ID, ID], 1, [0, 0, 0]], "due time: 3 values"),
])
def test_each_field_of_each_kind_is_checked(item, problem):
    with pytest.raises(WireError, match=problem.replace("(", r"\(")):
        decode_request(item, LIMITS)


def test_an_update_sends_a_column_of_equal_values_as_one():
    wire = msgpack.unpackb(pack(encode_request(Update("t", "c", [ID, ID, ID], [2, 2, 2], [0, 0, 0]))), raw=False)
    assert wire == [UPDATE, "t", "c", [ID, ID, ID], 2, 0]
    wire = msgpack.unpackb(pack(encode_request(Update("t", "c", [ID, ID], [2, 3], [0, 5]))), raw=False)
    assert wire == [UPDATE, "t", "c", [ID, ID], [2, 3], [0, 5]]


def test_one_bad_request_spoils_its_body_and_the_error_names_its_sequence_number():
    good = encode_request(Channels("t", ["c"]))
    seq, requests = decode_requests(pack([7, [good, good]]), LIMITS)
    assert seq == 7 and requests == [Channels("t", ["c"])] * 2
    with pytest.raises(WireError) as caught:
        decode_requests(pack([8, [good, [CHANNELS, "t", 5]]]), LIMITS)
    assert caught.value.seq == 8
    for body in (b"\xc1", pack([1]), pack(["1", []]), pack([1, "x"])):
        with pytest.raises(WireError):
            decode_requests(body, LIMITS)


def test_a_hello_answer_may_name_millions_of_ids_taken_over():
    many = [b"%016d" % i for i in range((1 << 20) + 1)]
    mine, _ = decode_hello_answer(msgpack.unpackb(pack([{"t": many}, {}, {}]), raw=False))
    assert len(mine["t"]) == len(many)


def test_a_hello_answer_is_checked_as_a_request_is():
    answer = [{"t": [ID]}, {A: {"t": [ID], "u": []}}, {"t": 3, "u#ephemeral": 1 << 40}]
    mine, everything = decode_hello_answer(answer)
    assert mine == {"t": [ID]} and everything == {A: {"t": [ID], "u": []}}
    assert decode_hello_holding(answer) == {"t": 3, "u#ephemeral": 1 << 40}
    for bad in ([{"bad/name": [ID]}, {}, {}], [{}, {"nobody": {}}, {}], [{"t": [b"x"]}, {}, {}], [{}, [], {}], "x",
                [{}], [{}, {}], [{}, {}, {}, {}], [{}, {}, []], [{}, {}, {"bad/name": 1}], [{}, {}, {"t": 0}],
                [{}, {}, {"t": -1}], [{}, {}, {"t": "1"}], [{}, {}, {"t": True}], [{}, {}, {"t": 1 << 63}]):
        with pytest.raises(WireError):
            decode_hello_answer(bad)


def test_a_holds_answer_is_one_boolean_per_id_asked_about():
    assert decode_holds_answer([True, False], 2) == [True, False]
    for bad in ([True], [True, False, True], [1, 0], None, {"0": True}, [True, None]):
        with pytest.raises(WireError, match="one boolean for each of 2 ids"):
            decode_holds_answer(bad, 2)


@pytest.mark.parametrize("alone", [Hello(), Holds("t", [ID]), Holds("t", [ID], (A, B))])
def test_a_request_answered_with_data_of_its_own_comes_alone_in_its_body(alone):
    assert decode_requests(pack([3, [encode_request(alone)]]), LIMITS) == (3, [alone])
    with pytest.raises(WireError, match="comes alone in its body"):
        decode_requests(pack([3, [encode_request(alone), encode_request(Drop("t", [ID]))]]), LIMITS)


def test_a_keys_answer_names_only_keys_that_were_asked():
    assert decode_keys_answer(None, "t", [b"k"]) == set()
    assert decode_keys_answer({"u": [b"k"]}, "t", [b"k"]) == set()
    assert decode_keys_answer({"t": [b"k"], "u": [b"z"]}, "t", [b"k", b"l"]) == {b"k"}
    for bad in ({"t": [b"z"]}, {"t": b"k"}, {"t": [b""]}, [b"k"], "t"):
        with pytest.raises(WireError):
            decode_keys_answer(bad, "t", [b"k"])


_LEAF = st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 64) - 1) | st.text(max_size=40) | st.binary(max_size=40)
_VALUE = st.recursive(_LEAF, lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=5), inner,
                                                                                          max_size=3), max_leaves=8)
_KIND = st.sampled_from([HELLO, ADD, FIN, DROP, CHANNELS, TAKEN, KEYS, UPDATE, HOLDS, 0, 99])


@fuzz(150)
@given(st.lists(st.tuples(_KIND, st.lists(_VALUE, max_size=5)), max_size=3), st.integers(0, 1 << 40))
def test_a_body_of_any_shape_is_a_checked_request_list_or_a_wire_error(items, seq):
    body = pack([seq, [[kind, *args] for kind, args in items]])
    try:
        got_seq, requests = decode_requests(body, LIMITS)
    except WireError as exc:
        assert exc.seq == seq
        return
    assert got_seq == seq
    for request in requests:  # what passed is what its encoding says, and encodes again to it
        assert decode_request(msgpack.unpackb(pack(encode_request(request)), raw=False), LIMITS) == request


@fuzz(300)
@given(st.binary(max_size=200))
def test_any_bytes_are_a_checked_request_list_or_a_wire_error(body):
    try:
        decode_requests(body, LIMITS)
    except WireError:
        pass
