"""The clients of the crash tests: a publisher and a consumer that work against a broker which
may be killed at any moment, and keep their :class:`~tests.support.ledger.Ledger` up to date.

Each stops quietly when the broker goes away (a kill is what is tested) or when ``stop`` is
set; what each publishes or answers is the caller's choice, made per message.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from broker.protocol import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    decode_message,
    encode_fin,
    encode_rdy,
    encode_req,
    encode_sub,
)
from tests.support.ledger import Ledger
from tests.support.v2client import connect

__all__ = ["DISCONNECTED", "consumer", "publisher"]

#: What a client sees when the broker was killed under it.
DISCONNECTED = (EOFError, trio.BrokenResourceError, trio.ClosedResourceError, OSError, trio.TooSlowError)


async def publisher(address: tuple[str, int], ledger: Ledger, stop: trio.Event,
                    next_publish: Callable[[int], tuple[bytes, list[bytes]]]) -> None:
    """Publish until ``stop``: ``next_publish(seq)`` gives the command and the bodies it carries
    (``seq`` counts the bodies so far); the bodies of each ``OK`` go to ``ledger.acked``.
    An error frame instead of ``OK`` ends it: nothing was acknowledged, nothing promised."""
    try:
        client = await connect(address, timeout=10)
    except OSError:
        return
    seq = 0
    try:
        while not stop.is_set():
            command, bodies = next_publish(seq)
            seq += len(bodies)
            await client.send(command)
            await client.expect_response(b"OK")
            ledger.acked.update(bodies)
    except (*DISCONNECTED, AssertionError):
        return
    finally:
        with trio.CancelScope(shield=True):
            await client.aclose()


async def consumer(address: tuple[str, int], ledger: Ledger, stop: trio.Event, topic: str, channel: str, rdy: int,
                   answer: Callable[[], tuple[str, int]]) -> None:
    """Consume until ``stop``, answering each message as ``answer()`` says: ``("FIN", 0)``,
    ``("REQ", delay_ms)`` or ``("timeout", 0)`` (no answer: the broker times it out).
    Every delivery, answer and ``E_FIN_FAILED`` goes to the ledger."""
    try:
        client = await connect(address, timeout=10)
        await client.send(encode_sub(topic, channel))
        await client.expect_response(b"OK")
        await client.send(encode_rdy(rdy))
    except (*DISCONNECTED, AssertionError):
        return
    bodies: dict[bytes, bytes] = {}  # message id -> body, of the messages this connection was given
    try:
        while not stop.is_set():
            frame = await client.read_frame()
            if frame.frame_type == FRAME_TYPE_ERROR and frame.data.startswith(b"E_FIN_FAILED FIN "):
                ledger.fin_failed(bodies[frame.data.split()[2]])
                continue
            if frame.frame_type != FRAME_TYPE_MESSAGE:
                assert frame.frame_type == FRAME_TYPE_RESPONSE, frame
                continue
            msg = decode_message(frame.data)
            bodies[msg.id] = msg.body
            ledger.delivered(msg.body)
            what, delay_ms = answer()
            ledger.answered(msg.body, what)
            if what == "FIN":
                await client.send(encode_fin(msg.id))
            elif what == "REQ":
                await client.send(encode_req(msg.id, delay_ms))
    except DISCONNECTED:
        return
    finally:
        with trio.CancelScope(shield=True):
            await client.aclose()
