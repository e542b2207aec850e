"""The plain fan-out (``broker/core/fanout.py``): one message object for every channel, a copy
only for a channel that delivers it, and a spill encoded once for every channel's queue."""

from __future__ import annotations

import trio
import trio.testing

from broker.core.fanout import Fanout
from diskqueue.format import segment_filename

CHANNELS = ("one", "two", "three")


async def _start(nursery, topic):
    await nursery.start(topic.run)
    return [topic.get_channel(name) for name in CHANNELS]


async def test_every_channel_holds_the_same_message_until_it_delivers_its_own(make_host, subscriber, messages):
    topic = make_host().topic()
    assert type(topic.fanout) is Fanout and topic.wait_stored is None
    async with trio.open_nursery() as nursery:
        channels = await _start(nursery, topic)
        published = messages(b"a", b"b")
        topic.put_many(published)
        await trio.testing.wait_all_tasks_blocked()
        # a fan-out is a reference per channel, not an object per channel
        for channel in channels:
            assert [id(m) for m in channel.memory] == [id(m) for m in published]

        consumers = [subscriber() for _ in channels]
        for channel, consumer in zip(channels, consumers):
            channel.add_client(consumer)
            channel.dispatch()
        got = [m for consumer in consumers for m in consumer.received]
        assert len({id(m) for m in got} | {id(m) for m in published}) == 8  # each delivery its own object
        assert [c.deliveries for c in consumers] == [[(b"a", 1), (b"b", 1)]] * 3

        # what one channel does to its delivery is its own: REQ, then FIN
        one, two, three = consumers
        channels[0].requeue(one, one.received[0].id, 0)
        channels[0].dispatch()
        assert one.deliveries[-1] == (b"a", 2)
        assert channels[1].finish_many(two, [m.id for m in two.received]) == []
        assert [m.attempts for m in published] == [0, 0]
        assert [(m.body, m.attempts) for m in three.received] == [(b"a", 1), (b"b", 1)]
        assert [len(c.in_flight) for c in channels] == [2, 0, 2]
        topic.close()


async def test_a_channel_whose_memory_is_full_spills_the_batch_every_other_channel_spills(
        make_host, subscriber, messages, tmp_path):
    host = make_host("--mem-queue-size=1")
    topic = host.topic()
    bodies = [b"m%03d" % i for i in range(50)]
    async with trio.open_nursery() as nursery:
        channels = await _start(nursery, topic)
        topic.put_many(messages(*bodies))
        await trio.testing.wait_all_tasks_blocked()
        assert [(len(c.memory), c.backend_depth) for c in channels] == [(1, 49)] * 3
        files = [(tmp_path / segment_filename(f"t:{name}", 0)).read_bytes() for name in CHANNELS]
        assert files[0] == files[1] == files[2]
        assert all(body in files[0] for body in bodies[1:]) and bodies[0] not in files[0]

        # each channel delivers all of it, memory then disk, as its own messages
        consumers = [subscriber() for _ in channels]
        for channel, consumer in zip(channels, consumers):
            channel.add_client(consumer)
            channel.dispatch()
            assert consumer.bodies() == bodies
        assert len({id(m) for c in consumers for m in c.received}) == 150
        topic.close()


async def test_deferred_messages_are_each_channels_own(make_host, subscriber, messages, autojump_clock):
    from broker.core.message import now_ns

    topic = make_host().topic()
    async with trio.open_nursery() as nursery:
        channels = await _start(nursery, topic)
        topic.put_many(messages(b"later", due_ns=now_ns() + 2_000_000_000))
        await trio.testing.wait_all_tasks_blocked()
        held = [c.deferred.values()[0] for c in channels]
        assert len({id(m) for m in held}) == 3 and not any(m.shared for m in held)
        await trio.sleep(2.1)
        consumers = [subscriber() for _ in channels]
        for channel, consumer in zip(channels, consumers):
            channel.add_client(consumer)
            channel.process_timers()
        assert [c.deliveries for c in consumers] == [[(b"later", 1)]] * 3
        topic.close()


async def test_a_channel_whose_disk_refuses_the_shared_spill_keeps_it_and_the_others_do_not_wait(
        make_host, subscriber, messages, autojump_clock):
    host = make_host("--mem-queue-size=2")
    topic = host.topic()
    first, second = [b"a%02d" % i for i in range(10)], [b"b%02d" % i for i in range(10)]
    async with trio.open_nursery() as nursery:
        channels = await _start(nursery, topic)
        host.queues.opened["t:two"].full = True
        topic.put_many(messages(*first))
        await trio.testing.wait_all_tasks_blocked()
        # "two" holds its copies in memory past the limit and reports the disk; the others spilled
        assert [(len(c.memory), c.backend_depth) for c in channels] == [(2, 8), (10, 0), (2, 8)]
        assert host.disk_errors and channels[1].ready.over_limit
        # while "two" cannot spill, the topic keeps what comes next (memory stays bounded)
        topic.put_many(messages(*second))
        await trio.testing.wait_all_tasks_blocked()
        assert topic.depth == 10
        host.queues.opened["t:two"].full = False
        await trio.sleep(1.1)  # the pump's retry delay, on the mock clock
        await trio.testing.wait_all_tasks_blocked()
        assert topic.depth == 0
        consumers = [subscriber() for _ in channels]
        for channel, consumer in zip(channels, consumers):
            channel.add_client(consumer)
            channel.dispatch()
        assert [c.bodies() for c in consumers] == [first + second] * 3
        topic.close()
