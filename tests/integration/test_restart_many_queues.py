"""A restart with many topics and channels: the data directory is listed once, and every
message comes back (ready on disk, in memory at shutdown, in flight, deferred)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio

from broker.protocol import encode_dpub, encode_fin, encode_mpub, encode_rdy
from diskqueue import fileops
from tests.support.v2client import connect, subscriber
from tests.support.waiting import wait_for

MODES = pytest.mark.parametrize("flags", [(), ("--durable",)], ids=["default", "durable"])


@contextmanager
def counted_listings(monkeypatch: pytest.MonkeyPatch, directory: Path) -> Iterator[list[str]]:
    """Every listing of ``directory`` (``os.listdir``, ``os.scandir``, the disk queue's ``listdir``)."""
    made: list[str] = []
    target = os.path.realpath(directory)

    def counting(real):
        def call(path=".", *args, **kwargs):
            if isinstance(path, (str, os.PathLike)) and os.path.realpath(os.fspath(path)) == target:
                made.append(real.__name__)
            return real(path, *args, **kwargs)
        return call

    monkeypatch.setattr(os, "listdir", counting(os.listdir))
    monkeypatch.setattr(os, "scandir", counting(os.scandir))
    previous = fileops.substitute({"listdir": counting(fileops.listdir)})
    try:
        yield made
    finally:
        fileops.substitute(previous)
        monkeypatch.undo()


async def test_start_up_lists_the_data_directory_a_constant_number_of_times(start_daemon, tmp_path, monkeypatch):
    topics = 1000
    async with start_daemon() as d:
        producer = await connect(d.addresses.tcp)
        for i in range(topics):
            topic = d.broker.get_topic(f"t{i:04d}")
            topic.get_channel("c")
            topic.get_channel("d")
            await producer.send(encode_mpub(f"t{i:04d}", [b"body-%d" % i]))
            await producer.expect_response(b"OK")
        await producer.aclose()
    data = tmp_path / "data"
    # the stop wrote every topic's message to its disk queue, once for both channels (nobody
    # reads them, so the topic holds it for both): 1,000 queues with files
    queues = {name.split(".diskqueue.")[0] for name in os.listdir(data) if ".diskqueue." in name}
    assert queues == {f"t{i:04d}" for i in range(topics)}
    with counted_listings(monkeypatch, data) as made:
        async with start_daemon() as d:
            assert len(d.broker.topics) == topics
            assert all(d.broker.topics[f"t{i:04d}"].channels[c].depth == 1 for i in range(topics) for c in "cd")
    assert len(made) <= 2, Counter(made)


async def read_exactly(daemon, topic: str, channel: str, count: int) -> list[bytes]:
    """``count`` messages from ``topic``/``channel``, each FIN'd; then nothing more arrives."""
    client = await subscriber(daemon, topic, channel)
    await client.send(encode_rdy(count + 1))
    got = []
    with trio.fail_after(10):
        while len(got) < count:
            msg = await client.read_message()
            got.append(msg.body)
            await client.send(encode_fin(msg.id))
    await client.expect_quiet()
    await client.aclose()
    return got


@MODES
async def test_a_restart_with_many_topics_delivers_every_message(start_daemon, flags):
    """Three hundred topics: messages spilled to disk and held in memory, deferred, in flight
    at the stop, on a topic without channels, on two channels of one topic."""
    expected: dict[tuple[str, str], list[bytes]] = {}
    options = ("--mem-queue-size=2", *flags)
    async with start_daemon(*options) as d:
        producer = await connect(d.addresses.tcp)
        consumers = []
        for i in range(300):
            kind = ("spill", "deferred", "inflight", "nochannel", "twochannels")[i % 5]
            topic = f"{kind}.{i:03d}"
            bodies = [f"{topic}/{n}".encode() for n in range(5)]
            channels = {"nochannel": [], "twochannels": ["c", "d"]}.get(kind, ["c"])
            for channel in channels:
                d.broker.get_topic(topic).get_channel(channel)
                expected[(topic, channel)] = bodies
            if kind == "nochannel":
                d.broker.get_topic(topic)
                expected[(topic, "late")] = bodies  # a channel created after the restart gets the topic's messages
            if kind == "deferred":
                for body in bodies:
                    await producer.send(encode_dpub(topic, 300, body))
                    await producer.expect_response(b"OK")
            else:
                await producer.send(encode_mpub(topic, bodies))
                await producer.expect_response(b"OK")
            if kind == "inflight":
                consumer = await subscriber(d, topic, "c", rdy=5)
                assert sorted(m.body for m in await consumer.read_messages(5)) == sorted(bodies)
                consumers.append(consumer)  # never FIN'd: in flight when the broker stops
        await producer.aclose()
        # the stop closes the consumers' connections with their messages in flight
    async with start_daemon(*options) as d:
        assert len(d.broker.topics) == 300
        delivered = {}
        for (topic, channel), bodies in expected.items():
            delivered[(topic, channel)] = await read_exactly(d, topic, channel, len(bodies))
    assert {k: Counter(v) for k, v in delivered.items()} == {k: Counter(v) for k, v in expected.items()}


@MODES
async def test_creating_topics_and_channels_at_runtime_lists_nothing(start_daemon, tmp_path, monkeypatch, flags):
    """A topic or channel created once the broker runs (also one deleted and created again)
    finds its files without a listing of the data directory, and starts empty."""
    async with start_daemon(*flags) as d:
        producer = await connect(d.addresses.tcp)
        await producer.send(encode_mpub("old", [b"a", b"b"]))
        await producer.expect_response(b"OK")
        d.broker.get_topic("old").get_channel("c")
        with counted_listings(monkeypatch, tmp_path / "data") as made:
            for i in range(50):
                d.broker.get_topic(f"new{i}").get_channel("c")
            await producer.send(encode_mpub("new0", [b"x"]))
            await producer.expect_response(b"OK")
            await producer.send(encode_mpub("new1", [b"y"]))
            await producer.expect_response(b"OK")
            # the topic's pump moves it to the channel in a task of its own: let it, before the delete
            await wait_for(lambda: d.broker.topics["new1"].channels["c"].depth == 1)
        assert made == []
        d.broker.get_topic("new1").delete_channel("c")  # (a deletion lists the directory)
        with counted_listings(monkeypatch, tmp_path / "data") as made:
            d.broker.get_topic("new1").get_channel("c")
        assert made == []
        await producer.aclose()
        assert await read_exactly(d, "new0", "c", 1) == [b"x"]
        assert d.broker.topics["new1"].channels["c"].depth == 0
