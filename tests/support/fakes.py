"""Fakes for building a Topic or Channel alone: a host, a disk-queue store with switchable failures, a subscriber."""

from __future__ import annotations

import trio

from broker.config.options import parse_args
from broker.core.channel import Channel
from broker.core.host import CoreHost
from broker.core.topic import Topic
from broker.replication.confirm import Confirms
from broker.replication.fence import ClockFence
from broker.storage.queuestore import QueueStore
from diskqueue import DiskQueueError

FULL = "failed to write to diskqueue: No space left on device"


class SwitchableQueue:
    """A real disk queue whose writes fail while ``full`` is set."""

    def __init__(self, queue):
        self.queue = queue
        self.full = False

    def __getattr__(self, name):
        return getattr(self.queue, name)

    def put_many(self, payloads):
        if self.full:
            raise DiskQueueError(FULL)
        return self.queue.put_many(payloads)


class FakeQueues:
    """Disk queues in a temporary directory; stashes kept in memory; every opened queue by name."""

    def __init__(self, path, options):
        self._store = QueueStore(path, options)
        self.opened: dict[str, SwitchableQueue] = {}
        self.stashes: dict[str, list[bytes]] = {}

    def open(self, name, *, auto_commit=True, **kw):
        queue = SwitchableQueue(self._store.open(name, auto_commit=auto_commit, **kw))
        self.opened[name] = queue
        return queue

    def exists(self, name):
        return self._store.exists(name)

    def take_stash(self, name):
        return self.stashes.pop(name, [])

    async def stash(self, name, records):
        self.stashes[name] = list(records)

    def drop_stash(self, name):
        self.stashes.pop(name, None)


class FakeHost:
    """A CoreHost's parts plus what it was told: disk errors and metadata changes."""

    def __init__(self, path, *flags):
        self.options = parse_args([f"--data-path={path}", *flags])
        self.queues = FakeQueues(path, self.options)
        self.disk_errors: list[str] = []
        self.metadata_changes = 0
        self.core = CoreHost(self.options, self.queues, self._disk_failed, self._changed, self._wait)

    def _disk_failed(self, exc):
        self.disk_errors.append(str(exc))

    def _changed(self):
        self.metadata_changes += 1

    async def _wait(self):
        pass

    def channel(self, name="c", topic="t"):
        """A channel built alone; ``self.emptied`` lists the channels that reported they are empty."""
        self.emptied = getattr(self, "emptied", [])
        return Channel(topic, name, self.core, topic_e2e=self.core.latency_stream(),
                       on_empty=lambda: self.emptied.append(name), upstream=NoUpstream())

    def topic(self, name="t"):
        self.emptied = getattr(self, "emptied", [])
        return Topic(name, self.core, on_empty=lambda: self.emptied.append(name))


class NoUpstream:
    """The topic of a channel built alone: it holds nothing for it."""

    def held_for(self, channel):
        return 0, 0

    def peek_held(self, channel, n):
        return []

    def demand_changed(self):
        pass

    def channel_emptied(self, channel):
        pass

    def moving(self):
        return False


class FakeSubscriber:
    """A consumer that records the messages it was sent."""

    def __init__(self, rdy=100, msg_timeout=60.0, sample_rate=0):
        self.rdy = rdy
        self.msg_timeout = msg_timeout
        self.sample_rate = sample_rate
        self.in_flight_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.lease: str | None = None
        self.lease_owner = ""
        self.received = []  # the messages, as the channel holds them
        self.deliveries = []  # (body, attempts) of each delivery, as sent
        self.closing = False

    def send_messages(self, msgs):
        self.received.extend(msgs)
        self.deliveries.extend((m.body, m.attempts) for m in msgs)
        self.in_flight_count += len(msgs)

    def wake_writer(self):
        pass

    def ready_for_more(self):
        return self.in_flight_count < self.rdy and not self.closing

    def output_room(self):
        return 1 << 30  # a socket that takes everything at once

    def unsent(self, msgs):
        return []

    def close_soon(self):
        self.closing = True

    def bodies(self):
        return [m.body for m in self.received]


async def majority_answers(timeout: float) -> bool:
    """The question before a replicated delivery, in a cluster whose majority always answers at once."""
    await trio.sleep(0.001)  # a round trip
    return True


def answering_confirms() -> Confirms:
    """Deliveries that a majority confirms after a round trip (run its ``run`` in a nursery)."""
    fence = ClockFence(limit=float("inf"), replicated=lambda topic: True)
    fence.starting = False
    return Confirms(majority_answers, 5.0, fence, lambda: None)

