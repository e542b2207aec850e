"""A Topic alone: its pump fans every message out to each channel, and an ephemeral topic ends with its channels."""

from __future__ import annotations

import trio
import trio.testing

from broker.core.message import now_ns


async def _running(nursery, topic):
    await nursery.start(topic.run)
    return topic


async def test_every_channel_gets_a_copy(make_host, subscriber, messages):
    host = make_host()
    topic = host.topic()
    async with trio.open_nursery() as nursery:
        await _running(nursery, topic)
        one, two = subscriber(), subscriber()
        topic.get_channel("one").add_client(one)
        topic.get_channel("two").add_client(two)
        topic.put_many(messages(b"a", b"b"))
        await trio.testing.wait_all_tasks_blocked()
        assert one.bodies() == two.bodies() == [b"a", b"b"]
        assert one.received[0] is not two.received[0]
        assert (topic.message_count, topic.message_bytes, topic.depth) == (2, 2, 0)
        assert host.metadata_changes == 2  # one per new channel
        topic.close()


async def test_topic_without_channels_keeps_messages_for_the_first(make_host, subscriber, messages):
    topic = make_host().topic()
    async with trio.open_nursery() as nursery:
        await _running(nursery, topic)
        topic.put_many(messages(b"a", b"b"))
        await trio.testing.wait_all_tasks_blocked()
        assert topic.depth == 2
        first = subscriber()
        topic.get_channel("first").add_client(first)
        await trio.testing.wait_all_tasks_blocked()
        late = subscriber()
        topic.get_channel("late").add_client(late)
        await trio.testing.wait_all_tasks_blocked()
        assert (first.bodies(), late.bodies()) == ([b"a", b"b"], [])
        topic.close()


async def test_paused_topic_holds_messages(make_host, subscriber, messages):
    topic = make_host().topic()
    async with trio.open_nursery() as nursery:
        await _running(nursery, topic)
        consumer = subscriber()
        topic.get_channel("c").add_client(consumer)
        topic.pause()
        topic.put_many(messages(b"held"))
        await trio.testing.wait_all_tasks_blocked()
        assert consumer.received == [] and topic.depth == 1
        topic.unpause()
        await trio.testing.wait_all_tasks_blocked()
        assert consumer.bodies() == [b"held"]
        topic.close()


async def test_deferred_publish_is_released_by_each_channel(make_host, subscriber, messages, autojump_clock):
    topic = make_host().topic()
    async with trio.open_nursery() as nursery:
        await _running(nursery, topic)
        consumer = subscriber()
        channel = topic.get_channel("c")
        channel.add_client(consumer)
        topic.put_many(messages(b"dpub", due_ns=now_ns() + 3_000_000_000))
        await trio.testing.wait_all_tasks_blocked()
        assert (consumer.received, len(channel.deferred)) == ([], 1)
        await trio.sleep(3.1)
        channel.process_timers()
        assert consumer.bodies() == [b"dpub"]
        topic.close()


async def test_ephemeral_topic_reports_empty_with_its_last_channel(make_host, subscriber):
    host = make_host()
    topic = host.topic("t#ephemeral")
    async with trio.open_nursery() as nursery:
        await _running(nursery, topic)
        consumer = subscriber()
        channel = topic.get_channel("c#ephemeral")
        channel.add_client(consumer)
        topic.get_channel("d")
        topic.delete_channel("d")
        assert host.emptied == []
        channel.remove_client(consumer)  # the ephemeral channel goes, and with it the topic
        assert "c#ephemeral" not in topic.channels
        assert host.emptied == ["t#ephemeral"]
        topic.close()
