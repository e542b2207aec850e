"""Copies made again (broker/replication/recopy.py) on Trio's mock clock: which holder is gone,
which messages get new copies, on which peer, with which holders and finished channels, what
the gone holder and the holders up are told, and the copies counted missing until then.

The topic and its channels are the core's own (spilling to disk, in flight, deferred, finished
by one channel); the peers are real holders (broker/replication/holder.py over a log of their
own) behind fake links that hand them each request as its wire form, and answer at once."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import trio

from broker.core.message import Message
from broker.replication.copies import UNKNOWN, PeerCopies
from broker.replication.held import HeldCopies
from broker.replication.holder import Holder
from broker.replication.links import Waiter
from broker.replication.peers import Peers
from broker.replication.recopy import RECOPY_INTERVAL, Recopy
from broker.replication.wire import Add, Drop, Holds, encode_request, pack, unpack
from tests.support.fakes import FakeHost, FakeSubscriber, answering_confirms
from tests.support.waiting import wait_for

ME, GONE, LIVE, NEXT, OTHER = "a" * 32, "b" * 32, "c" * 32, "d" * 32, "e" * 32
TIMEOUT = 5.0


class PeerNode:
    """A peer node as this node's link to it sees it: up or not, and a real holder behind it that
    is handed every request as it travels (``on_request`` runs before each is applied)."""

    def __init__(self, peer_id: str, held: HeldCopies, options):
        self.peer_id = peer_id
        self.connected = True
        self.last_heard = 0.0
        self.holder = Holder(options, Peers(), b"", _never, lambda node: None, lambda topic, keys: [])
        self.holder.node_id = peer_id
        self.holder.held = held
        self.requests: list = []
        self.posted: list = []
        self.on_request = None

    @property
    def held(self) -> HeldCopies:
        assert self.holder.held is not None
        return self.holder.held

    def request(self, request, size=0, *, inline=False) -> Waiter:
        waiter = Waiter()
        if not self.connected:
            waiter.settle("not connected")
            return waiter
        if self.on_request is not None:
            self.on_request(request)
        self.requests.append(request)
        seq, error, extra = unpack(self.holder.receive(ME, pack([1, [encode_request(request)]])))
        waiter.settle(error, extra)
        return waiter

    async def flush(self) -> None:
        await trio.lowlevel.checkpoint()

    def post(self, request, size=0) -> None:
        self.posted.append(request)

    def holding(self, topic: str = "t") -> dict[bytes, tuple[str, ...]]:
        copies = self.held.copies(ME, topic)
        return dict(copies.holders) if copies is not None else {}


async def _never(node: str) -> None:
    raise AssertionError("no takeover here")


class Cluster:
    """This node's topic ``t`` (channels c1 and c2), its sending side and restores, and its peers."""

    def __init__(self, tmp_path, replicas: int):
        self.tmp_path = tmp_path
        self.host = FakeHost(tmp_path / "me", f"--replicas={replicas}", f"--replica-timeout={TIMEOUT}s",
                             "--mem-queue-size=10")
        self.peers = Peers()
        self.copies = PeerCopies(self.host.options, self.peers, lambda topic: 0, dict)
        self.copies.node_id = ME
        self.copies.confirms = answering_confirms()
        self.core = dataclasses.replace(self.host.core, copies=self.copies)
        self.topics: dict = {}
        self.recopy = Recopy(SimpleNamespace(topics=self.topics), ME, self.peers, self.copies)  # type: ignore[arg-type]
        self.nodes: dict[str, PeerNode] = {}

    async def node(self, peer_id: str, *, up: bool = True) -> PeerNode:
        held = await HeldCopies.open(self.tmp_path / peer_id, durable=False, max_record=1 << 20)
        node = PeerNode(peer_id, held, self.host.options)
        node.connected = up
        self.peers.links[("127.0.0.1", len(self.peers.links) + 1)] = node  # type: ignore[assignment]
        self.nodes[peer_id] = node
        return node

    async def topic(self, nursery, name: str = "t"):
        from broker.core.topic import Topic

        topic = Topic(name, self.core, on_empty=lambda: None)
        if not self.topics:
            nursery.start_soon(self.copies.confirms.run)
        await nursery.start(topic.run)
        for channel in ("c1", "c2"):
            topic.get_channel(channel)
        self.topics[name] = topic
        return topic

    def missing(self, topic: str = "t") -> int:
        return self.copies.counters(topic)[5]

    async def close(self) -> None:
        for node in self.nodes.values():
            await node.held.close()


def _messages(n: int, start: int = 0) -> list[Message]:
    return [Message(b"%016d" % i, b"body %d" % i, 1_000 + i, 0, 0, None) for i in range(start, start + n)]


async def _published(topic, messages: list[Message]) -> None:
    """Queue ``messages`` and let the pump hand them to both channels (unless the topic holds them
    for its channels: none has a subscriber)."""
    topic.put_many(messages)
    with trio.fail_after(10):
        while topic.ready.depth and not topic.fanout.holding():
            await trio.sleep(0.01)


def _add_to(node: PeerNode, holders: tuple[str, ...], messages: list[Message]) -> None:
    """``node`` took copies of ``messages`` in an ADD listing ``holders``."""
    from broker.replication.wire import pack_entries

    node.request(Add("t", holders, [m.id for m in messages], pack_entries(messages, published=True)))


async def _restored(cluster: Cluster) -> None:
    """Let the restores run: once past --replica-timeout, until nothing is missing."""
    await trio.sleep(TIMEOUT + 2 * RECOPY_INTERVAL)
    await cluster.recopy.tick()


@pytest.fixture
async def cluster2(tmp_path):
    cluster = Cluster(tmp_path, replicas=2)
    yield cluster
    await cluster.close()


async def test_a_holder_gone_for_the_replica_timeout_has_every_unfinished_message_copied_to_the_next_peer(
        cluster2, autojump_clock):
    cluster = cluster2
    gone = await cluster.node(GONE, up=False)
    nxt, other = await cluster.node(NEXT), await cluster.node(OTHER)
    expected = cluster.copies.holders_for("t")[0]  # the first in the topic's rendezvous order
    async with trio.open_nursery() as nursery:
        topic = await cluster.topic(nursery)
        c1, c2 = topic.channels["c1"], topic.channels["c2"]
        consumer = FakeSubscriber(rdy=0)  # subscribed: the topic hands every message to its channels
        c1.add_client(consumer)
        messages = _messages(30)
        await _published(topic, messages)
        cluster.copies.took("t", [GONE], 30)
        assert c1.backend_depth and c2.backend_depth  # some wait on disk
        consumer.rdy = 6
        c1.dispatch()
        await trio.sleep(0.002)  # written once a majority answered
        in_flight = [m.id for m in consumer.received]
        assert len(in_flight) == 6
        c1.finish_many(consumer, in_flight[:2])
        c1.requeue(consumer, in_flight[2], 60_000)  # deferred
        c2.add_client(c2_consumer := FakeSubscriber(rdy=1))
        c2.dispatch()
        await trio.sleep(0.002)
        assert c2_consumer.received[0].id == in_flight[0]
        c2.finish_many(c2_consumer, [in_flight[0]])  # by both: finished, not copied

        await trio.sleep(TIMEOUT - 1)
        await cluster.recopy.tick()
        assert cluster.missing() == 0 and not expected.requests  # not gone for long enough yet
        await _restored(cluster)
        nursery.cancel_scope.cancel()

    unfinished = {m.id for m in messages} - {in_flight[0]}
    assert set(expected.holding()) == unfinished
    assert set(expected.holding().values()) == {(ME, expected.peer_id)}  # this node, then the new holder
    assert (other if expected is nxt else nxt).holding() == {}
    assert expected.held.origins[ME]["t"].done == {in_flight[1]: {"c1"}}  # finished by c1 only: c1 said done
    [drop] = gone.posted
    assert isinstance(drop, Drop) and set(drop.ids) == unfinished  # delivered if it comes back
    assert cluster.missing() == 0 and cluster.recopy.restored == 29
    assert set(cluster.copies.placed["t"]) == {expected.peer_id}


async def test_copies_stay_missing_while_no_peer_can_take_one_and_are_made_once_one_connects(cluster2, autojump_clock):
    cluster = cluster2
    await cluster.node(GONE, up=False)
    async with trio.open_nursery() as nursery:
        topic = await cluster.topic(nursery)
        await _published(topic, _messages(12))
        cluster.copies.took("t", [GONE], 12)
        await _restored(cluster)
        assert cluster.missing() == 12  # one copy of each message is missing
        await trio.sleep(30)
        await cluster.recopy.tick()
        assert cluster.missing() == 12
        late = await cluster.node(NEXT)
        await cluster.recopy.tick()
        nursery.cancel_scope.cancel()
    assert cluster.missing() == 0 and len(late.holding()) == 12


async def test_with_three_replicas_the_holder_up_is_asked_told_the_new_holders_and_one_copy_is_made(
        tmp_path, autojump_clock):
    cluster = Cluster(tmp_path, replicas=3)
    gone = await cluster.node(GONE, up=False)
    live = await cluster.node(LIVE)
    await cluster.node(NEXT)
    await cluster.node(OTHER)
    async with trio.open_nursery() as nursery:
        topic = await cluster.topic(nursery)
        old, recent = _messages(20), _messages(10, start=20)
        await _published(topic, old + recent)
        _add_to(live, (ME, GONE, LIVE), old)  # the gone holder listed first
        recent_holders = (ME, LIVE, NEXT)  # published while it was away
        _add_to(live, recent_holders, recent)
        _add_to(cluster.nodes[NEXT], recent_holders, recent)
        cluster.copies.took("t", [GONE, LIVE], 20)
        cluster.copies.took("t", [LIVE, NEXT], 10)
        await _restored(cluster)
        nursery.cancel_scope.cancel()

    assert any(isinstance(r, Holds) and r.holders is None for r in live.requests)  # asked first
    for msg in old + recent:
        holding = {node.peer_id: node.holding().get(msg.id) for node in cluster.nodes.values() if node is not gone}
        holders = {peer: listed for peer, listed in holding.items() if listed is not None}
        assert len(holders) == 2, (msg.id, holders)  # this node and two peers up: three copies again
        [listed] = set(holders.values())  # every holder lists the same nodes ...
        assert listed[0] == ME and set(listed[1:]) == set(holders) and GONE not in listed
        if msg in old:
            assert listed[1] == LIVE  # ... this node, the holder up, then the new one
    assert sum(len(r.ids) for r in cluster.nodes[NEXT].requests + cluster.nodes[OTHER].requests
               if isinstance(r, Add)) == 20 + 10  # the ten recent ones were added before the restore
    assert {msg_id for drop in gone.posted for msg_id in drop.ids} == {m.id for m in old + recent}
    assert cluster.missing() == 0
    await cluster.close()


async def test_a_fin_that_comes_while_a_piece_waits_for_answers_is_said_in_its_copy(cluster2, autojump_clock):
    cluster = cluster2
    await cluster.node(GONE, up=False)
    nxt = await cluster.node(NEXT)
    async with trio.open_nursery() as nursery:
        topic = await cluster.topic(nursery)
        await _published(topic, _messages(8))
        cluster.copies.took("t", [GONE], 8)
        cluster.copies.took("t", [NEXT], 0)  # the topic's later copies went there: it is asked
        consumer = FakeSubscriber(rdy=1)
        c1 = topic.channels["c1"]
        c1.add_client(consumer)  # the topic hands its messages over: one is delivered
        [delivered] = await wait_for(lambda: consumer.received)

        def fin_while_asked(request):
            if isinstance(request, Holds):
                c1.finish_many(consumer, [delivered.id])

        nxt.on_request = fin_while_asked
        await _restored(cluster)
        nursery.cancel_scope.cancel()
    assert len(nxt.holding()) == 8
    assert nxt.held.origins[ME]["t"].done == {delivered.id: {"c1"}}


async def test_a_gone_holder_that_comes_back_ends_the_restore(cluster2, autojump_clock):
    cluster = cluster2
    gone = await cluster.node(GONE, up=False)
    nxt = await cluster.node(NEXT)
    async with trio.open_nursery() as nursery:
        topic = await cluster.topic(nursery)
        await _published(topic, _messages(2500))
        cluster.copies.took("t", [GONE], 2500)

        def back_after_one_piece(request):
            if isinstance(request, Add):
                gone.connected = True

        nxt.on_request = back_after_one_piece
        await _restored(cluster)
        assert cluster.missing() > 0  # counted while the restore ran
        await cluster.recopy.tick()
        nursery.cancel_scope.cancel()
    assert len(nxt.holding()) == 1000  # one piece, then it was back: it holds the rest
    [drop] = gone.posted
    assert set(drop.ids) == set(nxt.holding())  # what was made again is dropped there
    assert cluster.missing() == 0


async def test_after_a_restart_topics_the_peers_up_hold_too_few_copies_of_get_them_made_again(cluster2, autojump_clock):
    cluster = cluster2
    nxt = await cluster.node(NEXT)
    await cluster.node(OTHER)
    async with trio.open_nursery() as nursery:
        short, whole = await cluster.topic(nursery, "t"), await cluster.topic(nursery, "u")
        messages = _messages(30)
        await _published(short, messages)
        await _published(whole, _messages(5))
        _add_to(nxt, (ME, NEXT), messages[:10])
        cluster.recopy.heard(NEXT, {"t": 10, "u": 5})  # HELLO answers; the holder of the rest did not come back
        await trio.sleep(TIMEOUT - 1)
        await cluster.recopy.tick()
        assert cluster.missing("t") == 0  # no word yet
        await _restored(cluster)
        nursery.cancel_scope.cancel()
    held = {msg.id: [node.peer_id for node in cluster.nodes.values() if msg.id in node.holding()] for msg in messages}
    assert all(len(peers) == 1 for peers in held.values()), held
    assert all(peer == NEXT for msg in messages[:10] for peer in held[msg.id])  # those it held were not copied twice
    assert not any(isinstance(r, Holds) and r.topic == "u" for r in nxt.requests)  # enough copies of u
    assert cluster.missing("t") == 0 and UNKNOWN not in cluster.copies.placed["t"]


async def test_a_takeover_that_could_make_too_few_copies_leaves_them_to_be_made_again(cluster2, autojump_clock):
    cluster = cluster2
    async with trio.open_nursery() as nursery:
        topic = await cluster.topic(nursery)
        messages = _messages(4)
        await cluster.copies.store("t", messages, [None] * 4, best_effort=True)  # no peer connected
        await _published(topic, messages)
        await trio.sleep(2 * RECOPY_INTERVAL)
        await cluster.recopy.tick()
        assert cluster.missing() == 4
        nxt = await cluster.node(NEXT)
        await cluster.recopy.tick()
        nursery.cancel_scope.cancel()
    assert set(nxt.holding()) == {m.id for m in messages} and cluster.missing() == 0
