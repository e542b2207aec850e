"""A stranger that registers with nsqlookupd as a node (nsqlookupd asks no proof), so every
replicating pynsqd dials it as a peer, and answers the node that dialled in one of three ways:

- ``"nested"``: the first IDENTIFY is answered with JSON nested 5,000 deep (within the size an
  unproven peer's frame may have);
- ``"huge"``: the answer's frame says it is 64 MiB long, and 1 MiB of it follows;
- ``"relay"``: nothing of its own: the bytes go both ways to and from a real node (``target``),
  as a rogue that would pass another node's handshake off as its own.

It knows no secret. ``dials`` counts the connections nodes made to it, ``upstream`` what the
relayed target answered.
"""

from __future__ import annotations

import json
import struct

import trio

from broker.protocol import MAGIC_V2

__all__ = ["RogueNode"]

_FRAME = struct.Struct(">ii")


class RogueNode:
    """Listens on 127.0.0.1 and registers with the nsqlookupd at ``lookupd_tcp`` (``host:port``);
    see the module docstring."""

    def __init__(self, lookupd_tcp: str, mode: str, target: tuple[str, int] | None = None):
        assert mode in ("nested", "huge", "relay") and (mode != "relay" or target is not None)
        host, port = lookupd_tcp.rsplit(":", 1)
        self.lookupd_tcp = (host, int(port))
        self.mode = mode
        self.target = target
        self.port = 0
        self.dials = 0
        self.upstream = b""

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        lookupd = await trio.open_tcp_stream(*self.lookupd_tcp)
        identify = json.dumps({"broadcast_address": "127.0.0.1", "tcp_port": self.port, "http_port": self.port,
                               "version": "1.3.0", "hostname": "rogue"}).encode()
        await lookupd.send_all(b"  V1" + b"IDENTIFY\n" + struct.pack(">I", len(identify)) + identify)
        await lookupd.receive_some(4096)  # its answer; registered from now on
        async with lookupd, trio.open_nursery() as nursery:
            task_status.started()
            await trio.serve_listeners(self._serve, listeners, handler_nursery=nursery)

    async def _serve(self, stream: trio.SocketStream) -> None:
        self.dials += 1
        try:
            await self._answer(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the node hung up on it

    async def _answer(self, stream: trio.SocketStream) -> None:
        async with stream:
            if self.mode == "relay":
                await self._relay(stream)
                return
            await _read_command(stream)  # the magic and the first IDENTIFY
            if self.mode == "nested":
                payload = b"[" * 5_000 + b"]" * 5_000
                await stream.send_all(_FRAME.pack(len(payload) + 4, 0) + payload)
            else:
                await stream.send_all(_FRAME.pack(64 << 20, 0) + b"\0" * (1 << 20))
            with trio.move_on_after(10):
                while await stream.receive_some(65536):
                    pass

    async def _relay(self, stream: trio.SocketStream) -> None:
        assert self.target is not None
        upstream = await trio.open_tcp_stream(*self.target)

        async def pump(source: trio.SocketStream, sink: trio.SocketStream, keep: bool) -> None:
            try:
                while data := await source.receive_some(65536):
                    if keep:
                        self.upstream += data
                    await sink.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            nursery.cancel_scope.cancel()

        async with upstream, trio.open_nursery() as nursery:
            nursery.start_soon(pump, stream, upstream, False)
            nursery.start_soon(pump, upstream, stream, True)


async def _read_command(stream: trio.SocketStream) -> None:
    """Read the V2 magic and one command with a body (IDENTIFY)."""
    data = b""
    while len(data) < len(MAGIC_V2) or b"\n" not in data[len(MAGIC_V2):]:
        data += await stream.receive_some(65536)
    line_end = data.index(b"\n", len(MAGIC_V2)) + 1
    while len(data) < line_end + 4:
        data += await stream.receive_some(65536)
    size = struct.unpack(">I", data[line_end:line_end + 4])[0]
    while len(data) < line_end + 4 + size:
        data += await stream.receive_some(65536)
