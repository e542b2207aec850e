"""Property tests of the HTTP/1.x request parser on generated pipelines: requests and
fragments of the framing cases (``test_http_parser.py``), damaged at random, then split at
random points. Whatever the split, the parser makes the same requests, bodies and
refusals as when it gets the stream whole, and nothing but a refusal or a body error comes
out of it. (Run longer as ``test_fuzz_protocol.py`` says.)"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broker.http.parser import RequestParser
from tests.support.fuzzing import FUZZ
from tests.unit.test_http_parser import CASES, LIMIT, _events

_PIECES = [data for data, _ in CASES.values()]


@st.composite
def _stream(draw) -> bytes:
    pieces = draw(st.lists(st.sampled_from(_PIECES), min_size=1, max_size=4))
    data = bytearray(b"".join(pieces))
    for _ in range(draw(st.integers(min_value=0, max_value=3))):  # a few damaged bytes
        at = draw(st.integers(min_value=0, max_value=len(data) - 1))
        data[at] = draw(st.sampled_from(b"\r\n \t:;0aZ\x00\x7f\xff"))
    return bytes(data)


def _fed(data: bytes, cuts: list[int], eof: bool) -> list[tuple]:
    parser = RequestParser(LIMIT)
    start = 0
    for cut in sorted(set(cuts)) + [len(data)]:
        parser.feed(data[start:cut])
        start = cut
    if eof:
        parser.eof()
    return _events(parser)


@FUZZ
@given(data=st.data(), stream=_stream(), eof=st.booleans())
def test_any_split_gives_what_the_whole_stream_gives(data, stream, eof):
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=len(stream)), max_size=12))
    assert _fed(stream, cuts, eof) == _fed(stream, [], eof)
