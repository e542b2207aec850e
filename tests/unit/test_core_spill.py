"""Ready messages past --mem-queue-size spill to disk in order; a full disk loses nothing, or fails the publish."""

from __future__ import annotations

import pytest
import trio

from broker.protocol import ProtocolError
from diskqueue import DiskQueueError
from tests.support.fakes import FULL


async def test_channel_spills_past_the_memory_limit_and_delivers_in_order(make_host, subscriber, messages):
    host = make_host("--mem-queue-size=2")
    channel = host.channel()
    channel.put_many(messages(*[b"%d" % i for i in range(5)]))
    assert (channel.depth, channel.backend_depth) == (5, 3)
    assert host.queues.opened["t:c"].depth == 3
    assert [m.body for m in channel.peek_ready(10)] == [b"%d" % i for i in range(5)]
    consumer = subscriber(rdy=10)
    channel.add_client(consumer)
    channel.dispatch()
    assert consumer.bodies() == [b"%d" % i for i in range(5)]
    assert (channel.depth, channel.backend_depth) == (0, 0)


async def test_spilling_is_sticky_until_the_disk_is_read(make_host, subscriber, messages):
    channel = make_host("--mem-queue-size=2").channel()
    channel.put_many(messages(b"a", b"b", b"c"))
    assert channel.backend_depth == 1
    consumer = subscriber(rdy=2)
    channel.add_client(consumer)
    channel.dispatch()  # a, b in flight: memory is empty, c waits on disk
    channel.put_many(messages(b"d"))  # memory has room, but d goes behind c
    assert (channel.depth, channel.backend_depth) == (2, 2)
    consumer.rdy = 10
    channel.dispatch()
    assert consumer.bodies() == [b"a", b"b", b"c", b"d"]


async def test_failed_spill_keeps_the_channels_messages_in_memory(make_host, subscriber, messages):
    host = make_host("--mem-queue-size=2")
    channel = host.channel()
    host.queues.opened["t:c"].full = True
    channel.put_many(messages(*[b"%d" % i for i in range(5)]))
    assert host.disk_errors == [FULL]
    assert (channel.depth, channel.backend_depth) == (5, 0)
    consumer = subscriber(rdy=10)
    channel.add_client(consumer)
    channel.dispatch()
    assert consumer.bodies() == [b"%d" % i for i in range(5)]


async def test_failed_spill_fails_the_topics_publish_and_keeps_nothing(make_host, messages):
    host = make_host("--mem-queue-size=2")
    topic = host.topic()
    topic.put_many(messages(b"a"))
    host.queues.opened["t"].full = True
    with pytest.raises(DiskQueueError, match="No space left"):
        topic.put_many(messages(b"b", b"c", b"d"))
    assert (topic.depth, topic.message_count) == (1, 1)
    host.queues.opened["t"].full = False
    topic.put_many(messages(b"b", b"c", b"d"))
    assert (topic.depth, topic.backend_depth) == (4, 2)


async def test_ephemeral_topic_drops_past_the_memory_limit(make_host, messages):
    host = make_host("--mem-queue-size=3")
    topic = host.topic("e#ephemeral")
    topic.put_many(messages(*[b"%d" % i for i in range(5)]))
    assert (topic.depth, topic.message_count) == (3, 5)
    assert host.queues.opened == {}


async def test_shutdown_writes_memory_in_flight_and_deferred_messages_for_the_next_start(
        make_host, subscriber, messages):
    host = make_host()
    channel = host.channel()
    consumer = subscriber(rdy=1)
    channel.add_client(consumer)
    channel.put_many(messages(b"in-flight", b"ready"))
    channel.put_many(messages(b"deferred"))
    channel.requeue(consumer, consumer.received[0].id, 0)
    channel.dispatch()  # "ready" in flight now, "in-flight" and "deferred" ready
    channel.requeue(consumer, consumer.received[1].id, 60_000)
    await channel.close_queues()
    assert len(host.queues.stashes["t:c#deferred"]) == 1

    again = host.channel()
    assert (again.depth, len(again.deferred)) == (2, 1)
    assert [m.body for m in again.peek_ready(5)] == [b"deferred", b"in-flight"]
    assert [m.body for m in again.peek_deferred(5)] == [b"ready"]
    assert "t:c#deferred" not in host.queues.stashes


async def test_durable_req_fails_when_the_disk_is_full_and_keeps_the_message_in_flight(
        make_host, subscriber, messages):
    host = make_host("--durable")
    channel = host.channel()
    consumer = subscriber(rdy=1)
    channel.add_client(consumer)
    channel.put_many(messages(b"a"))
    msg_id = consumer.received[0].id
    host.queues.opened["t:c"].full = True
    with pytest.raises(ProtocolError) as failed:
        channel.requeue(consumer, msg_id, 0)
    assert failed.value.payload == b"E_REQ_FAILED REQ " + msg_id + b" failed disk write failed"
    assert host.disk_errors == [FULL]
    assert msg_id in channel.in_flight and consumer.in_flight_count == 1
    host.queues.opened["t:c"].full = False
    channel.requeue(consumer, msg_id, 0)
    channel.dispatch()
    assert consumer.deliveries == [(b"a", 1), (b"a", 2)]


async def test_durable_timeout_on_a_full_disk_is_retried(make_host, subscriber, messages, autojump_clock):
    host = make_host("--durable")
    channel = host.channel()
    consumer = subscriber(rdy=1, msg_timeout=10.0)
    channel.add_client(consumer)
    channel.put_many(messages(b"a"))
    host.queues.opened["t:c"].full = True
    await trio.sleep(11)
    channel.process_timers()
    assert host.disk_errors == [FULL]
    assert len(channel.in_flight) == 1 and consumer.in_flight_count == 0  # held, owned by nobody
    host.queues.opened["t:c"].full = False
    await trio.sleep(1.1)
    channel.process_timers()
    assert consumer.deliveries == [(b"a", 1), (b"a", 2)]


async def test_unreadable_records_on_disk_are_skipped(make_host, subscriber, messages):
    host = make_host("--mem-queue-size=0")
    channel = host.channel()
    channel.put_many(messages(b"a"))
    host.queues.opened["t:c"].put_many([b"\xff\x09" + b"x" * 40])  # a record of an unknown version
    channel.put_many(messages(b"b"))
    consumer = subscriber()
    channel.add_client(consumer)
    channel.dispatch()
    assert consumer.bodies() == [b"a", b"b"]
    assert channel.depth == 0
