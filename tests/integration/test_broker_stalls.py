"""A stall of the broker's own making never counts against a client's heartbeat.

The broker runs on one thread: while it is held (here by ``time.sleep`` in a task, as a
long synchronous step would hold it), it reads no socket and sends no heartbeat. A
consumer that answers every heartbeat is not dropped for the silence that follows; a
client that truly sends nothing is still closed, as nsqd closes it.
"""

from __future__ import annotations

import logging
import time

from broker.protocol import FRAME_TYPE_ERROR, encode_fin, encode_identify, encode_nop, encode_pub
from tests.support.v2client import connect, publish, subscriber

#: Longer than two heartbeat intervals of a second: nsqd's read deadline passes inside it.
STALL = 2.5


def stall_the_broker() -> None:
    """Hold the event loop (the broker's one thread) for :data:`STALL` seconds: the stall under
    test, not a wait for a condition."""
    time.sleep(STALL)


async def test_a_consumer_answering_heartbeats_outlives_a_stall_of_the_broker(daemon, caplog):
    await publish(daemon, "t", b"before")
    consumer = await subscriber(daemon, "t", "c", rdy=1, heartbeat_interval=1000)
    msg = await consumer.read_message()
    await consumer.send(encode_fin(msg.id))
    frame = await consumer.read_frame(skip_heartbeats=False)
    assert frame.data == b"_heartbeat_"
    await consumer.send(encode_nop())
    await consumer.expect_quiet()  # the broker has read everything the consumer sent
    with caplog.at_level(logging.INFO, logger="pynsqd"):
        stall_the_broker()
        # the heartbeat due in the stall comes after it; the consumer answers, and goes on
        for _ in range(2):
            frame = await consumer.read_frame(skip_heartbeats=False)
            assert frame.data == b"_heartbeat_"
            await consumer.send(encode_nop())
        await publish(daemon, "t", b"after")
        msg = await consumer.read_message()
        assert msg.body == b"after"
        await consumer.send(encode_fin(msg.id))
        await consumer.expect_quiet()
    assert "no command for" not in caplog.text


async def test_a_silent_client_is_still_closed_after_a_stall_with_nsqds_error(daemon, caplog):
    client = await connect(daemon.addresses.tcp)
    # a PUB cut off in its body, read with the IDENTIFY before it is answered; then silence
    await client.send(encode_identify({"heartbeat_interval": 1000}) + encode_pub("t", b"hello")[:-2])
    await client.expect_response(b"OK")
    with caplog.at_level(logging.INFO, logger="pynsqd"):
        stall_the_broker()
        resumed = time.monotonic()
        frame = await client.read_frame()  # heartbeats, unanswered, then nsqd's error
        assert (frame.frame_type, frame.data) == (FRAME_TYPE_ERROR, b"E_BAD_MESSAGE PUB failed to read message body")
        await client.expect_closed()
    # two intervals of silence count at most from when the broker could read again
    assert time.monotonic() - resumed < 2 + 1.5
    assert "no command for 2s; closing" in caplog.text
