"""The plain fan-out (``broker/core/fanout/plain.py``): one message object for every channel, a copy
only for a channel that delivers it, a spill encoded once for every channel's queue, and, while
none of the channels has a subscriber, one copy held in the topic's queue for all of them."""

from __future__ import annotations

import trio
import trio.testing

from broker.core.fanout import Fanout
from diskqueue.format import segment_filename

CHANNELS = ("one", "two", "three")


async def _start(nursery, topic, *, idle_reader=True):
    """Start ``topic`` with the channels ``CHANNELS``; ``idle_reader``: the first has a subscriber
    that takes nothing (RDY 0), so that the topic hands every message over at once."""
    await nursery.start(topic.run)
    channels = [topic.get_channel(name) for name in CHANNELS]
    if idle_reader:
        from tests.support.fakes import FakeSubscriber

        channels[0].add_client(FakeSubscriber(rdy=0))
    return channels


def _depths(channels):
    return [(c.depth, c.backend_depth, c.message_count) for c in channels]


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
        assert topic.ready.depth == 10 and [c.depth for c in channels] == [20] * 3
        host.queues.opened["t:two"].full = False
        await trio.sleep(1.1)  # the pump's retry delay, on the mock clock
        await trio.testing.wait_all_tasks_blocked()
        assert topic.ready.depth == 0 and [c.depth for c in channels] == [20] * 3
        consumers = [subscriber() for _ in channels]
        for channel, consumer in zip(channels, consumers):
            channel.add_client(consumer)
            channel.dispatch()
        assert [c.bodies() for c in consumers] == [first + second] * 3
        topic.close()


async def test_channels_nobody_reads_share_one_copy_in_the_topics_queue(make_host, subscriber, messages, tmp_path):
    host = make_host("--mem-queue-size=5")
    topic = host.topic()
    bodies = [b"m%03d" % i for i in range(50)]
    async with trio.open_nursery() as nursery:
        channels = await _start(nursery, topic, idle_reader=False)
        topic.put_many(messages(*bodies[:20]))
        topic.put_many(messages(*bodies[20:]))
        await trio.testing.wait_all_tasks_blocked()
        assert topic.fanout.holding() and topic.fanout.held == 50
        # written once, to the topic's queue; every channel counts them as its own
        assert [len(c.memory) for c in channels] == [0, 0, 0]
        assert not any((tmp_path / segment_filename(f"t:{name}", 0)).exists() for name in CHANNELS)
        assert topic.ready.backend_depth == 45
        assert (topic.depth, topic.backend_depth) == (0, 0)
        assert _depths(channels) == [(50, 45, 50)] * 3
        assert [m.body for m in channels[2].peek_ready(7)] == bodies[:7]

        # one subscriber anywhere: everything is handed over, each channel gets all of it once
        consumers = [subscriber(rdy=1000) for _ in channels]
        channels[1].add_client(consumers[1])
        await trio.testing.wait_all_tasks_blocked()
        assert topic.fanout.held == 0 and topic.ready.depth == 0
        assert consumers[1].bodies() == bodies
        assert _depths(channels) == [(50, 45, 50), (0, 0, 50), (50, 45, 50)]
        for channel, consumer in zip(channels, consumers):
            if not consumer.received:
                channel.add_client(consumer)
                channel.dispatch()
        assert [c.bodies() for c in consumers] == [bodies] * 3
        topic.close()


async def test_a_channel_created_or_emptied_while_the_topic_holds_skips_what_it_holds(
        make_host, subscriber, messages):
    topic = make_host("--mem-queue-size=3").topic()
    async with trio.open_nursery() as nursery:
        one, two, three = await _start(nursery, topic, idle_reader=False)
        topic.put_many(messages(b"a", b"b", b"c", b"d"))
        await trio.testing.wait_all_tasks_blocked()
        late = topic.get_channel("late")
        two.empty()
        topic.put_many(messages(b"e", b"f"))
        await trio.testing.wait_all_tasks_blocked()
        assert [c.depth for c in (one, two, three, late)] == [6, 2, 6, 2]
        assert [m.body for m in late.peek_ready(5)] == [b"e", b"f"]
        consumers = {c.name: subscriber() for c in (one, two, three, late)}
        for channel in (one, two, three, late):
            channel.add_client(consumers[channel.name])
            channel.dispatch()
        await trio.testing.wait_all_tasks_blocked()
        assert {name: c.bodies() for name, c in consumers.items()} == {
            "one": [b"a", b"b", b"c", b"d", b"e", b"f"], "two": [b"e", b"f"],
            "three": [b"a", b"b", b"c", b"d", b"e", b"f"], "late": [b"e", b"f"]}
        topic.close()


async def test_what_the_topic_holds_belongs_to_the_channels_when_paused_emptied_or_deleted(
        make_host, subscriber, messages):
    topic = make_host("--mem-queue-size=2").topic()
    async with trio.open_nursery() as nursery:
        one, two, three = await _start(nursery, topic, idle_reader=False)
        topic.put_many(messages(b"a", b"b", b"c"))
        await trio.testing.wait_all_tasks_blocked()
        # paused: what the channels own stays theirs; what comes now is the topic's
        topic.pause()
        topic.put_many(messages(b"p"))
        topic.empty()  # /topic/empty drops the topic's own only
        topic.put_many(messages(b"q"))
        paused_late = topic.get_channel("paused_late")
        assert (topic.depth, [c.depth for c in (one, two, three, paused_late)]) == (1, [3, 3, 3, 0])
        reader = subscriber()
        one.add_client(reader)  # a subscriber while paused gets what its channel owns
        await trio.testing.wait_all_tasks_blocked()
        assert reader.bodies() == [b"a", b"b", b"c"] and topic.depth == 1
        topic.unpause()
        await trio.testing.wait_all_tasks_blocked()
        assert reader.bodies() == [b"a", b"b", b"c", b"q"]
        assert [c.depth for c in (two, three, paused_late)] == [4, 4, 1]

        # without subscribers again, the topic holds; deleting every channel drops what they owned
        one.remove_client(reader)
        topic.put_many(messages(b"r", b"s"))
        await trio.testing.wait_all_tasks_blocked()
        assert topic.fanout.held == 2
        for name in ("one", "two", "three", "paused_late"):
            topic.delete_channel(name)
        assert topic.depth == 0 and topic.ready.depth == 0
        topic.put_many(messages(b"t"))
        first = topic.get_channel("first")  # a topic with no channel keeps messages for the first
        consumer = subscriber()
        first.add_client(consumer)
        await trio.testing.wait_all_tasks_blocked()
        assert consumer.bodies() == [b"t"]
        topic.close()


async def test_a_deferred_publish_waits_in_every_channel_while_the_topic_holds(
        make_host, subscriber, messages, autojump_clock):
    from broker.core.message import now_ns

    topic = make_host().topic()
    async with trio.open_nursery() as nursery:
        channels = await _start(nursery, topic, idle_reader=False)
        topic.put_many(messages(b"now"))
        topic.put_many(messages(b"later", due_ns=now_ns() + 2_000_000_000))
        await trio.testing.wait_all_tasks_blocked()
        assert [(c.depth, len(c.deferred)) for c in channels] == [(1, 1)] * 3
        await trio.sleep(2.1)
        consumers = [subscriber() for _ in channels]
        for channel, consumer in zip(channels, consumers):
            channel.add_client(consumer)
        await trio.testing.wait_all_tasks_blocked()
        for channel in channels:
            channel.process_timers()
        assert [c.bodies() for c in consumers] == [[b"now", b"later"]] * 3
        topic.close()


async def test_a_held_record_found_damaged_on_disk_is_skipped_and_the_counts_stay_true(
        make_host, subscriber, messages, tmp_path):
    topic = make_host("--mem-queue-size=1").topic()
    bodies = [b"body-%02d" % i for i in range(10)]
    async with trio.open_nursery() as nursery:
        channels = await _start(nursery, topic, idle_reader=False)
        topic.put_many(messages(*bodies))
        await trio.testing.wait_all_tasks_blocked()
        assert topic.fanout.held == 10 and topic.ready.backend_depth == 9
        segment = tmp_path / segment_filename("t", 0)
        data = bytearray(segment.read_bytes())
        at = data.index(b"body-05")
        data[at] ^= 0xFF  # one record's checksum no longer matches
        segment.write_bytes(bytes(data))
        consumer = subscriber()
        channels[0].add_client(consumer)
        await trio.testing.wait_all_tasks_blocked()
        assert consumer.bodies() == [b for b in bodies if b != b"body-05"]
        assert (topic.depth, topic.backend_depth, topic.fanout.held) == (0, 0, 0)
        assert [c.depth for c in channels] == [0, 9, 9]
        topic.close()
