"""The HTTP/1.x layer on its own: a trivial handler behind :class:`HTTP1Server` on 127.0.0.1:0."""

from __future__ import annotations

import email.utils
import locale
import re
import socket
from contextlib import asynccontextmanager

import pytest
import trio
from trio.testing import wait_all_tasks_blocked

from broker.http.server import MAX_DRAIN_BYTES, BodyReadError, HTTP1Server, Request, RequestBody, Response, http_date
from tests.support.http_client import HTTPClient, raw_exchange
from tests.support.waiting import wait_for


class Recorder:
    """A handler that reads ``limit`` bytes of the body (or none) and echoes facts about it."""

    def __init__(self, limit: int | None = None):
        self.limit = limit
        self.requests: list[tuple[Request, bytes | str]] = []
        self.release: trio.Event | None = None
        self.waiting = 0  # requests held until ``release`` is set

    async def __call__(self, request: Request, body: RequestBody) -> Response:
        if self.release is not None:
            self.waiting += 1
            await self.release.wait()
        data: bytes | str = b""
        if self.limit is not None:
            try:
                data = await body.read(self.limit)
            except BodyReadError as exc:
                data = f"error: {exc}"
        self.requests.append((request, data))
        text = data if isinstance(data, str) else f"{request.method} {request.path} {request.raw_query} {len(data)}"
        return Response(200, text.encode())


@asynccontextmanager
async def serving(handler, inline=None):
    server = HTTP1Server(handler, inline=inline)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    address = listeners[0].socket.getsockname()[:2]
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve, listeners)
        try:
            yield server, address
        finally:
            server.stop_listening()
            await server.close_connections(1.0)


async def test_request_fields_and_response_headers():
    handler = Recorder(limit=100)
    async with serving(handler) as (_, address):
        async with HTTPClient(address) as client:
            reply = await client.post("/a%20b/c?x=1&y=%41", b"hello")
    assert reply.body == b"POST /a b/c x=1&y=%41 5"
    assert reply.headers["content-type"] == "text/plain; charset=utf-8"
    assert reply.headers["content-length"] == str(len(reply.body))
    assert reply.headers["date"].endswith(" GMT")
    request, _ = handler.requests[0]
    assert request.content_length == 5
    assert request.remote.startswith("127.0.0.1:")
    assert request.header(b"host") is not None


async def test_body_read_is_limited():
    handler = Recorder(limit=10)
    async with serving(handler) as (_, address):
        async with HTTPClient(address) as client:
            reply = await client.post("/x", b"a" * 1000)
            assert reply.body.endswith(b" 10") and not reply.closed
            reply = await client.post("/x", b"b" * 50_000, chunked=True)
            assert reply.body.endswith(b" 10") and not reply.closed
            # the unread rest was discarded; the connection is still in step
            reply = await client.post("/x", b"c" * 3)
            assert reply.body.endswith(b" 3")
    assert [data for _, data in handler.requests] == [b"a" * 10, b"b" * 10, b"ccc"]


async def test_unread_body_over_the_drain_limit_closes():
    handler = Recorder(limit=None)
    async with serving(handler) as (_, address):
        async with HTTPClient(address) as client:
            reply = await client.post("/x", b"z" * (MAX_DRAIN_BYTES + 1))
            assert reply.status == 200
            assert reply.headers["connection"] == "close"
            assert reply.closed


async def test_unread_small_body_keeps_the_connection():
    handler = Recorder(limit=None)
    async with serving(handler) as (_, address):
        async with HTTPClient(address) as client:
            for _ in range(3):
                reply = await client.post("/x", b"z" * 1000)
                assert not reply.closed


async def test_expect_100_continue_only_when_the_body_is_read():
    async with serving(Recorder(limit=100)) as (_, address):
        async with HTTPClient(address) as client:
            reply = await client.post("/x", b"12345", expect_continue=True)
            assert reply.body.endswith(b" 5") and not reply.closed
    async with serving(Recorder(limit=None)) as (_, address):
        async with HTTPClient(address) as client:
            reply = await client.post("/x", b"12345", expect_continue=True)
            # answered without the body: the stream is in an unknown state, so it closes
            assert reply.status == 200 and reply.closed


async def test_broken_chunked_body_is_a_read_error():
    handler = Recorder(limit=100)
    async with serving(handler) as (_, address):
        answer = await raw_exchange(
            address, b"POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nnot a chunk\r\n")
    assert handler.requests[0][1].startswith("error: ")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")


async def test_truncated_body_is_a_read_error():
    handler = Recorder(limit=100)
    async with serving(handler) as (_, address):
        stream = await trio.open_tcp_stream(*address)
        await stream.send_all(b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 50\r\n\r\nonly this")
        await stream.send_eof()
        await wait_for(lambda: handler.requests)
        await stream.aclose()
    assert handler.requests[0][1].startswith("error: ")


async def test_head_has_headers_but_no_body():
    async with serving(Recorder()) as (_, address):
        answer = await raw_exchange(address, b"HEAD /x HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert b"Content-Length: 10\r\n" in head  # len("HEAD /x  0")
    assert body == b""


async def test_bad_escape_in_path_is_400():
    async with serving(Recorder()) as (_, address):
        answer = await raw_exchange(address, b"GET /a%zz HTTP/1.1\r\nHost: h\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert answer.endswith(b"\r\n\r\n400 Bad Request")


async def test_absolute_form_target():
    handler = Recorder()
    async with serving(handler) as (_, address):
        await raw_exchange(address, b"GET http://example.com/ping?a=b HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
    request, _ = handler.requests[0]
    assert (request.path, request.raw_query) == ("/ping", "a=b")


async def test_close_connections_closes_idle_ones_and_finishes_busy_ones():
    handler = Recorder()
    server = HTTP1Server(handler)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    address = listeners[0].socket.getsockname()[:2]
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve, listeners)
        idle = await HTTPClient(address).connect()
        assert (await idle.get("/one")).status == 200
        handler.release = trio.Event()
        busy = await HTTPClient(address).connect()
        replies = []

        async def slow_request():
            replies.append(await busy.get("/slow"))

        nursery.start_soon(slow_request)
        await wait_for(lambda: handler.waiting == 1 and len(server._connections) == 2)
        server.stop_listening()

        async def release_later():
            # once close_connections is waiting for the busy one to finish
            await wait_all_tasks_blocked()
            handler.release.set()

        nursery.start_soon(release_later)
        with trio.fail_after(5):
            await server.close_connections(5.0)
            assert await idle.stream.receive_some(10) == b""
        assert replies[0].status == 200
        assert replies[0].headers["connection"] == "close"
        await idle.aclose()
        await busy.aclose()


async def test_close_connections_cancels_after_the_grace_period():
    handler = Recorder()
    handler.release = trio.Event()  # never set: the request hangs
    server = HTTP1Server(handler)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    address = listeners[0].socket.getsockname()[:2]
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve, listeners)
        stream = await trio.open_tcp_stream(*address)
        await stream.send_all(b"GET /hang HTTP/1.1\r\nHost: h\r\n\r\n")
        await wait_for(lambda: server._connections)
        server.stop_listening()
        with trio.fail_after(5):
            await server.close_connections(0.1)
        await stream.aclose()


# --------------------------------------------------------------------------- bytes on the wire

_PIPELINE = (
    b"POST /a?x=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello"
    b"POST /b HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: t\r\n\r\n"
    b"GET /c HTTP/1.1\r\nhost: h\r\nX-Long: " + b"v" * 300 + b"\r\n\r\n"
    b"POST /d HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n"
    b"GET /e HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
)


#: Go's answer to a request it cannot read, byte for byte.
GO_BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request"


def _without_dates(answer: bytes) -> bytes:
    return re.sub(rb"Date: [^\r]*\r\n", b"", answer)


async def _send_bytewise(address, data: bytes) -> bytes:
    """Send ``data`` one byte per read of the server's (it has taken each before the next)."""
    stream = await trio.open_tcp_stream(*address)
    received = bytearray()
    with trio.fail_after(30):
        for i in range(len(data)):
            await stream.send_all(data[i:i + 1])
            await wait_all_tasks_blocked()
        while chunk := await stream.receive_some(65536):
            received += chunk
    await stream.aclose()
    return bytes(received)


async def test_pipelined_requests_split_at_every_byte_are_answered_as_when_sent_at_once():
    whole_handler, split_handler = Recorder(limit=100), Recorder(limit=100)
    async with serving(whole_handler) as (_, address):
        whole = await raw_exchange(address, _PIPELINE)
    async with serving(split_handler) as (_, address):
        split = await _send_bytewise(address, _PIPELINE)
    assert _without_dates(split) == _without_dates(whole)
    assert whole.count(b"HTTP/1.1 200 OK\r\n") == 5
    assert [(r.method, r.path, data) for r, data in split_handler.requests] == [
        ("POST", "/a", b"hello"), ("POST", "/b", b"abcde"), ("GET", "/c", b""), ("POST", "/d", b""), ("GET", "/e", b"")]
    assert split_handler.requests[2][0].header(b"x-long") == b"v" * 300


async def test_a_bad_request_after_good_ones_is_answered_after_them():
    handler = Recorder(limit=100)
    async with serving(handler) as (_, address):
        answer = await raw_exchange(address, b"GET /ok HTTP/1.1\r\nHost: h\r\n\r\nNOT HTTP AT ALL\r\n\r\n")
    first, _, rest = answer.partition(b"GET /ok  0")
    assert first.startswith(b"HTTP/1.1 200 OK\r\n")
    assert rest.startswith(b"HTTP/1.1 400 Bad Request\r\n") and rest.endswith(b"\r\n\r\n400 Bad Request")
    assert len(handler.requests) == 1


@pytest.mark.parametrize("head, status_line, body", [
    # Go's net/http answers, checked against nsqd 1.3.0 with the same bytes
    (b"GET /x HTTP/1.1\r\n\r\n", b"HTTP/1.1 400 Bad Request: missing required Host header",
     b"400 Bad Request: missing required Host header"),
    (b"GET /x HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", b"HTTP/1.1 400 Bad Request", b"400 Bad Request"),
    (b"GET /x HTTP/1.1\r\nHost: a b\r\n\r\n", b"HTTP/1.1 400 Bad Request: malformed Host header",
     b"400 Bad Request: malformed Host header"),
    (b"GET /x HTTP/2.0\r\nHost: h\r\n\r\n", b"HTTP/1.1 505 HTTP Version Not Supported: unsupported protocol version",
     b"505 HTTP Version Not Supported: unsupported protocol version"),
    (b"GET /x\r\n\r\n", b"HTTP/1.1 400 Bad Request", b"400 Bad Request"),
    (b"POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n", b"HTTP/1.1 501 Not Implemented",
     b"Unsupported transfer encoding"),
    (b"POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
     b"HTTP/1.1 501 Not Implemented", b"Unsupported transfer encoding"),
    (b"GET /x HTTP/1.1\r\nHost: h\r\nX-A: a\x01b\r\n\r\n", b"HTTP/1.1 400 Bad Request: invalid header value",
     b"400 Bad Request: invalid header value"),
    (b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nExpect: teapot\r\n\r\nabc",
     b"HTTP/1.1 417 Expectation Failed", b""),
])
async def test_unservable_heads_get_gos_answer_and_a_close(head, status_line, body):
    handler = Recorder(limit=100)
    async with serving(handler) as (_, address):
        answer = await raw_exchange(address, head)
    assert answer.startswith(status_line + b"\r\n")
    assert b"Connection: close\r\n" in answer
    assert answer.partition(b"\r\n\r\n")[2] == body
    assert handler.requests == []


async def test_http_1_0_ignores_transfer_encoding():
    """As Go's server does: the request has no body (no Content-Length), and the chunks
    that follow are read as the next request (nsqd: ``400 MSG_EMPTY``, then ``400``)."""
    handler = Recorder(limit=100)
    async with serving(handler) as (_, address):
        answer = await raw_exchange(address, b"POST /x HTTP/1.0\r\nTransfer-Encoding: chunked\r\n"
                                              b"Connection: keep-alive\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
    assert [(request.path, data) for request, data in handler.requests] == [("/x", b"")]
    first, _, rest = answer.partition(b"POST /x  0")
    assert first.startswith(b"HTTP/1.0 200 OK\r\n") and b"Connection: keep-alive\r\n" in first
    assert rest == GO_BAD_REQUEST


async def test_bare_lf_ends_lines_as_in_gos_server():
    handler = Recorder(limit=100)
    async with serving(handler) as (_, address):
        answer = await raw_exchange(address, b"POST /a HTTP/1.1\nHost: h\nContent-Length: 3\n\nabc"
                                              b"GET /b HTTP/1.1\r\nHost: h\n\r\n"
                                              b"GET /c HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\n")
    assert [(request.path, data) for request, data in handler.requests] == [("/a", b"abc"), ("/b", b""), ("/c", b"")]
    assert answer.count(b"HTTP/1.1 200 OK\r\n") == 3


async def test_a_refused_head_gets_gos_exact_bytes():
    async with serving(Recorder()) as (_, address):
        answer = await raw_exchange(address, b"GET /x HTTP/1.1\r\n\r\n")
    assert answer == (b"HTTP/1.1 400 Bad Request: missing required Host header\r\nContent-Type: text/plain; "
                      b"charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request: missing required Host header")


@pytest.mark.parametrize("data", [b"GET /x", b"GET /x HTTP/1.1\r\nHost: h\r\n"])
async def test_a_head_cut_short_by_the_end_of_input_is_400(data):
    async with serving(Recorder()) as (_, address):
        stream = await trio.open_tcp_stream(*address)
        with trio.fail_after(5):
            await stream.send_all(data)
            await stream.send_eof()
            received = b""
            while chunk := await stream.receive_some(65536):
                received += chunk
        await stream.aclose()
    assert received == GO_BAD_REQUEST


async def test_the_last_bytes_of_a_head_and_the_end_of_input_in_one_edge_are_answered():
    """The end of input that arrives with the last bytes brings no edge of its own: the
    connection must not wait for one (it answered nothing and stayed open)."""
    async with serving(Recorder(), inline=lambda request, body: None) as (_, address):
        client = socket.create_connection(address)
        client.setblocking(False)
        try:
            client.send(b"GET /x HTTP/1.1\r\n")
            await wait_all_tasks_blocked()  # the connection read it and waits on the poller
            client.send(b"Host: h\r\n")
            client.shutdown(socket.SHUT_WR)  # both before the poller looks again
            received = b""
            with trio.fail_after(5):
                while True:
                    await trio.lowlevel.wait_readable(client)
                    chunk = client.recv(65536)
                    if not chunk:
                        break
                    received += chunk
        finally:
            client.close()
    assert received == GO_BAD_REQUEST


async def test_a_body_cut_short_that_the_handler_read_is_answered_without_announcing_a_close():
    """Go's reader takes the end of input in a Content-Length body as the body's end (with
    an error for the handler); the connection ends after the answer all the same."""
    handler = Recorder(limit=100)
    async with serving(handler) as (_, address):
        stream = await trio.open_tcp_stream(*address)
        with trio.fail_after(5):
            await stream.send_all(b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nab")
            await stream.send_eof()
            received = b""
            while chunk := await stream.receive_some(65536):
                received += chunk
        await stream.aclose()
    assert handler.requests[0][1].startswith("error: ")
    assert received.startswith(b"HTTP/1.1 200 OK\r\n") and b"Connection" not in received


@pytest.mark.parametrize("extra, answered", [((1 << 20) + 3000, True), ((1 << 20) + 5000, False)])
async def test_the_head_limit_is_gos_one_megabyte_plus_4096(extra, answered):
    async with serving(Recorder()) as (_, address):
        # sent in pieces, as a big head arrives: the limit holds across reads
        answer = await raw_exchange(address, b"GET /x HTTP/1.1\r\nHost: h\r\nConnection: close\r\nX-Big: "
                                    + b"a" * extra + b"\r\n\r\n")
    if answered:
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    else:
        assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")


async def test_http_1_0_is_answered_in_1_0_and_kept_alive_only_when_asked():
    async with serving(Recorder()) as (_, address):
        answer = await raw_exchange(address, b"GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
                                              b"GET /b HTTP/1.0\r\n\r\nGET /never HTTP/1.0\r\n\r\n")
    first, second = answer.split(b"HTTP/1.0 200 OK\r\n")[1:]
    assert b"Connection: keep-alive\r\n" in first and first.endswith(b"GET /a  0")
    assert b"Connection" not in second and second.endswith(b"GET /b  0")


async def test_100_continue_is_sent_on_the_first_read_even_if_the_body_came_with_the_head():
    async with serving(Recorder(limit=100)) as (_, address):
        answer = await raw_exchange(address, b"POST /x HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\n"
                                              b"Content-Length: 3\r\nConnection: close\r\n\r\nabc")
    assert answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n")
    assert answer.endswith(b"POST /x  3")


async def test_content_length_with_chunked_transfer_encoding_reads_the_chunks():
    handler = Recorder(limit=100)
    async with serving(handler) as (_, address):
        await raw_exchange(address, b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n"
                                    b"Connection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
    request, data = handler.requests[0]
    assert (request.content_length, data) == (None, b"hello")


async def test_large_answers_to_pipelined_requests_are_written_before_the_batch_is_done():
    release = trio.Event()

    async def handler(request: Request, body: RequestBody) -> Response:
        if request.path == "/last":
            await release.wait()
        return Response(200, b"x" * 300_000)

    async with serving(handler) as (_, address):
        stream = await trio.open_tcp_stream(*address)
        await stream.send_all(b"GET /first HTTP/1.1\r\nHost: h\r\n\r\n"
                              b"GET /last HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        received = bytearray()
        with trio.fail_after(10):
            # the first answer arrives while the second request is still being handled
            while len(received) < 300_000:
                received += await stream.receive_some(65536)
            release.set()
            while chunk := await stream.receive_some(65536):
                received += chunk
        await stream.aclose()
    assert received.count(b"HTTP/1.1 200 OK\r\n") == 2
    assert len(received) > 600_000


class Inline:
    """An inline handler: ``/now`` is answered at once with the body, ``/later`` by a
    coroutine, ``/big`` at once with a megabyte; anything else is left to the task's handler."""

    def __init__(self) -> None:
        self.answered: list[str] = []

    def __call__(self, request: Request, body: bytes):
        if request.path == "/now":
            self.answered.append("now")
            return Response(200, b"now " + body)
        if request.path == "/big":
            self.answered.append("big")
            return Response(200, b"b" * (1 << 20))
        if request.path == "/later":
            self.answered.append("later")

            async def later() -> Response:
                await trio.lowlevel.checkpoint()
                return Response(200, b"later " + body)

            return later()
        return None


def post(path: bytes, body: bytes, extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: h\r\n%sContent-Length: %d\r\n\r\n%s" % (path, extra, len(body), body)


async def waiting_connection(address) -> trio.SocketStream:
    """A connection whose task answered one request and waits on the poller: what it is sent
    next reaches the inline handler."""
    stream = await trio.open_tcp_stream(*address)
    await stream.send_all(b"GET /warm-up HTTP/1.1\r\nHost: h\r\n\r\n")
    received = b""
    while not re.search(rb"Content-Length: (\d+)\r\n.*\r\n\r\nGET /warm-up  0$", received, re.S):
        received += await stream.receive_some(65536)
    return stream


class Answers:
    """Reads a connection's responses in the background, 4 KiB at a time."""

    def __init__(self, stream: trio.SocketStream):
        self.stream = stream
        self.received = bytearray()
        self.closed = False

    async def run(self) -> None:
        while chunk := await self.stream.receive_some(4096):
            self.received.extend(chunk)
        self.closed = True

    async def wait(self, count: int) -> list[bytes]:
        await wait_for(lambda: len(complete_bodies(self.received)) >= count)
        return complete_bodies(self.received)


def complete_bodies(data: bytes | bytearray) -> list[bytes]:
    """The bodies of the complete responses at the start of ``data``."""
    found = []
    at = 0
    while (head_end := data.find(b"\r\n\r\n", at)) != -1:
        length = int(re.search(rb"Content-Length: (\d+)", data[at:head_end]).group(1))
        if head_end + 4 + length > len(data):
            break
        found.append(bytes(data[head_end + 4:head_end + 4 + length]))
        at = head_end + 4 + length
    return found


async def test_inline_answers_mixed_with_the_tasks_keep_their_order():
    inline = Inline()
    async with serving(Recorder(limit=100), inline) as (_, address):
        stream = await waiting_connection(address)
        stream.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)  # the megabyte's write comes up short
        answers = Answers(stream)
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(answers.run)
                # arriving together: all answered inline, the megabyte's write finished by the task
                await stream.send_all(post(b"/now", b"1") + post(b"/big", b"") + post(b"/now", b"2"))
                assert await answers.wait(3) == [b"now 1", b"b" * (1 << 20), b"now 2"]
                # a head first, then its body a byte at a time: still inline
                data = post(b"/now", b"345")
                await stream.send_all(data[:-3])
                for i in range(3):
                    await stream.send_all(data[-3 + i:len(data) - 2 + i])
                assert (await answers.wait(4))[3] == b"now 345"
                # to be awaited: by the task
                await stream.send_all(post(b"/later", b"6"))
                assert (await answers.wait(5))[4] == b"later 6"
                assert inline.answered == ["now", "big", "now", "now", "later"]
                # one for the task: it answers what came with it too
                await stream.send_all(post(b"/now", b"7") + post(b"/task", b"8") + post(b"/now", b"9")
                                      + post(b"/now", b"10", b"Connection: close\r\n") + post(b"/now", b"never"))
                assert (await answers.wait(9))[5:] == [b"now 7", b"POST /task  1", b"POST /now  1", b"POST /now  2"]
                assert inline.answered == ["now", "big", "now", "now", "later", "now"]
                await wait_for(lambda: answers.closed)
        await stream.aclose()


async def test_an_idle_connection_waiting_on_the_poller_closes_at_shutdown():
    inline = Inline()
    async with serving(Recorder(), inline) as (server, address):
        stream = await waiting_connection(address)
        await stream.send_all(post(b"/now", b"x"))
        received = b""
        with trio.fail_after(5):
            while not received.endswith(b"now x"):
                received += await stream.receive_some(65536)
            server.stop_listening()
            await server.close_connections(5.0)
            assert await stream.receive_some(10) == b""
        await stream.aclose()


@pytest.mark.parametrize("seconds", [0, 784111777, 951782400, 1700000000.9, 4102444799])
def test_the_date_header_is_rfc_9110s_in_english_whatever_the_locale(seconds):
    expected = email.utils.formatdate(int(seconds), usegmt=True)
    assert http_date(seconds) == expected
    before = locale.setlocale(locale.LC_TIME)
    try:
        for name in ("de_DE.UTF-8", "fr_FR.UTF-8", "C.UTF-8"):
            try:
                locale.setlocale(locale.LC_TIME, name)
            except locale.Error:
                continue
            assert http_date(seconds) == expected
    finally:
        locale.setlocale(locale.LC_TIME, before)
