"""Many consumers of one channel share its messages in turn.

Sixty-four consumers: every message reaches exactly one of them, in equal shares, in
well-formed frames, while they FIN as they go (the batches a topic's pump hands the channel
are sent by the server's flusher, see ``broker/server/flush.py``; consumers with a wide RDY
window take them in runs of ``MAX_RUN``, in turn, see ``Channel.dispatch``). Twenty with RDY 1
take batches smaller than their number one message each, in turn."""

from __future__ import annotations

import collections
import struct
import time

import trio

from broker.core.delivery import MAX_RUN
from broker.protocol import FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE, encode_fin
from tests.support.v2client import V2Client, publish_batch, subscriber
from tests.support.waiting import wait_for

CONSUMERS = 64
BATCH = 4 * MAX_RUN  # each MPUB goes to the next 4 consumers in turn, a run of 64 each
BATCHES = 2 * CONSUMERS // 4  # every consumer's turn comes twice
TOTAL = BATCH * BATCHES
_HEADER = struct.Struct(">iiqH")  # frame size, frame type, timestamp, attempts; then id and body


async def _read_raw_frames(client: V2Client, received: list[tuple[bytes, bytes]], done: trio.Event,
                           counted: list[int], started_ns: int) -> None:
    """Read message frames off the wire, checking each byte of them, and FIN every read's
    messages in one send, until ``done``."""
    buffer = b""
    while True:
        with trio.move_on_after(0.05):  # look at ``done`` again now and then
            data = await client.stream.receive_some(65536)
            assert data, "the broker closed a consumer"
            buffer += data
        fins = []
        while len(buffer) >= 8:
            size, frame_type = struct.unpack_from(">ii", buffer)
            if len(buffer) < 4 + size:
                break
            frame, buffer = buffer[:4 + size], buffer[4 + size:]
            if frame_type == FRAME_TYPE_RESPONSE and frame[8:] == b"_heartbeat_":
                continue
            assert frame_type == FRAME_TYPE_MESSAGE, frame
            _, _, timestamp, attempts = _HEADER.unpack_from(frame)
            msg_id, body = frame[18:34], frame[34:]
            assert started_ns <= timestamp <= time.time_ns()
            assert attempts == 1
            assert frame == _HEADER.pack(4 + 26 + len(body), FRAME_TYPE_MESSAGE, timestamp, 1) + msg_id + body
            received.append((msg_id, body))
            fins.append(encode_fin(msg_id))
        if fins:
            counted[0] += len(fins)
            await client.send(b"".join(fins))
        if done.is_set() and not buffer:
            return


async def test_sixty_four_consumers_share_a_channel_equally_and_get_every_message_once(daemon):
    started_ns = time.time_ns()
    consumers = [await subscriber(daemon, rdy=1000) for _ in range(CONSUMERS)]
    channel = daemon.broker.topics["t"].channels["c"]
    await wait_for(lambda: len(channel.clients) == CONSUMERS and all(c.rdy == 1000 for c in channel.clients))
    bodies = [b"m%05d" % i for i in range(TOTAL)]
    received: list[list[tuple[bytes, bytes]]] = [[] for _ in consumers]
    counted = [0]
    done = trio.Event()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for consumer, got in zip(consumers, received, strict=True):
                nursery.start_soon(_read_raw_frames, consumer, got, done, counted, started_ns)
            await publish_batch(daemon, "t", *bodies, per_mpub=BATCH)
            await wait_for(lambda: counted[0] >= TOTAL and not channel.in_flight, timeout=25)
            done.set()
    delivered = collections.Counter(body for got in received for _, body in got)
    assert delivered == collections.Counter(bodies)  # every message, exactly once
    assert len({msg_id for got in received for msg_id, _ in got}) == TOTAL
    assert [len(got) for got in received] == [TOTAL // CONSUMERS] * CONSUMERS
    assert channel.message_count == TOTAL and channel.depth == 0
    for got in received:  # each consumer's share in the order it was published
        assert [body for _, body in got] == sorted(body for _, body in got)
    for consumer in consumers:
        await consumer.aclose()


async def test_batches_smaller_than_the_consumers_go_to_each_in_turn(daemon):
    consumers, batch, batches = 20, 10, 10
    clients = [await subscriber(daemon, rdy=1) for _ in range(consumers)]
    channel = daemon.broker.topics["t"].channels["c"]
    await wait_for(lambda: len(channel.clients) == consumers and all(c.rdy == 1 for c in channel.clients))
    counts = [0] * consumers
    with trio.fail_after(30):
        for _ in range(batches):
            await publish_batch(daemon, "t", *[b"m"] * batch)
            await wait_for(lambda: len(channel.in_flight) == batch)
            for i, client in enumerate(clients):
                for msg in await client.sync():
                    counts[i] += 1
                    await client.send(encode_fin(msg.id))
            await wait_for(lambda: not channel.in_flight)
    assert counts == [batch * batches // consumers] * consumers
