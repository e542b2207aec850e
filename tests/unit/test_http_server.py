"""The HTTP/1.1 layer on its own: a trivial handler behind :class:`H11Server` on 127.0.0.1:0."""

from __future__ import annotations

from contextlib import asynccontextmanager

import trio
from trio.testing import wait_all_tasks_blocked

from broker.http.server import MAX_DRAIN_BYTES, BodyReadError, H11Server, Request, RequestBody, Response
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
async def serving(handler):
    server = H11Server(handler)
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
    server = H11Server(handler)
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
    server = H11Server(handler)
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
