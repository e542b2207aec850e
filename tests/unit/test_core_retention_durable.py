"""Durable retention (``broker/core/retention/durable.py``): every message of a channel stays
on disk until it is finished; a graceful restart delivers each live message once, a crash
re-delivers but never loses, a deferral survives both."""

from __future__ import annotations

from broker.core.message import Message, encode, now_ns


def _reopened(make_host, subscriber, rdy=10):
    """The channel of a new host on the same directory (a restart), with a consumer that took what it gives."""
    channel = make_host("--durable").channel()
    consumer = subscriber(rdy=rdy)
    channel.add_client(consumer)
    channel.dispatch()
    return channel, consumer


async def test_copied_records_are_kept_ready_or_deferred_across_a_restart(make_host, subscriber):
    channel = make_host("--durable").channel()
    later = now_ns() + 60 * 1_000_000_000
    records = [encode(Message(b"%016d" % 1, b"now", now_ns(), 0, 0)),
               encode(Message(b"%016d" % 2, b"later", now_ns(), 0, later))]
    assert channel.retention.put_records(records, 7) == 2
    assert [m.body for m in channel.peek_deferred(5)] == [b"later"]
    assert [q.name for q in channel.retention.queues()] == ["t:c", "t:c#buried", "t:c#deferred"]
    assert await channel.close_queues() == 0
    again, consumer = _reopened(make_host, subscriber)
    assert consumer.bodies() == [b"now"]
    assert [(m.body, m.due_ns) for m in again.peek_deferred(5)] == [(b"later", later)]


async def test_a_graceful_restart_delivers_each_unfinished_message_once(make_host, subscriber, messages):
    channel = make_host("--durable").channel()
    consumer = subscriber(rdy=2)
    channel.add_client(consumer)
    channel.put_many(messages(b"finished", b"in-flight", b"ready"))
    channel.finish_many(consumer, [consumer.received[0].id])
    assert await channel.close_queues() == 0
    _, again = _reopened(make_host, subscriber)
    assert sorted(again.bodies()) == [b"in-flight", b"ready"]


async def test_a_full_disk_at_shutdown_commits_nothing_and_loses_nothing(make_host, subscriber, messages):
    host = make_host("--durable")
    channel = host.channel()
    consumer = subscriber(rdy=1)
    channel.add_client(consumer)
    channel.put_many(messages(b"a", b"b"))
    host.queues.opened["t:c"].full = True
    assert await channel.close_queues() == 0
    _, again = _reopened(make_host, subscriber)
    assert sorted(again.bodies()) == [b"a", b"b"]


async def test_a_deferral_survives_a_crash_as_one_deferred_copy(make_host, subscriber, messages):
    channel = make_host("--durable").channel()
    consumer = subscriber(rdy=1)
    channel.add_client(consumer)
    channel.put_many(messages(b"later"))
    channel.requeue(consumer, consumer.received[0].id, 60_000)
    await channel.wait_durable()
    # no close: the files are left as a crash leaves them
    again, reader = _reopened(make_host, subscriber)
    assert reader.bodies() == []
    assert (again.depth, [m.body for m in again.peek_deferred(5)]) == (0, [b"later"])
