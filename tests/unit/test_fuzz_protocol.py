"""Property tests of the sans-I/O V2 parser and its body decoders on generated hostile input.

Run longer (the CI run is seeded and short)::

    PYNSQD_FUZZ_EXAMPLES=20000 python -m pytest -q -p no:cacheprovider tests/unit/test_fuzz_*.py \
        --hypothesis-show-statistics

``PYNSQD_FUZZ_EXAMPLES`` is the number of generated inputs per test; with it set the run
is random, otherwise derandomized (the same inputs every run).
"""

from __future__ import annotations

import json
import struct

from hypothesis import given
from hypothesis import strategies as st

from broker.protocol import ServerConnection
from broker.protocol.commands import Fin, FinRun
from broker.protocol.errors import ProtocolError
from broker.protocol.frames import MAGIC_V2
from broker.protocol.identify import decode_identify
from broker.protocol.limits import Limits
from tests.support.fuzzing import FUZZ, fuzz  # noqa: F401  (fuzz: tests/unit/test_replication_wire.py imports it from here)

# Small bounds so that generated input reaches the "too big" paths too.
LIMITS = Limits(max_msg_size=64, max_body_size=256, max_rdy_count=50, max_req_timeout_ms=5000, max_line_length=80)

_ID = st.binary(min_size=16, max_size=16).map(lambda b: bytes(c % 94 + 33 for c in b))
# Mostly valid values, so that streams get past their first command; sometimes not.
_NAME = st.sampled_from([b"t", b"topic", b"c#ephemeral"] * 5 + [b"bad name", b"", b"x" * 70, b"t\xff", b"."])
_NUMBER = st.sampled_from([b"0", b"1", b"50"] * 4 + [b"51", b"-1", b"+5", b"99999999999999999999", b"1e3", b"", b"0x10"])
_SIZE = st.none() | st.none() | st.integers(min_value=-2, max_value=300)
_BODY = st.binary(max_size=80)


def _sized(body: bytes, declared: int | None = None) -> bytes:
    return struct.pack(">i", len(body) if declared is None else declared) + body


def _mpub(bodies: list[bytes], declared: int | None, count: int | None) -> bytes:
    inner = struct.pack(">i", len(bodies) if count is None else count) + b"".join(_sized(b) for b in bodies)
    return _sized(inner, declared)


# Each piece is one command as a client might send it: well formed or broken in one place.
PIECE = st.one_of(
    st.builds(lambda t, c: b"SUB " + t + b" " + c + b"\n", _NAME, _NAME),
    st.builds(lambda n: b"RDY " + n + b"\n", _NUMBER),
    st.builds(lambda i: b"FIN " + i + b"\n", _ID),
    st.builds(lambda i, n: b"REQ " + i + b" " + n + b"\n", _ID, _NUMBER),
    st.builds(lambda i: b"TOUCH " + i + b"\n", _ID),
    st.sampled_from([b"NOP\n", b"CLS\n", b"NOP\r\n", b"\n", b"BOGUS\n", b"FIN\n", b"SUB t\n", b"PUB\n"]),
    st.builds(lambda t, b, d: b"PUB " + t + b"\n" + _sized(b, d), _NAME, _BODY, _SIZE),
    st.builds(lambda t, n, b, d: b"DPUB " + t + b" " + n + b"\n" + _sized(b, d), _NAME, _NUMBER, _BODY, _SIZE),
    st.builds(lambda t, bs, d, c: b"MPUB " + t + b"\n" + _mpub(bs, d, c),
              _NAME, st.lists(_BODY, max_size=5), _SIZE, st.none() | st.integers(-1, 70)),
    st.builds(lambda b, d: b"AUTH\n" + _sized(b, d), _BODY, _SIZE),
    st.builds(lambda b, d: b"IDENTIFY\n" + _sized(b, d), st.sampled_from([
        b'{"heartbeat_interval":1000}', b'{"client_id":"x","feature_negotiation":true}', b"[" * 3000,
        b'{"msg_timeout":"x"}', b"{", b"null", b'{"output_buffer_size":1e400}', b'{"sample_rate":NaN}',
    ]) | _BODY, _SIZE),
    st.binary(max_size=30),
)


@st.composite
def streams(draw: st.DrawFn) -> tuple[bytes, list[int]]:
    """A client's byte stream (magic, commands, perhaps mutated) and points to split it at."""
    data = bytearray(draw(st.sampled_from([MAGIC_V2] * 8 + [b"  V1", b" "])))
    if draw(st.booleans()):
        data += b"SUB t c\n"  # FIN, RDY, REQ and TOUCH are valid only once subscribed
    for piece in draw(st.lists(PIECE, max_size=12)):
        data += piece
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2, 3]))):
        if len(data) > 4:
            at = draw(st.integers(4, len(data) - 1))
            data[at] = draw(st.integers(0, 255))
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(data) - 1)), max_size=20))))
    return bytes(data), cuts


def _normalise(events: list) -> list:
    """FIN runs depend on how lines arrived together: compare them as single FINs."""
    out: list = []
    for event in events:
        if isinstance(event, FinRun):
            out += [Fin(msg_id) for msg_id in event.msg_ids]
        else:
            out.append(event)
    return out


def parse(chunks: list[bytes], *, fin_runs: bool, limit: int | None = None,
          keyed: bool = False, prioritised: bool = False) -> tuple[list, tuple[str, bytes] | None]:
    """Feed ``chunks`` then the end of input the way a connection's owner does, taking at most
    ``limit`` commands per call if given; ``keyed``: on a connection that negotiated keyed
    publishes (each message a key length byte, a key and a body).

    Returns the events and the error that ended the stream (code, payload), if any. Any
    exception other than ``ProtocolError`` escapes and fails the test.
    """
    conn = ServerConnection(LIMITS)
    conn.fin_runs = fin_runs
    conn.keyed = keyed
    conn.prioritised = prioritised
    events: list = []
    for chunk in [c for c in chunks if c] + [b""]:
        conn.receive_data(chunk)
        while True:
            try:
                got = conn.next_events(limit)
            except ProtocolError as exc:
                return _normalise(events), (exc.code, bytes(exc.payload or b""))
            events += got
            if not conn.has_more:
                break
    return _normalise(events), None


@FUZZ
@given(streams(), st.booleans(), st.booleans(), st.booleans())
def test_any_split_yields_the_events_of_the_whole_stream(stream: tuple[bytes, list[int]], fin_runs: bool,
                                                         keyed: bool, prioritised: bool) -> None:
    data, cuts = stream
    whole = parse([data], fin_runs=fin_runs, keyed=keyed, prioritised=prioritised)
    bounds = [0, *cuts, len(data)]
    split = parse([data[a:b] for a, b in zip(bounds, bounds[1:])], fin_runs=fin_runs, keyed=keyed,
                  prioritised=prioritised)
    assert split == whole
    byte_by_byte = parse([data[i : i + 1] for i in range(len(data))], fin_runs=fin_runs, keyed=keyed,
                         prioritised=prioritised)
    assert byte_by_byte == whole


@FUZZ
@given(streams(), st.booleans(), st.integers(1, 5))
def test_a_limit_per_call_yields_the_events_of_the_whole_stream(
    stream: tuple[bytes, list[int]], fin_runs: bool, limit: int
) -> None:
    data, _ = stream
    assert parse([data], fin_runs=fin_runs, limit=limit) == parse([data], fin_runs=fin_runs)
    assert parse([data], fin_runs=fin_runs, limit=limit, keyed=True) == parse([data], fin_runs=fin_runs, keyed=True)


@FUZZ
@given(st.lists(_BODY.filter(bool), min_size=1, max_size=6), _SIZE, st.none() | st.integers(-1, 70),
       st.integers(0, 40))
def test_mpub_body_decodes_exactly_or_fails_with_nsqd_error(
    bodies: list[bytes], declared: int | None, count: int | None, cut: int
) -> None:
    body = _mpub(bodies, declared, count)
    cut = min(cut, len(body))  # the end of input comes inside the body
    events, error = parse([b"  V2MPUB t\n" + body[: len(body) - cut]], fin_runs=False)
    n = len(bodies) if count is None else count
    if declared is not None and not 0 < declared <= LIMITS.max_body_size:
        assert (events, error and error[0]) == ([], "E_BAD_BODY")
    elif not 0 < n <= (LIMITS.max_body_size - 4) // 5:
        assert (events, error and error[0]) == ([], "E_BAD_BODY")
    elif events:
        # the count frames the messages, as in nsqd; bytes after them are the next command
        assert [e.bodies for e in events[:1]] == [bodies[:n]]
    else:
        assert cut or n > len(bodies) or sum(4 + len(b) for b in bodies) + 4 > LIMITS.max_body_size, error
        assert error is None or error[0] in ("E_BAD_BODY", "E_BAD_MESSAGE")


@FUZZ
@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=20), inner, max_size=4),
    max_leaves=20,
) | st.sampled_from(["heartbeat_interval", "msg_timeout", "client_id", "tls_v1", "sample_rate"]).flatmap(
    lambda key: st.dictionaries(st.just(key), st.integers() | st.text() | st.booleans() | st.none())))
def test_identify_decoder_accepts_or_refuses_cleanly(value: object) -> None:
    body = json.dumps(value).encode()
    try:
        data = decode_identify(body)
    except ValueError:
        return
    assert isinstance(data, dict)
    assert all(isinstance(v, (str, int, bool)) for v in data.values())


@FUZZ
@given(st.binary(max_size=200) | st.builds(lambda n, tail: b"[" * n + tail, st.integers(0, 50000), st.binary(max_size=5)))
def test_identify_decoder_never_fails_other_than_valueerror(body: bytes) -> None:
    try:
        decode_identify(body)
    except ValueError:
        pass
