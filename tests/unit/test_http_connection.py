"""The HTTP connection's core with no I/O (:mod:`broker.http.connection`): bytes fed in, requests
handed out, responses and the bytes to write. Every case runs fed whole and fed one byte at a
time, and both must write the same bytes and end the same way; the decisions Go's server makes
(keep-alive, close, ``100 Continue``, draining an unread body, refusals, shutdown) are one table.
The same bytes through a real socket: ``tests/unit/test_http_server.py``; beside nsqd:
``tests/system/test_same_answers_as_nsqd.py``."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from broker.http.connection import ANSWERING, DONE, IDLE, HTTPConnection, IllegalMove
from broker.http.events import CLOSED, LEFT, NEED_DATA, BodyReadError, Request, Response

#: The drain limit of these cases (the server's is 256 KiB): an unread body of more is not discarded.
DRAIN = 16


@dataclass(frozen=True)
class Case:
    """``sent`` arrives first (whole, or a byte at a time); ``later`` only once the connection has
    all of ``sent`` and waits for more (a client that sends its body after the head, or after
    ``100 Continue``), then the end of input with ``eof``. The handler reads ``reads``
    bytes of each body (None: reads nothing) and answers ``<method> <path> <what it read>``;
    with ``shutdown`` the server begins closing while the first request is answered."""

    sent: bytes
    wire: bytes  # what the connection writes, Date headers left out
    state: str  # where it ends
    linger: bool = False
    reads: int | None = None
    later: bytes = b""
    eof: bool = False  # the input ends after all of it
    shutdown: bool = False


def get(path: bytes = b"/", extra: bytes = b"", version: bytes = b"1.1") -> bytes:
    return b"GET %s HTTP/%s\r\nHost: h\r\n%s\r\n" % (path, version, extra)


def post(body: bytes, extra: bytes = b"", length: int | None = None) -> bytes:
    size = len(body) if length is None else length
    return b"POST /p HTTP/1.1\r\nHost: h\r\n%sContent-Length: %d\r\n\r\n%s" % (extra, size, body)


def chunked(extra: bytes = b"") -> bytes:
    return b"POST /p HTTP/1.1\r\nHost: h\r\n%sTransfer-Encoding: chunked\r\n\r\n" % extra


def answer(body: bytes, *, version: bytes = b"1.1", connection: bytes = b"", status: bytes = b"200 OK",
           head: bool = False) -> bytes:
    """A response as the connection renders it, without its Date."""
    lines = b"HTTP/%s %s\r\n" % (version, status)
    if body:
        lines += b"Content-Type: text/plain; charset=utf-8\r\n"
    if connection:
        lines += b"Connection: %s\r\n" % connection
    return lines + b"Content-Length: %d\r\n\r\n" % len(body) + (b"" if head else body)


CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
GO_400 = b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request"
GO_NO_HOST = (b"HTTP/1.1 400 Bad Request: missing required Host header\r\nContent-Type: text/plain; charset=utf-8\r\n"
              b"Connection: close\r\n\r\n400 Bad Request: missing required Host header")
CLOSE = b"Connection: close\r\n"
KEEP_ALIVE = b"Connection: keep-alive\r\n"

CASES = {
    # keep-alive and close
    "HTTP/1.1 keeps the connection": Case(get(), answer(b"GET / 0"), IDLE),
    "Connection: close is announced and honoured": Case(get(extra=CLOSE) + get(b"/never"),
                                                        answer(b"GET / 0", connection=b"close"), DONE),
    "HTTP/1.0 is answered in 1.0 and closed": Case(get(version=b"1.0") + get(b"/never"),
                                                   answer(b"GET / 0", version=b"1.0"), DONE),
    "HTTP/1.0 with keep-alive is kept": Case(get(version=b"1.0", extra=KEEP_ALIVE) + get(b"/2"),
                                             answer(b"GET / 0", version=b"1.0", connection=b"keep-alive")
                                             + answer(b"GET /2 0"), IDLE),
    "pipelined requests are answered in order": Case(get(b"/1") + post(b"abc") + get(b"/3"),
                                                     answer(b"GET /1 0") + answer(b"POST /p 3") + answer(b"GET /3 0"),
                                                     IDLE, reads=100),
    "a HEAD's answer has no body": Case(b"HEAD /h HTTP/1.1\r\nHost: h\r\n\r\n", answer(b"HEAD /h 0", head=True), IDLE),
    "the end of input between requests ends it": Case(get(), answer(b"GET / 0"), DONE, eof=True),
    # 100-continue
    "100 Continue goes out on the first read": Case(post(b"", b"Expect: 100-continue\r\n", 5), CONTINUE
                                                    + answer(b"POST /p 5"), IDLE, reads=100, later=b"hello"),
    "100 Continue goes out even when the body came": Case(post(b"hello", b"Expect: 100-continue\r\n"),
                                                          CONTINUE + answer(b"POST /p 5"), IDLE, reads=100),
    "a body awaiting 100 Continue never read closes": Case(post(b"", b"Expect: 100-continue\r\n", 5),
                                                           answer(b"POST /p 0", connection=b"close"), DONE,
                                                           linger=True, later=b"hello"),
    "another Expect is 417 and a close": Case(post(b"", b"Expect: something\r\n", 5),
                                              answer(b"", status=b"417 Expectation Failed", connection=b"close"),
                                              DONE, linger=True, later=b"hello"),
    # drain
    "an unread body is discarded and the next request read": Case(post(b"0123456789") + get(b"/2"),
                                                                  answer(b"POST /p 0") + answer(b"GET /2 0"), IDLE),
    "an unread body arriving later is drained": Case(post(b"", length=10), answer(b"POST /p 0") + answer(b"GET /2 0"),
                                                     IDLE, later=b"0123456789" + get(b"/2")),
    "a partly read body is drained": Case(post(b"0123456789") + get(b"/2"),
                                          answer(b"POST /p 4") + answer(b"GET /2 0"), IDLE, reads=4),
    "a Content-Length beyond the drain limit closes": Case(post(b"", length=DRAIN + 1),
                                                           answer(b"POST /p 0", connection=b"close"), DONE,
                                                           linger=True, later=b"x" * (DRAIN + 1)),
    "a chunked body past the drain limit closes": Case(chunked(), answer(b"POST /p 0", connection=b"close"), DONE,
                                                       linger=True, later=b"20\r\n" + b"x" * 32 + b"\r\n"),
    "a chunked body within the drain limit is drained": Case(chunked(), answer(b"POST /p 0") + answer(b"GET /2 0"),
                                                             IDLE, later=b"4\r\nabcd\r\n0\r\n\r\n" + get(b"/2")),
    # bodies that cannot be read
    "a body cut short is answered without announcing a close": Case(post(b"only", length=50),
                                                                    answer(b"POST /p unexpected EOF"), DONE,
                                                                    reads=100, eof=True),
    "a broken chunked body is answered with a close": Case(chunked() + b"zz\r\nnot a chunk\r\n",
                                                           answer(b"POST /p invalid byte in chunk length",
                                                                  connection=b"close"), DONE, linger=True, reads=100),
    # refusals
    "a head Go refuses gets Go's bytes and a close": Case(b"GET / HTTP/1.1\r\n\r\n" + get(), GO_NO_HOST, DONE,
                                                          linger=True),
    "a bad escape in the path is 400": Case(get(b"/a%zz"), GO_400, DONE, linger=True),
    "a head cut short by the end of input is 400": Case(b"GET / HTTP/1.1\r\nHo", GO_400, DONE, linger=True, eof=True),
    "a refusal after good requests comes after their answers": Case(get(b"/1") + b"BAD\r\n\r\n",
                                                                    answer(b"GET /1 0") + GO_400, DONE, linger=True),
    # shutdown
    "at shutdown the request answered says close, the next is not read": Case(
        get(b"/1") + get(b"/never"), answer(b"GET /1 0", connection=b"close"), DONE, shutdown=True),
}


def _without_dates(data: bytes) -> bytes:
    return re.sub(rb"Date: [^\r]*\r\n", b"", data)


def _split(data: bytes, bytewise: bool) -> list[bytes]:
    if bytewise:
        return [data[i:i + 1] for i in range(len(data))]
    return [data] if data else []  # b"" would be the end of input


def run(case: Case, bytewise: bool, at_once: bool = False) -> tuple[bytes, str, bool]:
    """Drive a connection through ``case`` as the server's I/O loop does; returns what it wrote
    (without dates), its final state and whether its close must linger. With ``at_once``,
    the requests whose whole body is here are answered by ``answer_whole`` (as the read
    poller's task answers them), the others as without."""
    conn = HTTPConnection("peer:1", max_drain_bytes=DRAIN)
    pieces = _split(case.sent, bytewise)
    later = _split(case.later, bytewise)
    wire = bytearray()
    eof = case.eof

    def feed() -> bool:
        """Give the connection the next input; False when none is left."""
        nonlocal eof
        wire.extend(conn.data_to_send())  # what is queued goes out before waiting, as the server writes it
        if not pieces and later:
            pieces.extend(later)
            later.clear()
        if pieces:
            conn.receive_data(pieces.pop(0))
            return True
        if eof:
            eof = False
            conn.receive_data(b"")
            return True
        return False

    def handle(request: Request) -> Response:
        got: str = "0"
        if case.reads is not None:
            while True:
                try:
                    data = conn.read_body(case.reads)
                except BodyReadError as exc:
                    got = str(exc)
                    break
                if data is not None:
                    got = str(len(data))
                    break
                assert feed(), "the body never came"
        return Response(200, f"{request.method} {request.path} {got}".encode())

    def whole(request: Request, body: bytes) -> Response:
        """``handle`` for a body given whole."""
        if case.shutdown:
            conn.closing = True
        got = 0 if case.reads is None else min(len(body), case.reads)
        return Response(200, f"{request.method} {request.path} {got}".encode())

    while True:
        if at_once:
            answered = conn.answer_whole(whole, 0)
            assert answered in (NEED_DATA, CLOSED, LEFT)
            if answered is NEED_DATA:
                if not feed():
                    break
                continue
        event = conn.next_event()
        if event is NEED_DATA:
            if not feed():
                break
        elif event is CLOSED:
            wire.extend(conn.data_to_send())
            break
        else:
            assert isinstance(event, Request) and conn.state == ANSWERING
            if case.shutdown:
                conn.closing = True
            conn.send_response(handle(event))
    return _without_dates(bytes(wire)), conn.state, conn.linger


@pytest.mark.parametrize("name", CASES)
def test_decisions(name):
    case = CASES[name]
    for bytewise in (False, True):
        for at_once in (False, True):
            assert run(case, bytewise, at_once) == (case.wire, case.state, case.linger), (
                f"fed {'bytewise' if bytewise else 'whole'}{', answered at once' if at_once else ''}")


def test_an_idle_connection_ends_at_shutdown_and_a_request_begun_is_answered():
    conn = HTTPConnection()
    assert conn.next_event() is NEED_DATA
    conn.closing = True
    assert conn.next_event() is CLOSED and conn.data_to_send() == b"" and conn.state == DONE
    busy = HTTPConnection()
    busy.receive_data(b"GET /a HTTP/1.1\r\nHo")  # half a head: it is read to its end and answered
    busy.closing = True
    assert busy.next_event() is NEED_DATA
    busy.receive_data(b"st: h\r\n\r\n")
    request = busy.next_event()
    assert isinstance(request, Request) and request.path == "/a"
    busy.send_response(Response(204))
    assert b"Connection: close\r\n" in busy.data_to_send() and busy.next_event() is CLOSED


def test_the_request_is_the_handlers_view_of_the_head():
    conn = HTTPConnection("10.0.0.1:5")
    conn.receive_data(b"POST http://x/a%20b/c?x=1&y=%41 HTTP/1.1\r\nHost: h\r\nX-One: 1\r\nContent-Length: 2\r\n\r\nok")
    request = conn.next_event()
    assert request == Request("POST", "/a b/c", "x=1&y=%41", ((b"host", b"h"), (b"x-one", b"1"),
                                                              (b"content-length", b"2")), 2, "10.0.0.1:5")
    assert conn.request == request
    assert conn.read_body(1) == b"o" and conn.read_body(10) == b"k" and conn.read_body(10) == b""


class Answers:
    """An ``answer_whole`` function that records what it was given and answers as told."""

    def __init__(self, answer=lambda request, body: Response(200, body)):
        self.given: list[tuple[str, bytes]] = []
        self.answer = answer

    def __call__(self, request: Request, body: bytes):
        self.given.append((request.path, body))
        return self.answer(request, body)


@pytest.mark.parametrize("bytewise", [False, True])
def test_requests_answered_at_once_in_one_pass(bytewise):
    data = get(b"/1") + post(b"abc") + b"HEAD /h HTTP/1.1\r\nHost: h\r\n\r\n" + get(b"/4", version=b"1.0", extra=KEEP_ALIVE)
    answers = Answers(lambda request, body: Response(200, request.path.encode() + b" " + body))
    conn = HTTPConnection()
    for piece in _split(data, bytewise):
        conn.receive_data(piece)
        assert conn.answer_whole(answers, 100) is NEED_DATA
    assert conn.state == IDLE and answers.given == [("/1", b""), ("/p", b"abc"), ("/h", b""), ("/4", b"")]
    assert _without_dates(conn.data_to_send()) == (
        answer(b"/1 ") + answer(b"/p abc") + answer(b"/h ", head=True)
        + answer(b"/4 ", version=b"1.0", connection=b"keep-alive"))


def test_a_small_body_still_to_come_is_waited_for_and_a_larger_one_left():
    answers = Answers()
    conn = HTTPConnection()
    conn.receive_data(post(b"01234", length=10))
    assert conn.answer_whole(answers, 10) is NEED_DATA and not answers.given and conn.state == IDLE
    conn.receive_data(b"56789")
    assert conn.answer_whole(answers, 10) is NEED_DATA
    assert answers.given == [("/p", b"0123456789")] and _without_dates(conn.data_to_send()) == answer(b"0123456789")
    conn.receive_data(post(b"01234", length=10))
    assert conn.answer_whole(answers, 9) is LEFT and len(answers.given) == 1  # more than it waits for
    request = conn.next_event()  # left untouched, for the handler
    assert isinstance(request, Request) and conn.read_body(100) is None


@pytest.mark.parametrize("head", [
    post(b"hello", b"Expect: 100-continue\r\n"),  # 100 Continue is due on the first read
    post(b"hello", b"Expect: something\r\n"),  # 417, the server's own answer
    get(b"/a%zz"),  # 400, the server's own answer
    b"GET / HTTP/1.1\r\n\r\n",  # refused: no Host
])
def test_what_only_next_event_answers_is_left(head):
    answers = Answers()
    left, handled = HTTPConnection(), HTTPConnection()
    left.receive_data(head)
    handled.receive_data(head)
    assert left.answer_whole(answers, 100) is LEFT and not answers.given and left.state == IDLE
    assert repr(left.next_event()) == repr(handled.next_event())


def test_a_request_the_function_leaves_is_handed_out_as_if_nothing_had_happened():
    conn = HTTPConnection()
    conn.receive_data(post(b"abc") + get(b"/2"))
    assert conn.answer_whole(Answers(lambda request, body: None), 100) is LEFT
    request = conn.next_event()
    assert isinstance(request, Request) and request.path == "/p" and conn.read_body(100) == b"abc"


def test_an_answer_to_await_hands_the_request_out():
    conn = HTTPConnection()
    conn.receive_data(get(b"/1") + post(b"abc") + get(b"/3"))
    later = object()  # what the function gives to await for /p
    answered = conn.answer_whole(Answers(lambda request, body: later if request.path == "/p" else Response(200)), 100)
    assert answered is later and conn.state == ANSWERING and conn.request is not None and conn.request.path == "/p"
    with pytest.raises(IllegalMove):
        conn.answer_whole(Answers(), 100)
    conn.send_response(Response(200, b"awaited"))
    assert conn.answer_whole(Answers(lambda request, body: Response(204)), 100) is NEED_DATA
    assert _without_dates(conn.data_to_send()) == (answer(b"") + answer(b"awaited")
                                                   + answer(b"", status=b"204 No Content"))


def test_a_request_answered_at_once_may_close_the_connection():
    answers = Answers()
    conn = HTTPConnection()
    conn.receive_data(post(b"a", CLOSE) + post(b"never"))
    assert conn.answer_whole(answers, 100) is CLOSED and conn.state == DONE and not conn.linger
    assert answers.given == [("/p", b"a")]
    assert _without_dates(conn.data_to_send()) == answer(b"a", connection=b"close")


def test_a_write_that_failed_ends_the_body_being_read():
    conn = HTTPConnection()
    conn.receive_data(post(b"", length=10))
    conn.next_event()
    assert conn.read_body(10) is None
    conn.send_failed()
    with pytest.raises(BodyReadError, match="connection closed"):
        conn.read_body(10)
    conn.send_response(Response(500))
    assert conn.next_event() is CLOSED  # the rest of the body cannot be discarded: the connection closes
    assert b"Connection: close\r\n" in conn.data_to_send() and conn.linger


def test_what_the_peer_did_not_take_goes_out_first():
    conn = HTTPConnection()
    conn.receive_data(get(b"/1") + get(b"/2"))
    conn.next_event()
    conn.send_response(Response(200, b"one"))
    data = conn.data_to_send()
    conn.put_back(data[5:])
    conn.next_event()
    conn.send_response(Response(200, b"two"))
    assert _without_dates(data[:5] + conn.data_to_send()) == answer(b"one") + answer(b"two")


@pytest.mark.parametrize(("move", "expected"), [
    (lambda conn: conn.send_response(Response(200)), "send_response in state IDLE"),
    (lambda conn: conn.read_body(10), "read body in state IDLE"),
])
def test_an_illegal_move_raises_an_error_naming_it(move, expected):
    conn = HTTPConnection()
    with pytest.raises(IllegalMove, match=expected):
        move(conn)


def test_asking_for_the_next_request_before_answering_this_one_is_illegal():
    conn = HTTPConnection()
    conn.receive_data(get() + get())
    assert isinstance(conn.next_event(), Request)
    with pytest.raises(IllegalMove, match="next_event in state ANSWERING"):
        conn.next_event()
    conn.send_response(Response(200))
    with pytest.raises(IllegalMove, match="send_response in state IDLE"):
        conn.send_response(Response(200))  # one response per request
