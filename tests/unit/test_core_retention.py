"""Where a channel keeps its messages (``broker/core/retention/``): memory only for an
ephemeral channel, memory spilling to disk otherwise; their files, shutdown and deletion."""

from __future__ import annotations

import logging

from broker.core.message import Message, encode, now_ns
from broker.core.retention import DurableRetention, MemoryRetention, SpillRetention, store_name


def _files(path, prefix="t:c"):
    return sorted(p.name for p in path.iterdir() if p.name.startswith(prefix))


async def test_each_kind_of_channel_gets_its_retention_and_its_files(make_host, tmp_path):
    assert type(make_host().channel("c#ephemeral").retention) is MemoryRetention
    assert type(make_host().channel().retention) is SpillRetention
    assert type(make_host("--durable").channel("d").retention) is DurableRetention
    assert not _files(tmp_path, "t:c#ephemeral")
    channel = make_host().channel()
    assert [q.name for q in channel.retention.queues()] == ["t:c", "t:c#buried"]
    assert store_name(channel.where, "deferred") == "t:c#deferred"


async def test_memory_only_drops_what_does_not_fit_and_opens_no_file(make_host, messages, tmp_path):
    host = make_host("--mem-queue-size=2")
    channel = host.channel("c#ephemeral")
    channel.put_many(messages(b"a", b"b", b"c"))
    assert [m.body for m in channel.peek_ready(5)] == [b"a", b"b"]
    assert channel.retention.queues() == [] and host.queues.opened == {}
    channel.retention.delete()  # nothing to remove: no error either
    assert not _files(tmp_path)


async def test_records_copied_in_are_split_into_ready_and_deferred(make_host):
    channel = make_host().channel()
    later = now_ns() + 60 * 1_000_000_000
    records = [encode(Message(b"%016d" % 1, b"now", now_ns(), 0, 0)),
               encode(Message(b"%016d" % 2, b"later", now_ns(), 0, later))]
    assert channel.retention.put_records(records, 1) == 2
    assert [m.body for m in channel.peek_ready(5)] == [b"now"]
    assert [(m.body, m.due_ns) for m in channel.peek_deferred(5)] == [(b"later", later)]
    assert channel.retention.copied_through() == (-1, -1)


async def test_spilled_messages_are_files_on_disk_and_delete_removes_them(make_host, messages, tmp_path):
    host = make_host("--mem-queue-size=1")
    channel = host.channel()
    channel.put_many(messages(b"a", b"b", b"c"))
    assert (len(channel.memory), channel.depth) == (1, 3)
    assert "t:c.diskqueue.000000.dat" in _files(tmp_path)
    channel.retention.delete()
    assert not _files(tmp_path)


async def test_shutdown_on_a_full_disk_counts_and_logs_what_it_could_not_write(make_host, subscriber, messages,
                                                                               caplog):
    host = make_host()
    channel = host.channel()
    consumer = subscriber(rdy=1)
    channel.add_client(consumer)
    channel.put_many(messages(b"in-flight", b"ready"))
    host.queues.opened["t:c"].full = True
    with caplog.at_level(logging.ERROR, logger="pynsqd.channel"):
        assert await channel.close_queues() == 2
    assert "2 ready messages could not be written to disk" in caplog.text


async def test_shutdown_writes_memory_and_in_flight_messages_to_the_queue_for_the_next_start(make_host, subscriber, messages):
    host = make_host("--mem-queue-size=1")
    channel = host.channel()
    consumer = subscriber(rdy=1)
    channel.add_client(consumer)
    channel.put_many(messages(b"in-flight", b"memory", b"disk"))
    assert await channel.close_queues() == 0
    again = make_host("--mem-queue-size=1").channel()
    assert again.depth == 3
    reader = subscriber(rdy=3)
    again.add_client(reader)
    again.dispatch()
    assert sorted(reader.bodies()) == [b"disk", b"in-flight", b"memory"]
