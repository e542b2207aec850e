"""The Broker alone (``broker/core/broker.py``) on a real data directory, without servers:
publishing, pieces of a large publish, the registry and its listeners, shutdown and the
next start, metadata entries, disk health and the timer scan."""

from __future__ import annotations

import errno
import json
from contextlib import asynccontextmanager

import pytest
import trio

from broker.config.options import parse_args
from broker.core.broker import PUBLISH_PIECE, Broker
from broker.core.host import RegistryChange
from broker.protocol import Mpub, Pub
from broker.storage.datadir import DataDirectory, DataPathLocked
from diskqueue import DiskQueueError
from tests.support.diskfaults import FaultyDisk
from tests.support.fakes import FakeSubscriber
from tests.support.waiting import wait_for


@asynccontextmanager
async def running(path, *flags):
    """A Broker running on ``path`` (its background tasks in a nursery), shut down at the end."""
    broker = Broker(parse_args([f"--data-path={path}", *flags]), DataDirectory(parse_args([f"--data-path={path}"])))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            yield broker
            await broker.shutdown()


class Listener:
    """A registry listener that records what it was told; it knows the channels ``known`` names per topic."""

    def __init__(self, known=None):
        self.known = known or {}
        self.changes: list[RegistryChange] = []
        self.options = []

    def registry_changed(self, change):
        self.changes.append(change)

    def options_changed(self, options):
        self.options.append(options)

    async def channels_for(self, topic):
        await trio.lowlevel.checkpoint()
        return self.known.get(topic, [])

    def peer_states(self):
        return []


async def publish(broker: Broker, topic, bodies: list[bytes], defer_ns: int = 0) -> None:
    """Publish and wait for whatever the publish must still wait for."""
    _, pending = broker.publish(topic, Mpub(topic.name, bodies, defer_ms=defer_ns // 1_000_000))
    if pending is not None:
        await pending


async def test_a_publish_reaches_every_channel_of_its_topic(tmp_path):
    async with running(tmp_path) as broker:
        topic = broker.get_topic("t")
        consumers = {name: FakeSubscriber() for name in ("a", "b")}
        for name, consumer in consumers.items():
            topic.get_channel(name).add_client(consumer)
        await publish(broker, topic, [b"one", b"two"])
        await trio.testing.wait_all_tasks_blocked()
        assert {name: c.bodies() for name, c in consumers.items()} == {"a": [b"one", b"two"], "b": [b"one", b"two"]}
        ids = [m.id for m in consumers["a"].received]
        assert len(set(ids)) == 2, "each message gets its own id"


async def test_a_large_publish_is_queued_whole_and_in_order(tmp_path):
    bodies = [b"%06d" % i for i in range(PUBLISH_PIECE * 2 + 5)]
    async with running(tmp_path, "--mem-queue-size=100000") as broker:
        topic = broker.get_topic("t")
        consumer = FakeSubscriber(rdy=len(bodies))
        topic.get_channel("c").add_client(consumer)
        await publish(broker, topic, bodies)
        await trio.testing.wait_all_tasks_blocked()
        assert consumer.bodies() == bodies


async def test_publish_returns_what_to_await_only_where_it_must_wait(tmp_path):
    async with running(tmp_path) as broker:
        topic = broker.get_topic("t")
        assert broker.publish(topic, Pub("t", [b"x"])) == (0, None)
        assert topic.depth == 1  # queued already
        _, pending = broker.publish(topic, Mpub("t", [b"y"] * (PUBLISH_PIECE + 1)))  # a huge batch: in pieces
        assert pending is not None
        await pending
        assert topic.depth == PUBLISH_PIECE + 2
    async with running(tmp_path / "durable", "--durable") as broker:
        topic = broker.get_topic("t")
        _, pending = broker.publish(topic, Pub("t", [b"x"]))  # answered once on disk
        assert pending is not None
        await pending
        assert topic.depth == 1


async def test_a_deferred_publish_waits_in_the_channel(tmp_path):
    async with running(tmp_path) as broker:
        topic = broker.get_topic("t")
        consumer = FakeSubscriber()
        channel = topic.get_channel("c")
        channel.add_client(consumer)
        await publish(broker, topic, [b"later"], defer_ns=60 * 1_000_000_000)
        await trio.testing.wait_all_tasks_blocked()
        assert (consumer.bodies(), len(channel.deferred)) == ([], 1)


async def test_listeners_hear_of_topics_created_and_deleted_and_of_new_options(tmp_path):
    async with running(tmp_path) as broker:
        listener = Listener()
        broker.listen(listener)
        topic = broker.get_topic("t")
        topic.get_channel("c")
        await trio.testing.wait_all_tasks_blocked()
        broker.delete_topic("t")
        options = parse_args([f"--data-path={tmp_path}", "--max-rdy-count=7"])
        broker.reconfigure(options)
        assert listener.changes == [
            RegistryChange("t", None, created=True),
            RegistryChange("t", "c", created=True),
            RegistryChange("t", "c", created=False),
            RegistryChange("t", None, created=False),
        ]
        assert listener.options == [options] and broker.options is options
        assert "t" not in broker.topics
        with pytest.raises(KeyError):
            broker.delete_topic("t")


async def test_a_new_topic_gets_the_channels_its_listeners_know_before_its_first_message(tmp_path):
    async with running(tmp_path) as broker:
        broker.listen(Listener({"t": ["peer", "bad name!", "e#ephemeral"]}))
        topic = broker.get_topic("t")
        await publish(broker, topic, [b"first"])
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(topic.channels) == ["peer"]
        assert topic.channels["peer"].depth == 1


async def test_deleting_a_topic_removes_its_files(tmp_path):
    async with running(tmp_path, "--mem-queue-size=0") as broker:
        topic = broker.get_topic("gone")
        topic.get_channel("c")
        await publish(broker, topic, [b"x"])
        await trio.testing.wait_all_tasks_blocked()
        assert any(p.name.startswith("gone") for p in tmp_path.iterdir())
        broker.delete_topic("gone")
        assert not any(p.name.startswith("gone") for p in tmp_path.iterdir())


async def test_shutdown_writes_memory_to_disk_and_the_next_start_has_it_all(tmp_path):
    async with running(tmp_path) as broker:
        topic = broker.get_topic("t")
        channel = topic.get_channel("c")
        channel.set_max_attempts(3)
        topic.get_channel("e#ephemeral")
        broker.get_topic("x#ephemeral")
        await publish(broker, topic, [b"a", b"b", b"c"])
        await trio.testing.wait_all_tasks_blocked()
        assert channel.depth == 3
    saved = json.loads((tmp_path / "nsqd.dat").read_text())
    assert [t["name"] for t in saved["topics"]] == ["t"]
    assert saved["topics"][0]["channels"] == [{"name": "c", "paused": False, "max_attempts": 3}]
    async with running(tmp_path) as broker:
        assert sorted(broker.topics) == ["t"]
        channel = broker.topics["t"].channels["c"]
        assert (channel.depth, channel.max_attempts) == (3, 3)
        consumer = FakeSubscriber()
        channel.add_client(consumer)
        channel.dispatch()
        assert consumer.bodies() == [b"a", b"b", b"c"]


async def test_paused_topics_and_channels_stay_paused_across_a_restart(tmp_path):
    async with running(tmp_path) as broker:
        topic = broker.get_topic("t")
        topic.get_channel("c").paused = True
        topic.pause()
        broker.metadata_changed()
    async with running(tmp_path) as broker:
        topic = broker.topics["t"]
        assert topic.paused and topic.channels["c"].paused
        assert broker.metadata_entries() == [{"name": "t", "paused": True,
                                              "channels": [{"name": "c", "paused": True}]}]


async def test_a_second_broker_cannot_use_the_same_directory(tmp_path):
    async with running(tmp_path):
        second = Broker(parse_args([f"--data-path={tmp_path}"]), DataDirectory(parse_args([f"--data-path={tmp_path}"])))
        with pytest.raises(DataPathLocked):
            await second.run()


async def test_a_refused_write_makes_the_broker_unhealthy_until_the_disk_takes_one(tmp_path):
    disk = FaultyDisk(lambda name: name.startswith("t."))
    with disk.installed():
        async with running(tmp_path, "--mem-queue-size=0") as broker:
            topic = broker.get_topic("t")
            disk.fail(errno.ENOSPC)
            with pytest.raises(DiskQueueError, match="no space left on device"):
                await publish(broker, topic, [b"refused"])
            assert "no space left on device" in broker.health_error
            disk.fail(None)
            await publish(broker, topic, [b"taken"])
            assert broker.health_error is None
            assert topic.depth == 1


async def test_the_timer_scan_redelivers_what_timed_out(tmp_path):
    # the real clock: the broker's start-up and metadata writer wait on worker threads, which
    # an autojump clock would take for idleness
    async with running(tmp_path) as broker:  # the scan runs every 100 ms (nsqd's default)
        topic = broker.get_topic("t")
        channel = topic.get_channel("c")
        consumer = FakeSubscriber(rdy=1, msg_timeout=0.3)
        channel.add_client(consumer)
        await publish(broker, topic, [b"slow"])
        await trio.testing.wait_all_tasks_blocked()
        delivered = trio.current_time()
        assert consumer.deliveries == [(b"slow", 1)]
        consumer.in_flight_count = 0  # the connection's count: the timeout frees the RDY window
        await wait_for(lambda: len(consumer.deliveries) == 2, timeout=5)
        assert trio.current_time() - delivered >= 0.25  # from just after the delivery
        assert consumer.deliveries == [(b"slow", 1), (b"slow", 2)]
        assert channel.timeout_count == 1
