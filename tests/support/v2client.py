"""A minimal Trio V2 client for tests: raw bytes out, decoded frames back."""

from __future__ import annotations

import json
from collections.abc import Callable

import trio

from broker.protocol import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    MAGIC_V2,
    Frame,
    FrameDecoder,
    decode_message,
    encode_fin,
    encode_identify,
    encode_mpub,
    encode_pub,
    encode_rdy,
    encode_sub,
)
from broker.protocol.replica import ACCEPTOR, CONNECTOR, new_nonce, proof, proof_holds

__all__ = ["BARRIER_ID", "V2Client", "connect", "consume", "consume_new", "publish", "publish_batch", "subscriber",
           "tcp_address"]

#: The message ID a barrier FINs: a well-formed ID that no message ever has.
BARRIER_ID = b"0000000000000000"
_BARRIER_ANSWER = b"E_FIN_FAILED FIN " + BARRIER_ID + b" failed ID not in flight"


class V2Client:
    """One connection to a broker; every read is bounded by ``timeout`` seconds."""

    def __init__(self, stream: trio.SocketStream, timeout: float = 5.0, address: tuple[str, int] | None = None):
        self.stream = stream
        self.address = address  # the broker's, as dialled
        self.timeout = timeout
        self.decoder = FrameDecoder()
        self._frames: list[Frame] = []

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def read_frame(self, *, skip_heartbeats: bool = True) -> Frame:
        """The next frame; raises EOFError if the server closed the connection."""
        with trio.fail_after(self.timeout):
            while True:
                while self._frames:
                    frame = self._frames.pop(0)
                    if skip_heartbeats and frame.frame_type == FRAME_TYPE_RESPONSE and frame.data == b"_heartbeat_":
                        continue
                    return frame
                data = await self.stream.receive_some(65536)
                if not data:
                    raise EOFError("connection closed by server")
                self._frames.extend(self.decoder.feed(data))

    async def expect_response(self, data: bytes = b"OK") -> None:
        frame = await self.read_frame()
        assert (frame.frame_type, frame.data) == (FRAME_TYPE_RESPONSE, data), frame

    async def timed_pub(self, topic: str, body: bytes) -> float:
        """PUB and wait for its OK; the round trip's seconds."""
        start = trio.current_time()
        await self.send(encode_pub(topic, body))
        await self.expect_response(b"OK")
        return trio.current_time() - start

    async def expect_error(self, payload: bytes, *, closed: bool = True) -> None:
        """The next frame is this exact error; with ``closed`` the server then hangs up."""
        frame = await self.read_frame()
        assert (frame.frame_type, frame.data) == (FRAME_TYPE_ERROR, payload), frame
        if closed:
            await self.expect_closed()

    async def expect_closed(self) -> None:
        with trio.fail_after(self.timeout):
            while True:
                try:
                    data = await self.stream.receive_some(65536)
                except trio.BrokenResourceError:
                    return
                if not data:
                    return
                frames = self.decoder.feed(data)
                assert all(f.data == b"_heartbeat_" for f in frames), frames

    async def read_message(self):
        frame = await self.read_frame()
        assert frame.frame_type == FRAME_TYPE_MESSAGE, frame
        return decode_message(frame.data)

    async def read_messages(self, n: int) -> list:
        return [await self.read_message() for _ in range(n)]

    async def identify(self, **params) -> dict | None:
        await self.send(encode_identify(params))
        frame = await self.read_frame()
        assert frame.frame_type == FRAME_TYPE_RESPONSE, frame
        return None if frame.data == b"OK" else json.loads(frame.data)

    async def identify_as_node(self, node_id: str, secret: bytes = b"", **params) -> dict:
        """The node-to-node handshake (:mod:`broker.protocol.replica`) as node ``node_id`` holding
        ``secret``, without TLS, to the address this client dialled: the first IDENTIFY's answer
        must prove the broker holds the secret too; returns the answer to the second, proving
        IDENTIFY (which names the broker's node under ``replica`` when it accepted the proof)."""
        assert self.address is not None, "the handshake binds the address dialled"
        nonce, dialled = new_nonce(), "%s:%d" % self.address
        first = await self.identify(feature_negotiation=True, replica=node_id, replica_nonce=nonce,
                                    replica_address=dialled, **params)
        assert first is not None
        peer, peer_nonce = first["replica"], first["replica_nonce"]
        assert proof_holds(first["replica_proof"], secret, ACCEPTOR, peer_nonce, nonce, peer, node_id, dialled), first
        answer = await self.identify(feature_negotiation=True, replica=node_id, **params, replica_proof=proof(
            secret, CONNECTOR, nonce, peer_nonce, node_id, peer, dialled))
        assert answer is not None
        return answer

    async def sync(self, on_error: Callable[[Frame], object] | None = None) -> list:
        """The messages that arrive before the server has handled everything sent so far.

        Another error frame goes to ``on_error`` if given (a non-fatal one, such as the
        ``E_FIN_FAILED`` of a message that timed out first), else fails the read.

        The barrier is a FIN of :data:`BARRIER_ID`: the server handles a connection's commands
        in order and answers it with nsqd's non-fatal ``E_FIN_FAILED``, so once that answer is
        read, every earlier command has been handled and every message it released was sent.
        FIN is valid once subscribed and while closing.
        """
        await self.send(encode_fin(BARRIER_ID))
        messages = []
        while True:
            frame = await self.read_frame()
            if (frame.frame_type, frame.data) == (FRAME_TYPE_ERROR, _BARRIER_ANSWER):
                return messages
            if frame.frame_type == FRAME_TYPE_ERROR and on_error is not None:
                on_error(frame)
                continue
            assert frame.frame_type == FRAME_TYPE_MESSAGE, frame
            messages.append(decode_message(frame.data))

    async def expect_quiet(self) -> None:
        """No message arrives before the server has handled everything sent so far (see :meth:`sync`)."""
        messages = await self.sync()
        assert not messages, f"unexpected messages {messages}"

    async def aclose(self) -> None:
        await self.stream.aclose()


def tcp_address(broker) -> tuple[str, int]:
    """The V2 address of ``broker``: an in-process daemon, a :class:`~tests.support.processes.BrokerProcess`,
    or the address itself."""
    if isinstance(broker, tuple):
        return broker
    addresses = getattr(broker, "addresses", None)
    return addresses.tcp if addresses is not None else broker.tcp


async def connect(address: tuple[str, int], *, magic: bool = True, timeout: float = 5.0) -> V2Client:
    stream = await trio.open_tcp_stream(*address)
    client = V2Client(stream, timeout, address)
    if magic:
        await client.send(MAGIC_V2)
    return client


async def subscriber(broker, topic="t", channel="c", rdy=None, *, timeout: float = 5.0, **identify) -> V2Client:
    """A client of ``broker`` (see :func:`tcp_address`) subscribed to ``topic``/``channel``
    (IDENTIFY first if given), RDY if given."""
    client = await connect(tcp_address(broker), timeout=timeout)
    if identify:
        await client.identify(**identify)
    await client.send(encode_sub(topic, channel))
    await client.expect_response(b"OK")
    if rdy is not None:
        await client.send(encode_rdy(rdy))
    return client


async def consume(broker, topic: str, channel: str, count: int, *, rdy: int | None = None, quiet: bool = False,
                  timeout: float = 5.0) -> list[bytes]:
    """Subscribe to ``topic``/``channel`` of ``broker`` (see :func:`tcp_address`) and return the
    bodies of the next ``count`` messages, each finished as it comes; when it returns, the broker
    has handled every FIN (see :meth:`V2Client.sync`).

    RDY is ``rdy``, by default ``count`` up to 2,500 (nsqd's maximum); RDY 1 gives the order the
    channel delivers in. With ``quiet``, nothing more may arrive once they are finished."""
    client = await subscriber(broker, topic, channel, rdy=rdy or min(count, 2500), timeout=timeout)
    bodies = []
    for _ in range(count):
        msg = await client.read_message()
        bodies.append(msg.body)
        await client.send(encode_fin(msg.id))
    more = await client.sync()
    assert not (quiet and more), f"unexpected messages {more}"
    await client.aclose()
    return bodies


async def consume_new(broker, topic: str, channel: str, count: int, seen: set[bytes], *,
                      timeout: float = 5.0) -> tuple[list[bytes], int]:
    """:func:`consume` with RDY 1 until ``count`` bodies not in ``seen`` came (a durable broker
    delivers at least once after a crash): those in the order they came, and how many repeats
    came between them. Every message is finished; ``seen`` gets every new body."""
    client = await subscriber(broker, topic, channel, rdy=1, timeout=timeout)
    bodies: list[bytes] = []
    repeats = 0
    while len(bodies) < count:
        msg = await client.read_message()
        await client.send(encode_fin(msg.id))
        if msg.body in seen:
            repeats += 1
            continue
        seen.add(msg.body)
        bodies.append(msg.body)
    await client.aclose()
    return bodies, repeats


async def publish(broker, topic, *bodies, timeout: float = 5.0) -> None:
    """PUB each body to ``broker`` (see :func:`tcp_address`), one at a time, waiting for every OK."""
    client = await connect(tcp_address(broker), timeout=timeout)
    for body in bodies:
        await client.send(encode_pub(topic, body))
        await client.expect_response(b"OK")
    await client.aclose()


async def publish_batch(broker, topic, *bodies, per_mpub: int | None = None, timeout: float = 5.0) -> None:
    """MPUB all bodies to ``broker`` (see :func:`tcp_address`) at once, or ``per_mpub`` at a time,
    waiting for every OK."""
    client = await connect(tcp_address(broker), timeout=timeout)
    step = per_mpub or max(len(bodies), 1)
    for start in range(0, len(bodies), step):
        await client.send(encode_mpub(topic, list(bodies[start:start + step])))
        await client.expect_response(b"OK")
    await client.aclose()
