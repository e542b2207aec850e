"""A small HTTP/1.1 test client on Trio and h11 (no tests in this module).

It keeps the connection open between requests (keep-alive), can send chunked
bodies and ``Expect: 100-continue``, and reports whether the server closed the
connection after a response -- what the HTTP tests need to observe.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import h11
import trio

__all__ = ["Reply", "HTTPClient", "request", "raw_exchange"]

TIMEOUT = 10.0


@dataclass
class Reply:
    """A response: status, headers (lower-case names), body, and whether the server closed."""

    status: int
    headers: dict[str, str]
    body: bytes
    closed: bool = False

    def json(self):
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode()


class HTTPClient:
    """One keep-alive connection to ``address`` (host, port)."""

    def __init__(self, address: tuple[str, int]):
        self.address = address
        self.stream: trio.SocketStream | None = None
        self.conn: h11.Connection | None = None

    async def connect(self) -> HTTPClient:
        self.stream = await trio.open_tcp_stream(*self.address)
        self.conn = h11.Connection(h11.CLIENT)
        return self

    async def aclose(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()
            self.stream = None

    async def __aenter__(self) -> HTTPClient:
        return await self.connect()

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def _next_event(self):
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(await self.stream.receive_some(65536))
                continue
            return event

    async def request(self, method: str, target: str, body: bytes | None = None, *,
                      headers: list[tuple[str, str]] | None = None, chunked: bool = False,
                      expect_continue: bool = False) -> Reply:
        """Send one request and read its response (whole body)."""
        if self.stream is None:
            await self.connect()
        with trio.fail_after(TIMEOUT):
            if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
                self.conn.start_next_cycle()
            host = f"{self.address[0]}:{self.address[1]}"
            all_headers = [("Host", host)] + list(headers or [])
            if chunked:
                all_headers.append(("Transfer-Encoding", "chunked"))
            elif body is not None or method in ("POST", "PUT"):
                all_headers.append(("Content-Length", str(len(body or b""))))
            if expect_continue:
                all_headers.append(("Expect", "100-continue"))
            data = self.conn.send(h11.Request(method=method, target=target, headers=all_headers))
            await self.stream.send_all(data)
            if expect_continue:
                event = await self._next_event()
                if isinstance(event, h11.InformationalResponse):
                    assert event.status_code == 100
                else:
                    return await self._finish(event)
            if body:
                if chunked:
                    for start in range(0, len(body), 65536):
                        await self.stream.send_all(self.conn.send(h11.Data(data=body[start:start + 65536])))
                else:
                    await self.stream.send_all(self.conn.send(h11.Data(data=body)))
            if self.conn.our_state is h11.SEND_BODY:
                await self.stream.send_all(self.conn.send(h11.EndOfMessage()))
            return await self._finish(await self._next_event())

    async def _finish(self, event) -> Reply:
        while isinstance(event, h11.InformationalResponse):
            event = await self._next_event()
        assert isinstance(event, h11.Response), event
        headers = {name.decode().lower(): value.decode("latin-1") for name, value in event.headers}
        parts = []
        while True:
            item = await self._next_event()
            if isinstance(item, h11.Data):
                parts.append(item.data)
            elif isinstance(item, h11.EndOfMessage):
                break
        closed = self.conn.our_state is h11.MUST_CLOSE or self.conn.their_state is h11.MUST_CLOSE
        if closed:
            await self.aclose()
        return Reply(event.status_code, headers, b"".join(parts), closed)

    async def get(self, target: str, **kw) -> Reply:
        return await self.request("GET", target, **kw)

    async def post(self, target: str, body: bytes | None = None, **kw) -> Reply:
        return await self.request("POST", target, body, **kw)


async def request(address: tuple[str, int], method: str, target: str, body: bytes | None = None, **kw) -> Reply:
    """One request on a fresh connection."""
    async with HTTPClient(address) as client:
        return await client.request(method, target, body, **kw)


async def create_channel(address: tuple[str, int], topic: str = "t", channel: str = "c") -> None:
    """Create ``topic`` and its ``channel`` over HTTP at ``address`` (each answered 200), so the
    channel gets its copy of every message published from now on."""
    for target in (f"/topic/create?topic={topic}", f"/channel/create?topic={topic}&channel={channel}"):
        reply = await request(address, "POST", target)
        assert reply.status == 200, (target, reply)


async def raw_exchange(address: tuple[str, int], data: bytes, *, read_until_close: bool = True) -> bytes:
    """Send raw bytes and return everything the server answers until it closes."""
    stream = await trio.open_tcp_stream(*address)
    try:
        with trio.fail_after(TIMEOUT):
            await stream.send_all(data)
            chunks = []
            while True:
                try:
                    chunk = await stream.receive_some(65536)
                except trio.BrokenResourceError:
                    break
                if not chunk:
                    break
                chunks.append(chunk)
                if not read_until_close and b"\r\n\r\n" in b"".join(chunks):
                    break
            return b"".join(chunks)
    finally:
        await stream.aclose()
