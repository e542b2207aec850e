"""A stand-in for nsqlookupd's TCP side that records what each connection says.

It answers as nsqlookupd does: the IDENTIFY with a JSON description of itself, every other
command with ``OK``, each answer size-prefixed. Each connection's conversation is a list: the
magic, ``("IDENTIFY", body)``, then the command lines as bytes.
"""

from __future__ import annotations

import functools
import json

import trio

__all__ = ["start_fake_lookupd"]


async def start_fake_lookupd(nursery: trio.Nursery, conversations: list[list], port: int = 0) -> str:
    """Listen on 127.0.0.1:``port`` in ``nursery``; return ``host:port``. Each connection appends its conversation."""

    async def handler(stream: trio.SocketStream) -> None:
        await _record_conversation(stream, conversations)

    listeners = await nursery.start(functools.partial(trio.serve_tcp, handler, port, host="127.0.0.1"))
    return "127.0.0.1:%d" % listeners[0].socket.getsockname()[1]


async def _record_conversation(stream: trio.SocketStream, conversations: list[list]) -> None:
    """Play nsqlookupd for one connection: record what arrives, answer as lookupd does."""
    conversation: list = []
    conversations.append(conversation)
    buffer = b""

    async def need(size: int) -> bytes:
        nonlocal buffer
        while len(buffer) < size:
            data = await stream.receive_some(65536)
            if not data:
                raise EOFError
            buffer += data
        taken, buffer = buffer[:size], buffer[size:]
        return taken

    async def answer(data: bytes) -> None:
        await stream.send_all(len(data).to_bytes(4, "big") + data)

    try:
        conversation.append(await need(4))
        while True:
            line = b""
            while not line.endswith(b"\n"):
                line += await need(1)
            if line == b"IDENTIFY\n":
                body = json.loads(await need(int.from_bytes(await need(4), "big")))
                conversation.append(("IDENTIFY", body))
                await answer(json.dumps({"tcp_port": 4160, "http_port": 4161, "version": "1.3.0",
                                         "broadcast_address": "", "hostname": "recorder"}).encode())
            else:
                conversation.append(line)
                await answer(b"OK")
    except (EOFError, trio.BrokenResourceError):
        pass
