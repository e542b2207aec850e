"""The blocking client against a broker in process: IDENTIFY, errors, heartbeats and a clean stop."""

from __future__ import annotations

import pytest
import trio

from broker.client import Address, NsqError, connect, stop_delivery
from broker.protocol import FRAME_TYPE_MESSAGE, decode_message, encode_rdy, encode_sub
from tests.support.v2client import publish_batch


def _connect(daemon, identify=None):
    return connect(Address(*daemon.addresses.tcp), identify or {}, user_agent="test-client/1")


async def _in_thread(fn, *args):
    with trio.fail_after(30):
        return await trio.to_thread.run_sync(fn, *args)


async def test_identify_negotiates_features(daemon):
    pump = await _in_thread(_connect, daemon, {"msg_timeout": 5000})
    try:
        assert pump.identity["msg_timeout"] == 5000
        assert pump.identity["max_rdy_count"] > 0
    finally:
        pump.close()


async def test_a_refused_command_raises_its_code(daemon):
    pump = await _in_thread(_connect, daemon)
    try:
        pump.send(b"SUB bad! c\n")  # the encoder refuses the name; the broker must too
        with pytest.raises(NsqError) as caught:
            await _in_thread(pump.read_response)
        assert caught.value.code == "E_BAD_TOPIC" and caught.value.from_server
    finally:
        pump.close()


async def test_heartbeats_are_answered_so_an_idle_subscriber_stays(daemon):
    pump = await _in_thread(_connect, daemon, {"heartbeat_interval": 1000})
    try:
        pump.send(encode_sub("t", "c"))
        assert await _in_thread(pump.read_response) == b"OK"
        # nsqd drops a client that misses two heartbeats: this read spans three
        assert await _in_thread(pump.read, 3.2) == []
        await publish_batch(daemon, "t", b"still here")
        pump.send(encode_rdy(1))
        ((frame_type, payload),) = await _in_thread(pump.read, 10)
        assert frame_type == FRAME_TYPE_MESSAGE and decode_message(payload).body == b"still here"
    finally:
        pump.close()


async def test_a_clean_stop_gives_back_what_the_consumer_held(daemon):
    await publish_batch(daemon, "t", b"a", b"b", b"c")
    pump = await _in_thread(_connect, daemon)
    try:
        pump.send(encode_sub("t", "c"))
        assert await _in_thread(pump.read_response) == b"OK"
        pump.send(encode_rdy(2))
        held = []
        while len(held) < 2:
            held += [decode_message(p).id for t, p in await _in_thread(pump.read, 10) if t == FRAME_TYPE_MESSAGE]
        await _in_thread(lambda: stop_delivery(pump, lambda: held, timeout=10))
    finally:
        pump.close()
    channel = daemon.broker.topics["t"].channels["c"]
    assert (len(channel.in_flight), channel.depth) == (0, 3)


async def test_an_unreachable_address_is_a_connection_error():
    with pytest.raises(NsqError) as caught:
        await _in_thread(lambda: connect(Address("127.0.0.1", 1), {}, user_agent="t"))
    assert caught.value.code == "E_CONNECTION"


def test_identify_asking_for_tls_is_refused_before_connecting():
    with pytest.raises(ValueError, match="tls_v1"):
        connect(Address("127.0.0.1", 1), {"tls_v1": True}, user_agent="t")
