"""A TCP relay in front of a server that keeps every byte its clients send: what the server saw.

``async with wiretap(daemon.addresses.tcp) as tap`` listens on 127.0.0.1 (any free port,
``tap.address``) and relays each connection to the target, both ways, until either side
closes; ``tap.sent`` holds, per connection, the bytes the client sent, in order. The relay's
tasks live in the context manager's nursery and end with it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import trio

__all__ = ["Wiretap", "wiretap"]

_CHUNK = 65536


class Wiretap:
    """Where the relay listens, and what each of its clients sent."""

    def __init__(self) -> None:
        self.address: tuple[str, int] = ("127.0.0.1", 0)
        self.sent: list[bytearray] = []

    def seen(self) -> bytes:
        """Everything every client sent, connection after connection."""
        return b"".join(self.sent)


async def _pump(source: trio.abc.Stream, sink: trio.abc.Stream, record: bytearray | None,
                done: trio.CancelScope) -> None:
    try:
        while chunk := await source.receive_some(_CHUNK):
            if record is not None:
                record += chunk
            await sink.send_all(chunk)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        done.cancel()  # one side is gone: so is the relayed connection


@asynccontextmanager
async def wiretap(target: tuple[str, int]) -> AsyncIterator[Wiretap]:
    """Relay 127.0.0.1:<any> to ``target``, recording what clients send (see the module)."""
    tap = Wiretap()

    async def relay(client: trio.SocketStream) -> None:
        record = bytearray()
        tap.sent.append(record)
        async with client, await trio.open_tcp_stream(*target) as server, trio.open_nursery() as pumps:
            pumps.start_soon(_pump, client, server, record, pumps.cancel_scope)
            pumps.start_soon(_pump, server, client, None, pumps.cancel_scope)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, relay, 0, host="127.0.0.1"))
        tap.address = listeners[0].socket.getsockname()[:2]
        yield tap
        nursery.cancel_scope.cancel()
