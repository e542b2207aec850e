"""Delivery only while a majority hears this node (broker/replication/confirm.py and
Quorum.confirm), on Trio's mock clock with a real channel: what a replicated channel chooses for
a consumer is written once a majority of the members answered a GONE of this node asked after
it was chosen; without one, it goes back to the queue uncounted and the topics hold until a
majority answers again."""

from __future__ import annotations

import dataclasses

import pytest
import trio

from broker.core.message import Message
from broker.core.retention import RETRY_DELAY
from broker.replication.confirm import PROBE_INTERVAL, Confirms
from broker.replication.copies import PeerCopies
from broker.replication.fence import ClockFence
from broker.replication.links import Waiter
from broker.replication.members import Members
from broker.replication.peers import Peers
from broker.replication.quorum import Quorum
from broker.replication.wire import Gone
from tests.support.fakes import FakeHost, FakeSubscriber

ME, B, C, D, E = ("%032x" % n for n in range(1, 6))


class GoneLink:
    """A link to ``peer_id`` that answers GONE as ``reaches`` says, after ``delay`` seconds
    (``reaches`` None: never answers)."""

    def __init__(self, peer_id: str, reaches: bool | None = True, delay: float = 0.001):
        self.peer_id = peer_id
        self.connected = True
        self.reaches = reaches
        self.delay = delay
        self.asked: list[Gone] = []
        self._nursery: trio.Nursery | None = None

    def request(self, request, size=0, *, inline=False) -> Waiter:
        assert isinstance(request, Gone)
        self.asked.append(request)
        waiter = Waiter()
        if self.reaches is not None and self._nursery is not None:
            self._nursery.start_soon(self._answer, waiter, self.reaches)
        return waiter

    async def _answer(self, waiter: Waiter, reaches: bool) -> None:
        await trio.sleep(self.delay)
        waiter.settle(None, [reaches, 0.0 if reaches else 5.0])


class Cluster:
    """This node, members ``ME`` and ``nodes``, each linked as ``GoneLink``."""

    def __init__(self, tmp_path, nursery: trio.Nursery, links: list[GoneLink]):
        members = Members(tmp_path, ME)
        self.peers = Peers()
        for n, link in enumerate(links):
            members.proven(link.peer_id, f"127.0.0.{n + 2}:4150")
            link._nursery = nursery
            self.peers.links[("127.0.0.1", n + 1)] = link  # type: ignore[assignment]
        self.quorum = Quorum(members, self.peers, timeout=2.0)
        self.fence = ClockFence(limit=float("inf"), replicated=lambda topic: True)
        self.fence.starting = False
        self.reopened = 0  # times every channel was told to deliver again
        self.confirms = Confirms(self.quorum.confirm, 2.0, self.fence, self._reopened)
        nursery.start_soon(self.confirms.run)

    def _reopened(self) -> None:
        self.reopened += 1

    def host(self, tmp_path, *flags: str) -> FakeHost:
        """A host whose topic ``t`` has two replicas, its deliveries confirmed here, behind this fence."""
        copies = PeerCopies(FakeHost(tmp_path).options, self.peers, lambda topic: 0, dict)
        copies.configure("t", 2)
        copies.confirms = self.confirms
        host = FakeHost(tmp_path / "host", *flags)
        host.core = dataclasses.replace(host.core, copies=copies, fence=self.fence)
        return host

    def subscribed(self, tmp_path, rdy: int):
        """Channel ``t:c`` built alone, with one consumer of RDY ``rdy``."""
        channel = self.host(tmp_path).channel(topic="t")
        consumer = FakeSubscriber(rdy=rdy)
        channel.add_client(consumer)
        return channel, consumer


def _messages(n: int) -> list[Message]:
    return [Message(b"%016d" % i, b"m%d" % i, 1) for i in range(n)]


async def test_a_delivery_is_written_once_a_majority_answered_a_question_asked_after_it(tmp_path, autojump_clock):
    quick, slow = GoneLink(B, delay=0.01), GoneLink(C, delay=0.5)
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery, [quick, slow])
        channel, consumer = cluster.subscribed(tmp_path, rdy=4)
        channel.put_many(_messages(2))
        assert consumer.received == [] and consumer.in_flight_count == 2  # chosen: the window is taken
        await trio.sleep(0.005)
        channel.put_many(_messages(6)[2:])  # chosen while the question is out: they wait for the next
        assert quick.asked == [Gone(ME)]  # does B reach this node?
        await trio.sleep(0.006)  # B answered the first: with this node, a majority of three
        assert consumer.bodies() == [b"m0", b"m1"]
        await trio.sleep(0.011)
        assert consumer.bodies() == [b"m0", b"m1", b"m2", b"m3"]
        assert [d[1] for d in consumer.deliveries] == [1, 1, 1, 1] and consumer.in_flight_count == 4
        assert len(slow.asked) == 2 and not cluster.fence.doubt and cluster.reopened == 0  # C's answers were not waited for
        nursery.cancel_scope.cancel()


async def test_without_a_majority_a_delivery_goes_back_uncounted_and_the_topic_holds_until_one_answers(
        tmp_path, autojump_clock):
    b, c = GoneLink(B, reaches=None), GoneLink(C, reaches=False)  # B silent (a blackhole), C no longer reaches us
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery, [b, c])
        channel, consumer = cluster.subscribed(tmp_path, rdy=10)
        channel.put_many(_messages(3))
        await trio.sleep(1.9)
        assert consumer.received == [] and consumer.in_flight_count == 3
        await trio.sleep(0.2)  # --replica-timeout without a majority: back, not an attempt
        assert consumer.received == [] and consumer.in_flight_count == 0 and not channel.in_flight
        assert channel.depth == 3 and [m.attempts for m in channel.peek_ready(3)] == [0, 0, 0]
        assert cluster.fence.doubt and cluster.fence.holds("t") and cluster.reopened == 0
        b.reaches = True  # B answers again: the next question (asked every PROBE_INTERVAL) is answered
        await trio.sleep(2.0 + PROBE_INTERVAL + 0.01)
        assert not cluster.fence.doubt and cluster.reopened == 1
        channel.dispatch()  # as the replicator does for every channel once reopened
        await trio.sleep(0.01)
        assert consumer.bodies() == [b"m0", b"m1", b"m2"] and [m.attempts for m in consumer.received] == [1, 1, 1]
        nursery.cancel_scope.cancel()


async def test_no_majority_connected_is_known_at_once(tmp_path, autojump_clock):
    b, c = GoneLink(B), GoneLink(C)
    b.connected = c.connected = False
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery, [b, c])
        channel, consumer = cluster.subscribed(tmp_path, rdy=10)
        channel.put_many(_messages(2))
        await trio.sleep(0.001)
        assert cluster.fence.doubt and channel.depth == 2 and consumer.in_flight_count == 0
        assert b.asked == [] and c.asked == []  # nobody to ask
        nursery.cancel_scope.cancel()


async def test_a_fence_closed_while_the_question_was_out_sends_nothing(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery, [GoneLink(B, delay=0.1), GoneLink(C, delay=0.1)])
        channel, consumer = cluster.subscribed(tmp_path, rdy=10)
        channel.put_many(_messages(2))
        cluster.fence.armed = True  # this node was stopped meanwhile, and asks its peers again
        await trio.sleep(0.2)
        assert consumer.received == [] and channel.depth == 2 and not cluster.fence.doubt
        nursery.cancel_scope.cancel()


async def test_five_members_need_two_answers_that_reach_this_node(tmp_path, autojump_clock):
    links = [GoneLink(B, reaches=True), GoneLink(C, reaches=False), GoneLink(D, reaches=None), GoneLink(E, reaches=True)]
    async with trio.open_nursery() as nursery:
        quorum = Cluster(tmp_path, nursery, links).quorum
        assert await quorum.confirm(1.0)
        links[3].reaches = None
        began = trio.current_time()
        assert not await quorum.confirm(1.0)  # only B: two of five
        assert trio.current_time() - began == pytest.approx(1.0)
        nursery.cancel_scope.cancel()


async def test_a_backlog_read_in_many_deliveries_at_one_instant_is_written_once_each(tmp_path, autojump_clock):
    # deliveries chosen at the same instant share their timeout; each is written once, as chosen
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery, [GoneLink(B), GoneLink(C)])
        topic = cluster.host(tmp_path, "--mem-queue-size=100").topic("t")
        await nursery.start(topic.run)
        channel = topic.get_channel("c")
        consumer = FakeSubscriber(rdy=250)
        channel.add_client(consumer)
        topic.put_many(_messages(3000))  # 100 in memory, the rest on disk, read ahead in runs
        finished = 0
        with trio.fail_after(60):
            while finished < 3000:
                await trio.sleep(0.01)
                ids = [m.id for m in consumer.received[finished:]]
                finished = len(consumer.received)
                assert channel.finish_many(consumer, ids) == []  # each in flight, once
                channel.dispatch()  # as the server does after FINs
        assert sorted(consumer.bodies()) == sorted(m.body for m in _messages(3000))
        assert consumer.in_flight_count == 0 and not channel.in_flight
        nursery.cancel_scope.cancel()


async def test_a_delivery_taken_back_while_the_disk_refuses_stays_in_flight_owned_by_nobody_until_it_takes_writes(
        tmp_path, autojump_clock):
    b, c = GoneLink(B), GoneLink(C)
    b.connected = c.connected = False  # no majority: every delivery is taken back
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery, [b, c])
        host = cluster.host(tmp_path, "--durable")
        channel = host.channel(topic="t")
        channel.put_many(_messages(2))
        for queue in host.queues.opened.values():
            queue.full = True  # a requeue's records cannot be written
        consumer = FakeSubscriber(rdy=10)
        channel.add_client(consumer)
        channel.dispatch()
        await trio.sleep(0.001)
        assert consumer.received == [] and consumer.in_flight_count == 0 and host.disk_errors
        assert len(channel.in_flight) == 2 and all(m.client is None for m in channel.in_flight.values())
        for queue in host.queues.opened.values():
            queue.full = False
        await trio.sleep(RETRY_DELAY)
        channel.process_timers()  # as the broker's scanner does
        assert not channel.in_flight and channel.depth == 2 and consumer.received == []  # the fence holds them
        assert [m.attempts for m in channel.peek_ready(2)] == [0, 0]
        nursery.cancel_scope.cancel()
