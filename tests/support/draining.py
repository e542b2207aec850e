"""The one way a test empties a channel: FIN everything its consumers are given until a condition holds."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence

import trio

from broker.protocol import Frame, encode_fin
from tests.support.v2client import V2Client

__all__ = ["drain"]


async def drain(clients: V2Client | Sequence[V2Client], done: Callable[[], bool | Awaitable[bool]], *,
                on_message: Callable[[V2Client, object], object] | None = None,
                on_error: Callable[[Frame], object] | None = None, poll: float = 0.01) -> list:
    """FIN every message ``clients`` are given until ``done()`` holds; the messages in the order they came.

    A round takes, from each client in turn, what arrived before a barrier (:meth:`V2Client.sync`)
    and FINs it in one write; ``done()`` (a plain or an async function) is asked after every
    round, so a condition on what the broker holds sees the FINs of the round before it handled.
    ``on_message(client, message)`` sees each message before its FIN, ``on_error(frame)`` each
    non-fatal error frame (without it one fails the drain). A round that brought nothing waits
    ``poll`` seconds: what the broker releases later (deferred, timed-out messages) has no event
    a client could wait on. Bound it with ``trio.fail_after`` (or ``move_on_after`` to report
    what is missing).
    """
    clients = [clients] if isinstance(clients, V2Client) else list(clients)
    got: list = []
    while True:
        arrived = False
        for client in clients:
            msgs = await client.sync(on_error=on_error)
            if not msgs:
                continue
            arrived = True
            for msg in msgs:
                if on_message is not None:
                    on_message(client, msg)
            got += msgs
            await client.send(b"".join(encode_fin(msg.id) for msg in msgs))
        verdict = done()
        if inspect.isawaitable(verdict):
            verdict = await verdict
        if verdict:
            return got
        if not arrived:
            await trio.sleep(poll)
