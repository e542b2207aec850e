"""The HTTP/1.x request parser on its own: where each request ends, what its head and body
are, and Go's refusals. Every case runs fed whole and fed one byte at a time, and both must
give the same events (checked against nsqd 1.3.0's Go server with the same bytes in
``tests/system/test_same_answers_as_nsqd.py``)."""

from __future__ import annotations

import pytest

from broker.http.parser import HeadError, ParsedRequest, RequestParser

LIMIT = 1 << 20


def _events(parser: RequestParser) -> list[tuple]:
    events: list[tuple] = []
    for item in parser.ready:
        if isinstance(item, HeadError):
            events.append(("refused", item.status, item.text))
        else:
            assert isinstance(item, ParsedRequest)
            events.append((item.method.decode("latin-1"), item.target.decode("latin-1"), b"".join(item.parts), item.complete,
                           item.error is not None))
    return events


def parse(data: bytes, *, bytewise: bool = False, eof: bool = False) -> list[tuple]:
    """Feed ``data`` (whole or byte by byte, then perhaps EOF); what the parser made of it:
    a request as (method, target, body, complete, failed), a refusal as ("refused", status, text)."""
    parser = RequestParser(LIMIT)
    if bytewise:
        for i in range(len(data)):
            parser.feed(data[i:i + 1])
    else:
        parser.feed(data)
    if eof:
        parser.eof()
    return _events(parser)


def both_ways(data: bytes, *, eof: bool = False) -> list[tuple]:
    whole = parse(data, eof=eof)
    assert parse(data, bytewise=True, eof=eof) == whole
    return whole


GET = b"GET /ping HTTP/1.1\r\nHost: h\r\n\r\n"
PING = ("GET", "/ping", b"", True, False)
BAD = ("refused", 400, "")


def pub(extra: bytes, version: bytes = b"1.1") -> bytes:
    return b"POST /pub?topic=t HTTP/" + version + b"\r\nHost: h\r\n" + extra


def published(body: bytes, complete: bool = True, failed: bool = False) -> tuple:
    return ("POST", "/pub?topic=t", body, complete, failed)


CASES = {
    # line endings: LF ends a line, a CR before it is dropped, any other CR is a byte of the line
    "bare LF everywhere": (GET.replace(b"\r\n", b"\n") + GET, [PING, PING]),
    "bare LF in one line": (b"GET /ping HTTP/1.1\nHost: h\r\n\r\n" + GET, [PING, PING]),
    "bare LF blank line": (b"GET /ping HTTP/1.1\r\nHost: h\r\n\n" + GET, [PING, PING]),
    "bare CR in the request line": (b"GET /ping HTTP/1.1\rHost: h\r\n\r\n", [BAD]),
    "bare CR in a value": (b"GET /ping HTTP/1.1\r\nHost: h\r\nX: a\rb\r\n\r\n",
                           [("refused", 400, "invalid header value")]),
    "CR CR LF": (b"GET /ping HTTP/1.1\r\nHost: h\r\nX: a\r\r\n\r\n", [("refused", 400, "invalid header value")]),
    "a leading blank line": (b"\r\n" + GET, [BAD]),
    # HTTP/1.0 ignores Transfer-Encoding: the chunks are the next request
    "HTTP/1.0 chunked": (pub(b"Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n3\r\nabc\r\n0\r\n\r\n", b"1.0"),
                         [published(b""), BAD]),
    "HTTP/1.0 chunked with a length": (
        pub(b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n3\r\nabc\r\n0\r\n\r\n", b"1.0"),
        [published(b"3\r\n"), BAD]),
    "HTTP/1.0 gzip": (pub(b"Transfer-Encoding: gzip\r\nContent-Length: 3\r\n\r\nabc", b"1.0") + GET,
                      [published(b"abc"), PING]),
    # Transfer-Encoding on HTTP/1.1: exactly one, chunked, overriding Content-Length
    "chunked": (pub(b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n") + GET, [published(b"abc"), PING]),
    "chunked in capitals": (pub(b"Transfer-Encoding: CHUNKED\r\n\r\n3\r\nabc\r\n0\r\n\r\n"), [published(b"abc")]),
    "chunked and a length": (pub(b"Content-Length: 9\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n") + GET,
                             [published(b"abc"), PING]),
    "gzip, chunked": (pub(b"Transfer-Encoding: gzip, chunked\r\n\r\n"), [("refused", 501, "")]),
    "chunked, identity": (pub(b"Transfer-Encoding: chunked, identity\r\n\r\n"), [("refused", 501, "")]),
    "identity": (pub(b"Transfer-Encoding: identity\r\nContent-Length: 3\r\n\r\nabc"), [("refused", 501, "")]),
    "empty encoding": (pub(b"Transfer-Encoding: \r\n\r\n"), [("refused", 501, "")]),
    "two chunked headers": (pub(b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"),
                            [("refused", 501, "")]),
    # Content-Length
    "two equal lengths": (pub(b"Content-Length: 3\r\nContent-Length:  3 \r\n\r\nabc") + GET,
                          [published(b"abc"), PING]),
    "two lengths": (pub(b"Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd"), [BAD]),
    "a length list": (pub(b"Content-Length: 3, 3\r\n\r\nabc"), [BAD]),
    "a signed length": (pub(b"Content-Length: +3\r\n\r\nabc"), [BAD]),
    "leading zeros": (pub(b"Content-Length: 003\r\n\r\nabc") + GET, [published(b"abc"), PING]),
    "an empty length": (pub(b"Content-Length: \r\n\r\n") + GET, [published(b""), PING]),
    "a length past int64": (pub(b"Content-Length: 9223372036854775808\r\n\r\n"), [BAD]),
    "a body holding a request": (pub(b"Content-Length: %d\r\n\r\n" % len(GET)) + GET, [published(GET)]),
    # header lines
    "a folded header": (b"GET /ping HTTP/1.1\r\nHost: h\r\nX: a\r\n b\r\n\r\n", [PING]),
    "a folded length": (pub(b"Content-Length:\r\n\t3\r\n\r\nabc") + GET, [published(b"abc"), PING]),
    "a fold first": (b"GET /ping HTTP/1.1\r\n X: a\r\nHost: h\r\n\r\n", [BAD]),
    "space before the colon": (b"GET /ping HTTP/1.1\r\nHost: h\r\nX : a\r\n\r\n",
                               [("refused", 400, "invalid header name")]),
    "no colon": (b"GET /ping HTTP/1.1\r\nHost: h\r\nX a\r\n\r\n", [BAD]),
    "an empty name": (b"GET /ping HTTP/1.1\r\nHost: h\r\n: a\r\n\r\n", [PING]),
    "no Host": (b"GET /ping HTTP/1.1\r\n\r\n", [("refused", 400, "missing required Host header")]),
    "no Host in HTTP/1.0": (b"GET /ping HTTP/1.0\r\n\r\n", [PING]),
    "two Hosts": (b"GET /ping HTTP/1.1\r\nHost: h\r\nHost: h\r\n\r\n", [BAD]),
    "a Host with a slash": (b"GET /ping HTTP/1.1\r\nHost: a/b\r\n\r\n", [("refused", 400, "malformed Host header")]),
    "bad Content-Length before a missing Host": (b"POST /pub HTTP/1.1\r\nContent-Length: x\r\n\r\n", [BAD]),
    # request lines
    "absolute form": (b"GET http://other:1/ping?a HTTP/1.1\r\nHost: h\r\n\r\n",
                      [("GET", "http://other:1/ping?a", b"", True, False)]),
    "absolute form, bad port": (b"GET http://other:x/ping HTTP/1.1\r\nHost: h\r\n\r\n", [BAD]),
    "a bad escape": (b"GET /p%zz HTTP/1.1\r\nHost: h\r\n\r\n", [BAD]),
    "a bad escape in the query": (b"GET /p?%zz HTTP/1.1\r\nHost: h\r\n\r\n", [("GET", "/p?%zz", b"", True, False)]),
    "HTTP/1.10": (b"GET /ping HTTP/1.10\r\nHost: h\r\n\r\n", [BAD]),
    "HTTP/2.0": (b"GET /ping HTTP/2.0\r\nHost: h\r\n\r\n", [("refused", 505, "unsupported protocol version")]),
    "HTTP/2 preface": (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", [("PRI", "*", b"", True, False), BAD]),
    "two spaces": (b"GET  /ping HTTP/1.1\r\nHost: h\r\n\r\n", [BAD]),
    "any token method": (b"abcGET /ping HTTP/1.1\r\nHost: h\r\n\r\n", [("abcGET", "/ping", b"", True, False)]),
    # chunking
    "chunk extensions": (pub(b"Transfer-Encoding: chunked\r\n\r\n3;a=b\r\nabc\r\n0;x\r\n\r\n") + GET,
                         [published(b"abc"), PING]),
    "space after the size": (pub(b"Transfer-Encoding: chunked\r\n\r\n3 \r\nabc\r\n0\r\n\r\n"), [published(b"abc")]),
    "space before the size": (pub(b"Transfer-Encoding: chunked\r\n\r\n 3\r\nabc\r\n0\r\n\r\n"),
                              [published(b"", False, True)]),
    "space before an extension": (pub(b"Transfer-Encoding: chunked\r\n\r\n3 ;a\r\nabc\r\n0\r\n\r\n"),
                                  [published(b"", False, True)]),
    "16 digits": (pub(b"Transfer-Encoding: chunked\r\n\r\n0000000000000003\r\nabc\r\n0\r\n\r\n"), [published(b"abc")]),
    "17 digits": (pub(b"Transfer-Encoding: chunked\r\n\r\n00000000000000003\r\nabc\r\n0\r\n\r\n"),
                  [published(b"", False, True)]),
    "0x": (pub(b"Transfer-Encoding: chunked\r\n\r\n0x3\r\nabc\r\n0\r\n\r\n"), [published(b"", False, True)]),
    "no size: the last chunk": (pub(b"Transfer-Encoding: chunked\r\n\r\n\r\n\r\n") + GET, [published(b""), PING]),
    "bare LF size lines": (pub(b"Transfer-Encoding: chunked\r\n\r\n3\nabc\r\n0\n\r\n") + GET, [published(b"abc"), PING]),
    "bare LF after data": (pub(b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\n0\r\n\r\n"),
                           [published(b"abc", False, True)]),
    "a trailer": (pub(b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n") + GET,
                  [published(b"abc"), PING]),
    "a bad trailer": (pub(b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nno colon\r\n\r\n"),
                      [published(b"abc", False, True)]),
    "a request after the last chunk": (pub(b"Transfer-Encoding: chunked\r\n\r\n0\r\n") + GET,
                                       [published(b"", False, True)]),
    "a bare LF after the last chunk": (pub(b"Transfer-Encoding: chunked\r\n\r\n0\r\n\n") + GET, [published(b""), PING]),
    "a request in a chunk": (pub(b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(GET), GET)),
                             [published(GET)]),
    "Trailer naming Content-Length": (pub(b"Trailer: Content-Length\r\nTransfer-Encoding: chunked\r\n\r\n"), [BAD]),
    # after a POST (only), up to four CR or LF bytes before the next request are dropped
    "CR LF after a POST": (pub(b"Content-Length: 3\r\n\r\nabc\r\n") + GET, [published(b"abc"), PING]),
    "four after a POST": (pub(b"Content-Length: 3\r\n\r\nabc\r\n\r\n") + GET, [published(b"abc"), PING]),
    "five after a POST": (pub(b"Content-Length: 3\r\n\r\nabc\r\n\r\n\n") + GET, [published(b"abc"), BAD]),
    "CR LF after a GET": (GET + b"\r\n" + GET, [PING, BAD]),
}


@pytest.mark.parametrize("data, expected", CASES.values(), ids=CASES.keys())
def test_where_requests_end_and_what_they_hold(data, expected):
    assert both_ways(data) == expected


@pytest.mark.parametrize("data, expected", [
    (b"", []),
    (b"GET /pi", [BAD]),  # a head cut short is answered 400, as Go's unexpected EOF
    (b"GET /ping HTTP/1.1\r\nHost: h\r\n", [BAD]),
    (GET, [PING]),
    (pub(b"Content-Length: 3\r\n\r\nabc\r\n"), [published(b"abc")]),  # CR LF Go skips, then nothing
    (pub(b"Content-Length: 5\r\n\r\nab"), [published(b"ab", False, True)]),
    (pub(b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n"), [published(b"abc", False, True)]),
])
def test_the_end_of_input(data, expected):
    assert both_ways(data, eof=True) == expected


def test_a_folded_header_is_joined_with_one_space():
    parser = RequestParser(LIMIT)
    parser.feed(b"GET /ping HTTP/1.1\r\nHost: h\r\nX-A:  a \r\n  b\t\r\n\tc\r\n: skipped\r\n\r\n")
    request = parser.ready[0]
    assert isinstance(request, ParsedRequest)
    assert request.headers == ((b"host", b"h"), (b"x-a", b"a b c"))


@pytest.mark.parametrize("head, keep_alive", [
    (b"GET / HTTP/1.1\r\nHost: h\r\n\r\n", True),
    (b"GET / HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, close\r\n\r\n", False),
    (b"GET / HTTP/1.1\r\nHost: h\r\nConnection: a\r\nConnection: CLOSE\r\n\r\n", False),
    (b"GET / HTTP/1.0\r\n\r\n", False),
    (b"GET / HTTP/1.0\r\nConnection: close, keep-alive\r\n\r\n", True),  # Go looks at the first header only
    (b"GET / HTTP/1.0\r\nConnection: a\r\nConnection: keep-alive\r\n\r\n", False),
])
def test_keep_alive_as_gos_server_decides_it(head, keep_alive):
    parser = RequestParser(LIMIT)
    parser.feed(head)
    request = parser.ready[0]
    assert isinstance(request, ParsedRequest)
    assert request.keep_alive is keep_alive


@pytest.mark.parametrize("size, refused", [(4095, False), (4096, True)])
def test_a_chunk_size_line_is_shorter_than_4096_bytes(size, refused):
    line = b"3;" + b"x" * (size - 3) + b"\n"  # size bytes, LF included
    assert len(line) == size
    events = both_ways(pub(b"Transfer-Encoding: chunked\r\n\r\n") + line + b"abc\r\n0\r\n\r\n")
    assert events == [published(b"", False, True) if refused else published(b"abc")]


@pytest.mark.parametrize("filler, refused", [(4087, False), (4088, True)])
def test_a_trailer_ends_within_4096_bytes(filler, refused):
    trailer = b"X-T: " + b"x" * filler + b"\r\n\r\n"
    events = both_ways(pub(b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n") + trailer)
    assert events == [published(b"abc", not refused, refused)]


def test_a_head_over_the_limit_is_431_unless_a_line_before_it_was_bad():
    big = b"GET /ping HTTP/1.1\r\nHost: h\r\nX: " + b"a" * LIMIT + b"\r\n\r\n"
    assert parse(big) == [("refused", 431, "")]
    assert parse(b"NOT HTTP\r\n" + big) == [BAD]


def test_a_head_that_never_ends_is_refused_once_over_the_limit():
    parser = RequestParser(LIMIT)
    parser.feed(b"GET /ping HTTP/1.1\r\nHost: h\r\nX: ")
    sent = 0
    while not parser.failed and sent < 2 * LIMIT:
        parser.feed(b"a" * 4096)
        sent += 4096
    assert _events(parser) == [("refused", 431, "")]
    assert LIMIT - 4096 < sent <= LIMIT


def test_a_long_head_sent_in_pieces():
    parser = RequestParser(LIMIT * 2)
    head = b"GET /ping HTTP/1.1\r\nHost: h\r\n" + b"X: " + b"a" * LIMIT + b"\r\n\r\n"
    for i in range(0, len(head), 100):
        parser.feed(head[i:i + 100])
    assert _events(parser) == [PING]
