"""Integration tests: the V2 TCP server on 127.0.0.1:0, observed through the wire."""

from __future__ import annotations

import json
import logging
import re
import struct

import pytest
import trio

from broker import protocol
from broker.protocol import (
    encode_cls,
    encode_dpub,
    encode_fin,
    encode_mpub,
    encode_nop,
    encode_pub,
    encode_rdy,
    encode_req,
    encode_sub,
    encode_touch,
)
from broker.server.handlers import ANSWER_HANDLERS
from broker.server.tcp import TCPServer
from tests.support.v2client import connect, publish, subscriber
from tests.support.waiting import wait_for

HEX16 = re.compile(rb"^[0-9a-f]{16}$")


def tcp(daemon):
    return daemon.addresses.tcp


async def test_pub_then_sub_delivers_with_attempts_one(daemon):
    await publish(daemon, "t", b"hello")
    consumer = await subscriber(daemon, rdy=1)
    msg = await consumer.read_message()
    assert msg.body == b"hello"
    assert msg.attempts == 1
    assert HEX16.match(msg.id)
    await consumer.send(encode_fin(msg.id))
    await consumer.expect_quiet()
    channel = daemon.broker.topics["t"].channels["c"]
    assert (len(channel.in_flight), channel.depth) == (0, 0)


async def test_mpub_delivers_in_order_and_ids_are_unique(daemon):
    producer = await connect(tcp(daemon))
    bodies = [b"m%03d" % i for i in range(200)]
    await producer.send(encode_mpub("t", bodies))
    await producer.expect_response(b"OK")
    consumer = await subscriber(daemon, rdy=200)
    msgs = await consumer.read_messages(200)
    assert [m.body for m in msgs] == bodies
    assert len({m.id for m in msgs}) == 200
    assert [m.id for m in msgs] == sorted(m.id for m in msgs)


async def test_every_channel_gets_a_copy_and_consumers_share_a_channel(daemon):
    a1 = await subscriber(daemon, channel="a", rdy=10)
    a2 = await subscriber(daemon, channel="a", rdy=10)
    b = await subscriber(daemon, channel="b", rdy=20)
    await publish(daemon, "t", *[b"%d" % i for i in range(20)])
    got_b = await b.read_messages(20)
    assert sorted(int(m.body) for m in got_b) == list(range(20))
    got_a = await a1.read_messages(10) + await a2.read_messages(10)
    assert sorted(int(m.body) for m in got_a) == list(range(20))


async def test_rdy_is_a_window_on_in_flight(daemon):
    await publish(daemon, "t", *[b"%d" % i for i in range(5)])
    consumer = await subscriber(daemon, rdy=2)
    first = await consumer.read_messages(2)
    await consumer.expect_quiet()
    channel = daemon.broker.topics["t"].channels["c"]
    assert (len(channel.in_flight), channel.depth) == (2, 3)
    await consumer.send(encode_fin(first[0].id))
    third = await consumer.read_message()
    assert third.body == b"2"
    await consumer.send(encode_rdy(0) + encode_fin(first[1].id) + encode_fin(third.id))
    await consumer.expect_quiet()
    assert (len(channel.in_flight), channel.depth) == (0, 2)


async def test_fin_of_unknown_id_is_not_fatal(daemon):
    consumer = await subscriber(daemon, rdy=1)
    await consumer.send(encode_fin(b"0123456789abcdef"))
    await consumer.expect_error(b"E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight", closed=False)
    await consumer.send(encode_pub("t", b"still open"))
    await consumer.expect_response(b"OK")
    msg = await consumer.read_message()
    assert msg.body == b"still open"


async def test_fin_of_another_clients_message_fails(daemon):
    await publish(daemon, "t", b"x")
    owner = await subscriber(daemon, rdy=1)
    msg = await owner.read_message()
    other = await subscriber(daemon, rdy=0)
    await other.send(encode_fin(msg.id))
    await other.expect_error(b"E_FIN_FAILED FIN " + msg.id + b" failed client does not own message", closed=False)


async def test_req_redelivers_with_incremented_attempts(daemon):
    await publish(daemon, "t", b"again")
    consumer = await subscriber(daemon, rdy=1)
    first = await consumer.read_message()
    await consumer.send(encode_req(first.id, 0))
    second = await consumer.read_message()
    assert (second.id, second.body, second.attempts) == (first.id, b"again", 2)


async def test_req_with_delay_defers(daemon):
    await publish(daemon, "t", b"later")
    consumer = await subscriber(daemon, rdy=1)
    first = await consumer.read_message()
    start = trio.current_time()
    await consumer.send(encode_req(first.id, 300))
    second = await consumer.read_message()
    assert trio.current_time() - start >= 0.3
    assert second.attempts == 2


async def test_dpub_is_delivered_after_its_delay(daemon):
    producer = await connect(tcp(daemon))
    consumer = await subscriber(daemon, rdy=5)
    start = trio.current_time()
    await producer.send(encode_dpub("t", 300, b"deferred") + encode_pub("t", b"now"))
    await producer.expect_response(b"OK")
    await producer.expect_response(b"OK")
    first = await consumer.read_message()
    assert first.body == b"now"
    second = await consumer.read_message()
    assert second.body == b"deferred"
    assert trio.current_time() - start >= 0.3


async def test_timeout_redelivers(start_daemon):
    async with start_daemon("--msg-timeout=200ms") as d:
        await publish(d, "t", b"slow")
        consumer = await subscriber(d, rdy=1)
        first = await consumer.read_message()
        second = await consumer.read_message()
        assert second.id == first.id and second.attempts == 2
        await consumer.send(encode_fin(first.id))
        channel = d.broker.topics["t"].channels["c"]
        await wait_for(lambda: not channel.in_flight, timeout=2)
        assert channel.timeout_count == 1


async def test_touch_postpones_the_timeout(start_daemon):
    async with start_daemon("--msg-timeout=1s") as d:
        await publish(d, "t", b"x")
        consumer = await subscriber(d, rdy=1)
        msg = await consumer.read_message()
        # The behaviour is about the real clock: a TOUCH every fifth of the timeout (a margin
        # a busy machine does not eat), for longer than the timeout, keeps the message in flight.
        for _ in range(8):
            await trio.sleep(0.2)
            await consumer.send(encode_touch(msg.id))
        await consumer.send(encode_fin(msg.id))
        await consumer.expect_quiet()
        channel = d.broker.topics["t"].channels["c"]
        assert (len(channel.in_flight), channel.depth) == (0, 0)
        assert channel.timeout_count == 0


async def test_cls_answers_close_wait_and_stops_delivery(daemon):
    consumer = await subscriber(daemon, rdy=10)
    await consumer.send(encode_cls())
    await consumer.expect_response(b"CLOSE_WAIT")
    await publish(daemon, "t", b"x")
    channel = daemon.broker.topics["t"].channels["c"]
    await wait_for(lambda: channel.depth == 1)
    await consumer.expect_quiet()
    assert (len(channel.in_flight), channel.depth) == (0, 1)


async def test_identify_feature_negotiation(daemon):
    client = await connect(tcp(daemon))
    resp = await client.identify(feature_negotiation=True, msg_timeout=5000, short_id="x", long_id="y",
                                 heartbeat_interval=2000, output_buffer_size=-1, tls_v1=True)
    assert resp == {
        "max_rdy_count": 2500, "version": "1.3.0", "max_msg_timeout": 900000, "msg_timeout": 5000,
        "tls_v1": False, "deflate": False, "deflate_level": 6, "max_deflate_level": 6, "snappy": False,
        "sample_rate": 0, "auth_required": False, "output_buffer_size": 1, "output_buffer_timeout": 0,
    }


async def test_identify_without_negotiation_answers_ok(daemon):
    client = await connect(tcp(daemon))
    assert await client.identify(client_id="me") is None


@pytest.mark.parametrize("field,value,text", [
    ("heartbeat_interval", 300001, b"E_BAD_BODY IDENTIFY heartbeat interval (300001) is invalid"),
    ("heartbeat_interval", 999, b"E_BAD_BODY IDENTIFY heartbeat interval (999) is invalid"),
    ("output_buffer_size", 63, b"E_BAD_BODY IDENTIFY output buffer size (63) is invalid"),
    ("output_buffer_timeout", 24, b"E_BAD_BODY IDENTIFY output buffer timeout (24) is invalid"),
    ("sample_rate", 100, b"E_BAD_BODY IDENTIFY sample rate (100) is invalid"),
    ("msg_timeout", 999, b"E_BAD_BODY IDENTIFY msg timeout (999) is invalid"),
    ("msg_timeout", 900001, b"E_BAD_BODY IDENTIFY msg timeout (900001) is invalid"),
    ("heartbeat_interval", "fast", b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
])
async def test_identify_out_of_range_is_fatal(daemon, field, value, text):
    client = await connect(tcp(daemon))
    from broker.protocol import encode_identify
    await client.send(encode_identify({field: value}))
    await client.expect_error(text)


async def test_sub_with_heartbeats_disabled_is_refused(daemon):
    client = await connect(tcp(daemon))
    from broker.protocol import encode_identify
    await client.send(encode_identify({"heartbeat_interval": -1}) + encode_sub("t", "c"))
    await client.expect_response(b"OK")
    await client.expect_error(b"E_INVALID cannot SUB with heartbeats disabled")


async def test_heartbeats_are_sent_and_silent_clients_dropped(daemon):
    client = await connect(tcp(daemon))
    start = trio.current_time()
    await client.identify(heartbeat_interval=1000)
    frame = await client.read_frame(skip_heartbeats=False)
    assert frame.data == b"_heartbeat_"
    # the last command was IDENTIFY: two unanswered heartbeat intervals later the server hangs up
    await client.expect_closed()
    assert 1.9 <= trio.current_time() - start <= 3.5


async def test_nop_keeps_a_client_alive(daemon):
    client = await connect(tcp(daemon))
    await client.identify(heartbeat_interval=1000)
    for _ in range(4):
        frame = await client.read_frame(skip_heartbeats=False)
        assert frame.data == b"_heartbeat_"
        await client.send(encode_nop())
    await client.send(encode_pub("t", b"alive"))
    await client.expect_response(b"OK")


async def test_max_channel_consumers(start_daemon):
    async with start_daemon("--max-channel-consumers=1") as d:
        first = await subscriber(d)
        second = await connect(tcp(d))
        await second.send(encode_sub("t", "c"))
        await second.expect_error(b"E_SUB_FAILED SUB failed consumers for t:c exceeds limit of 1")
        await first.send(encode_nop())


async def test_ephemeral_channel_disappears_with_its_last_client(daemon):
    consumer = await subscriber(daemon, channel="eph#ephemeral")
    topic = daemon.broker.topics["t"]
    assert "eph#ephemeral" in topic.channels
    await consumer.aclose()
    await wait_for(lambda: "eph#ephemeral" not in topic.channels, timeout=2)


async def test_ephemeral_topic_drops_overflow(start_daemon):
    async with start_daemon("--mem-queue-size=3") as d:
        await publish(d, "e#ephemeral", *[b"%d" % i for i in range(5)])
        consumer = await subscriber(d, topic="e#ephemeral", channel="c", rdy=10)
        got = await consumer.read_messages(3)
        assert [m.body for m in got] == [b"0", b"1", b"2"]
        await consumer.expect_quiet()
        topic = d.broker.topics["e#ephemeral"]
        assert (topic.depth, topic.channels["c"].depth) == (0, 0)


async def test_topic_without_channels_keeps_messages_for_the_first_channel(daemon):
    await publish(daemon, "t", b"a", b"b")
    first = await subscriber(daemon, channel="first", rdy=5)
    assert [m.body for m in await first.read_messages(2)] == [b"a", b"b"]
    late = await subscriber(daemon, channel="late", rdy=5)
    await late.expect_quiet()
    assert daemon.broker.topics["t"].channels["late"].depth == 0


@pytest.mark.parametrize("mem_queue_size", ["0", "10"])
async def test_spill_to_disk_keeps_order(start_daemon, tmp_path, mem_queue_size):
    async with start_daemon(f"--mem-queue-size={mem_queue_size}") as d:
        producer = await connect(tcp(d))
        bodies = [b"%05d" % i for i in range(1000)]
        for i in range(0, 1000, 100):
            await producer.send(encode_mpub("t", bodies[i:i + 100]))
            await producer.expect_response(b"OK")
        assert d.broker.topics["t"].backend_depth > 0
        consumer = await subscriber(d, rdy=100)
        got = []
        while len(got) < 1000:
            msg = await consumer.read_message()
            got.append(msg.body)
            await consumer.send(encode_fin(msg.id))
        assert got == bodies
    assert list((tmp_path / "data").glob("t.diskqueue.*"))


async def test_paused_channel_holds_messages(daemon):
    consumer = await subscriber(daemon, rdy=5)
    channel = daemon.broker.topics["t"].channels["c"]
    channel.pause()
    await publish(daemon, "t", b"held")
    await wait_for(lambda: channel.depth == 1)
    await consumer.expect_quiet()
    assert (len(channel.in_flight), channel.depth) == (0, 1)
    channel.unpause()
    assert (await consumer.read_message()).body == b"held"


async def test_paused_topic_holds_messages(daemon):
    consumer = await subscriber(daemon, rdy=5)
    topic = daemon.broker.topics["t"]
    topic.pause()
    await publish(daemon, "t", b"held")
    await consumer.expect_quiet()
    assert topic.depth == 1
    topic.unpause()
    assert (await consumer.read_message()).body == b"held"


async def test_publisher_may_also_consume(daemon):
    client = await subscriber(daemon, rdy=1)
    await client.send(encode_pub("t", b"self"))
    await client.expect_response(b"OK")
    assert (await client.read_message()).body == b"self"


async def test_metadata_file_has_nsqd_shape(daemon, tmp_path):
    await subscriber(daemon, topic="t", channel="c")
    await subscriber(daemon, topic="t", channel="e#ephemeral")
    daemon.broker.topics["t"].channels["c"].pause()
    await daemon.broker.persist_metadata()
    doc = json.loads((tmp_path / "data" / "nsqd.dat").read_bytes())
    assert doc == {"topics": [{"channels": [{"name": "c", "paused": True}], "name": "t", "paused": False}],
                   "version": "1.3.0"}


async def test_graceful_restart_keeps_ready_in_flight_and_deferred(start_daemon, tmp_path):
    async with start_daemon() as d:
        consumer = await subscriber(d, rdy=1)
        await publish(d, "t", b"in-flight", b"ready-1", b"ready-2")
        held = await consumer.read_message()
        assert held.body == b"in-flight"
        producer = await connect(tcp(d))
        await producer.send(encode_dpub("t", 1500, b"deferred"))
        await producer.expect_response(b"OK")
        await wait_for(lambda: d.broker.topics["t"].channels["c"].deferred, timeout=2)
        await publish(d, "untouched", b"topic-queue")
    async with start_daemon() as d:
        start = trio.current_time()
        channel = d.broker.topics["t"].channels["c"]
        assert len(channel.deferred) == 1
        consumer = await subscriber(d, rdy=10)
        got = await consumer.read_messages(3)
        assert sorted(m.body for m in got) == [b"in-flight", b"ready-1", b"ready-2"]
        assert {m.body: m.attempts for m in got}[b"in-flight"] == 2
        await consumer.expect_quiet()
        assert len(channel.deferred) == 1
        late = await consumer.read_message()
        assert late.body == b"deferred"
        assert trio.current_time() - start < 3
        assert d.broker.topics["untouched"].depth == 1


async def test_failed_spill_on_req_keeps_the_message_and_the_client(start_daemon):
    from diskqueue import DiskQueueError

    async with start_daemon("--mem-queue-size=1") as d:
        consumer = await subscriber(d, rdy=1)
        await publish(d, "t", b"a", b"b")
        first = await consumer.read_message()
        assert first.body == b"a"
        channel = d.broker.topics["t"].channels["c"]

        real = channel.backend

        class FullDisk:
            def __getattr__(self, name):
                return getattr(real, name)

            def put_many(self, payloads):
                raise DiskQueueError("failed to write to diskqueue: No space left on device")

        channel.backend = FullDisk()
        await consumer.send(encode_req(first.id, 0))
        got = await consumer.read_message()
        await consumer.send(encode_fin(got.id))
        again = await consumer.read_message()
        assert sorted([got.body, again.body]) == [b"a", b"b"]
        assert d.broker.health_error == "failed to write to diskqueue: No space left on device"
        await consumer.send(encode_fin(again.id))
        await consumer.expect_quiet()
        assert (len(channel.in_flight), channel.depth) == (0, 0)
        channel.backend = real


async def test_internal_error_closes_only_that_client(daemon, monkeypatch):
    from broker.protocol import Nop
    from broker.server import handlers

    def broken(broker, client, cmd):
        raise RuntimeError("boom")

    bystander = await subscriber(daemon, rdy=1)
    victim = await connect(tcp(daemon))
    monkeypatch.setitem(handlers.SYNC_HANDLERS, Nop, broken)
    await victim.send(encode_nop())
    await victim.expect_closed()
    monkeypatch.undo()
    await publish(daemon, "t", b"still here")
    assert (await bystander.read_message()).body == b"still here"


async def test_output_larger_than_the_socket_takes_arrives_whole_and_in_order(daemon):
    # 200 x 64 KiB on one RDY: the socket takes a few, then the client's output
    # buffer stays full and it is given nothing more until it reads; the rest
    # must follow as the socket drains, intact and in order.
    bodies = [bytes([i % 251]) * 65536 for i in range(200)]
    producer = await connect(tcp(daemon))
    for i in range(0, 200, 20):
        await producer.send(encode_mpub("t", bodies[i:i + 20]))
        await producer.expect_response(b"OK")
    consumer = await subscriber(daemon, rdy=200)
    # Read nothing until the connection's send side is full.
    channel = daemon.broker.topics["t"].channels["c"]
    client = channel.clients[0]
    await wait_for(lambda: 0 < len(channel.in_flight) < 200 and not client.ready_for_more())
    got = await consumer.read_messages(200)
    assert [m.body for m in got] == bodies


async def test_a_run_of_fins_in_one_chunk_reports_each_bad_id_in_order(daemon):
    await publish(daemon, "t", b"a", b"b")
    consumer = await subscriber(daemon, rdy=2)
    a, b = await consumer.read_messages(2)
    await consumer.send(encode_fin(a.id) + encode_fin(b"0123456789abcdef") + encode_fin(b.id) + encode_fin(a.id))
    await consumer.expect_error(b"E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight", closed=False)
    await consumer.expect_error(b"E_FIN_FAILED FIN " + a.id + b" failed ID not in flight", closed=False)
    channel = daemon.broker.topics["t"].channels["c"]
    assert (len(channel.in_flight), channel.depth) == (0, 0)
    client = channel.clients[0]
    assert (client.finish_count, client.in_flight_count) == (2, 0)
    await consumer.expect_quiet()


async def test_commands_that_must_wait_are_answered_in_order_with_those_around_them(start_daemon):
    # --durable makes every publish wait for the disk and SUB for nsqd.dat: in one chunk,
    # the commands before, between and after them are applied and answered in order
    async with start_daemon("--durable") as d:
        client = await connect(tcp(d))
        await client.send(encode_pub("t", b"a") + encode_nop() + encode_mpub("t", [b"b", b"c"])
                          + encode_dpub("t", 0, b"d") + encode_sub("other", "c") + encode_rdy(5)
                          + encode_pub("t", b"e"))
        for _ in range(5):  # PUB, MPUB, DPUB, SUB, PUB (NOP and RDY answer nothing)
            await client.expect_response(b"OK")
        await publish(d, "other", b"for the subscriber")
        assert (await client.read_message()).body == b"for the subscriber"
        consumer = await subscriber(d, rdy=5)
        assert [m.body for m in await consumer.read_messages(5)] == [b"a", b"b", b"c", b"d", b"e"]


async def test_many_publishers_one_message_at_a_time_are_each_answered(daemon):
    # one request in flight per connection: what the poller's task applies by itself
    clients = [await connect(tcp(daemon)) for _ in range(8)]
    for round_number in range(50):
        for number, client in enumerate(clients):
            await client.send(encode_pub("t", b"%d-%d" % (number, round_number)))
        for client in clients:
            await client.expect_response(b"OK")
    consumer = await subscriber(daemon, rdy=400)
    bodies = [m.body for m in await consumer.read_messages(400)]
    assert sorted(bodies) == sorted(b"%d-%d" % (n, r) for n in range(8) for r in range(50))


#: What one connection sends to fail, and what it is answered before the close (None: no frame).
_FAILING_INPUTS = {
    # a command whose handling raises unexpectedly: a fault of ours, closed without a frame
    "fault": (encode_pub("boom", b"x"), None),
    "garbage": (b"\x00\xffHELLO there\n", b"E_INVALID invalid command \x00\xffHELLO"),
    "protocol error": (b"PUB a/b\n" + struct.pack(">I", 1) + b"x", b'E_BAD_TOPIC PUB topic name "a/b" is not valid'),
}


@pytest.mark.parametrize("failing_input", list(_FAILING_INPUTS))
async def test_a_failure_in_one_connections_input_is_that_connections_alone(daemon, monkeypatch, caplog,
                                                                           failing_input):
    # The failing input arrives while its connection waits on the read poller, so the
    # poller's task applies it; the failure is handled (logged, answered, closed) in the
    # connection's own task, the other connections are served on and the poller runs on.
    caplog.set_level(logging.INFO, logger="pynsqd.tcp")
    raised_in: list[str] = []  # the task in which a turn of commands raised
    failed_in: list[str] = []  # the task that ended a connection on it
    turn, fail, pub = TCPServer._turn, TCPServer._fail, ANSWER_HANDLERS[protocol.Pub]

    def recording_turn(self, client, conn, events):
        try:
            return turn(self, client, conn, events)
        except Exception:
            raised_in.append(trio.lowlevel.current_task().name)
            raise

    def recording_fail(self, client, exc):
        failed_in.append(trio.lowlevel.current_task().name)
        return fail(self, client, exc)

    def faulty_pub(broker, client, cmd):
        if cmd.topic == "boom":
            raise RuntimeError("a fault of ours")
        return pub(broker, client, cmd)

    monkeypatch.setattr(TCPServer, "_turn", recording_turn)
    monkeypatch.setattr(TCPServer, "_fail", recording_fail)
    monkeypatch.setitem(ANSWER_HANDLERS, protocol.Pub, faulty_pub)
    data, error = _FAILING_INPUTS[failing_input]

    others = [await connect(tcp(daemon)) for _ in range(4)]
    failing = await connect(tcp(daemon))
    for client in (*others, failing):  # each then waits on the poller, its input applied there
        await client.send(encode_pub("t", b"before"))
        await client.expect_response(b"OK")
    await trio.testing.wait_all_tasks_blocked()
    await failing.send(data)
    for client in others:
        await client.send(encode_pub("t", b"beside"))
    if error is not None:
        await failing.expect_error(error)
    else:
        await failing.expect_closed()
    for client in others:
        await client.expect_response(b"OK")

    assert raised_in == ["broker.server.poller.ReadPoller.run"]  # the poller's task applied it...
    assert failed_in == ["broker.server.net.ConnectionServer._run_connection"]  # ...the connection ended on it
    if error is None:  # logged with its traceback, from the connection's task
        assert "closed after an internal error" in caplog.text and "a fault of ours" in caplog.text
    # the poller runs on: the others, and a new connection, are served as before
    for client in others:
        await client.send(encode_pub("t", b"after"))
        await client.expect_response(b"OK")
    await publish(daemon, "t", b"new")
    assert daemon.broker.topics["t"].depth == 5 + 4 + 4 + 1
