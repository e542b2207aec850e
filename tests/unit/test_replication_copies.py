"""The sending side (broker/replication/copies.py) on Trio's mock clock: a publish waits for its
copies and for peers to hold them, within --replica-timeout; too few are refused and the copies
taken back; each topic's copies go to the same peers; FINs, and the attempts and due times of what
a real channel delivers and requeues, are posted in batches."""

from __future__ import annotations

import dataclasses

import pytest
import trio

from broker.config.options import parse_args
from broker.core.host import CopiesRefused
from broker.core.message import Message
from broker.replication.copies import UNKNOWN, PeerCopies
from broker.replication.links import Waiter
from broker.replication.peers import Peers
from broker.replication.wire import Add, Drop, Fin, Keys, Update
from tests.support.fakes import FakeHost, FakeSubscriber, answering_confirms

ME = "a" * 32


class FakeLink:
    """A link to node ``peer_id`` that answers each request as ``answer`` says (None: never)."""

    def __init__(self, peer_id: str, answer: str | None = "ok", known: set[bytes] = frozenset()):
        self.peer_id = peer_id
        self.connected = True
        self.answer = answer
        self.known = known  # the publish keys it says it knows
        self.requests: list = []
        self.posted: list = []

    def request(self, request, size=0, *, inline=False) -> Waiter:
        self.requests.append(request)
        waiter = Waiter()
        if self.answer is not None:
            found = sorted(self.known.intersection(request.keys)) if isinstance(request, Keys) else []
            waiter.settle(None if self.answer == "ok" else self.answer, {request.topic: found} if found else None)
        return waiter

    async def flush(self) -> None:
        await trio.lowlevel.checkpoint()

    def post(self, request, size=0) -> None:
        self.posted.append(request)


def _copies(replicas: int = 2, known_here: set[bytes] = frozenset()) -> tuple[PeerCopies, Peers]:
    peers = Peers()
    copies = PeerCopies(parse_args([f"--replicas={replicas}", "--replica-timeout=5s"]), peers, lambda t: 0, dict,
                        known_keys=lambda topic, keys: [key for key in keys if key in known_here])
    copies.node_id = ME
    copies.confirms = answering_confirms()
    return copies, peers


def _link(peers: Peers, node: str, answer: str | None = "ok", known: set[bytes] = frozenset()) -> FakeLink:
    link = FakeLink(node, answer, known)
    peers.links[("127.0.0.1", len(peers.links) + 1)] = link  # type: ignore[assignment]
    return link


MESSAGES = [Message(b"%016d" % i, b"m%d" % i, 1, 0, 0, None) for i in range(3)]


async def test_copies_go_to_the_topics_first_peers_in_rendezvous_order(autojump_clock):
    copies, peers = _copies(replicas=3)
    links = [_link(peers, node * 32) for node in "bcde"]
    await copies.store("t", MESSAGES)
    chosen = [link for link in links if link.requests]
    assert len(chosen) == 2
    [add] = chosen[0].requests
    assert isinstance(add, Add) and add.holders[0] == ME and set(add.holders[1:]) == {c.peer_id for c in chosen}
    await copies.store("t", MESSAGES)  # the same topic: the same peers
    assert [link for link in links if link.requests] == chosen
    assert copies.placed["t"] == {link.peer_id: 6 for link in chosen}  # where they are, should one go


async def test_a_publish_before_any_peer_waits_for_one_within_the_timeout(autojump_clock):
    copies, peers = _copies()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(copies.store, "t", MESSAGES)
        await trio.sleep(3)
        link = _link(peers, "b" * 32)
        peers.link_connected()
    assert len(link.requests) == 1


async def test_too_few_peers_within_the_timeout_is_refused(autojump_clock):
    copies, peers = _copies()
    started = trio.current_time()
    with pytest.raises(CopiesRefused, match=r"^only 1 of 2 copies: 0 of 0 peers connected$"):
        await copies.store("t", MESSAGES)
    assert trio.current_time() - started == pytest.approx(5)
    assert copies.stats["t"].publishes_refused == 1


@pytest.mark.parametrize("answer, reason", [(None, "no answer"), ("storing failed: disk full", "storing failed: disk full")])
async def test_a_peer_that_does_not_store_its_copy_fails_the_publish_and_is_told_to_drop_it(autojump_clock, answer,
                                                                                            reason):
    copies, peers = _copies()
    link = _link(peers, "b" * 32, answer)
    with pytest.raises(CopiesRefused, match=f"^only 1 of 2 copies: {reason}$"):
        await copies.store("t", MESSAGES)
    assert link.posted == [Drop("t", [m.id for m in MESSAGES])]
    assert copies.stats["t"].copies_waiting == 0
    assert not copies.placed.get("t")


@pytest.mark.parametrize("taken", [False, True])
async def test_a_refused_publish_settles_with_every_holder_its_add_reached_even_one_whose_answer_was_lost(
        autojump_clock, taken):
    settled: list = []

    async def settle(topic, ids, holders):
        settled.append((topic, ids, holders))
        return taken  # True: a holder said it took them over

    copies, peers = _copies(replicas=3)
    copies._settle_refused = settle
    stored, lost = _link(peers, "b" * 32), _link(peers, "c" * 32, "connection lost")
    if taken:
        await copies.store("t", MESSAGES)  # delivered there: acknowledged after all
        assert stored.posted == lost.posted == []
    else:
        with pytest.raises(CopiesRefused, match="^only 2 of 3 copies: connection lost$"):
            await copies.store("t", MESSAGES)
        assert stored.posted == lost.posted == [Drop("t", [m.id for m in MESSAGES])]
    [(topic, ids, holders)] = settled
    assert (topic, ids, set(holders)) == ("t", [m.id for m in MESSAGES], {stored, lost})


async def test_a_takeover_stores_what_it_can_and_is_never_refused(autojump_clock):
    copies, _ = _copies()
    await copies.store("t", MESSAGES, [None, ["c"], None], best_effort=True)  # no peer at all: nothing to wait for
    assert copies.stats["t"].publishes_refused == 0
    assert copies.placed["t"] == {UNKNOWN: 3}  # copies missing: made once a peer can take them


async def test_fins_are_posted_to_every_peer_in_batches(autojump_clock):
    copies, peers = _copies()
    links = [_link(peers, "b" * 32), _link(peers, "c" * 32)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(copies.run_fins)
        nursery.start_soon(copies.confirms.run)
        copies.finished("t", "c", [Message(b"1" * 16, b"x", 1)])
        copies.finished("t", "c", [Message(b"2" * 16, b"y", 1)])
        await trio.sleep(0.15)
        nursery.cancel_scope.cancel()
    for link in links:
        [fin] = link.posted
        assert (fin.topic, fin.channel, fin.ids) == ("t", "c", [b"1" * 16, b"2" * 16])


async def test_a_keyed_publish_asks_every_peer_which_keys_it_knows_and_its_holders_get_the_keys(autojump_clock):
    copies, peers = _copies(known_here={b"here"})
    links = [_link(peers, "b" * 32, known={b"b"}), _link(peers, "c" * 32, known={b"c", b"zzz"}),
             _link(peers, "d" * 32, answer=None)]  # d never answers: it knows nothing, as far as this goes
    keys = [b"b", b"", b"c", b"here", b"new"]
    messages = [Message(b"%016d" % i, b"m", 1, 0, 0, None) for i in range(5)]
    started = trio.current_time()
    known = await copies.store("t", messages, keys=keys, expires=77)
    assert known == {b"b", b"c", b"here"}
    assert trio.current_time() - started == pytest.approx(5)  # d was waited for, within the timeout
    asked = Keys("t", [b"b", b"c", b"here", b"new"])
    for link in links:
        assert link.requests[0] == asked
    [holder] = [link for link in links if len(link.requests) == 2]
    add = holder.requests[1]  # after the question: its own keys are not found by it
    assert isinstance(add, Add) and (add.keys, add.expires) == (keys, 77)


async def test_a_publish_without_keys_or_window_and_a_takeover_ask_nothing(autojump_clock):
    copies, peers = _copies()
    link = _link(peers, "b" * 32, known={b"k"})
    assert await copies.store("t", MESSAGES[:1]) == set()
    assert await copies.store("t", MESSAGES[:1], keys=[b"k"], expires=0) == set()  # --dedup-window=0
    assert await copies.store("t", MESSAGES[:1], keys=[b"k"], expires=[9], best_effort=True) == set()
    assert [type(request) for request in link.requests] == [Add, Add, Add]
    assert [request.keys for request in link.requests] == [None, None, [b"k"]]  # a takeover's keys go along


def _states(link: FakeLink) -> list[dict[bytes, tuple[int, int]]]:
    """The UPDATEs posted to ``link`` since the last call, each as id -> (attempts, due)."""
    updates = [request for request in link.posted if isinstance(request, Update)]
    assert all((update.topic, update.channel) == ("t", "c") for update in updates)
    link.posted = [request for request in link.posted if not isinstance(request, Update)]
    return [dict(zip(update.ids, zip(update.attempts, update.dues))) for update in updates]


def _replicated_channel(tmp_path, copies: PeerCopies, *flags: str, topic: str = "t"):
    """A real channel ``topic:c`` whose replication is ``copies``."""
    host = FakeHost(tmp_path, *flags)
    host.core = dataclasses.replace(host.core, copies=copies)
    return host.channel(topic=topic)


async def test_what_a_channel_delivers_and_requeues_is_posted_once_per_interval_in_its_latest_state(
        tmp_path, autojump_clock):
    copies, peers = _copies()
    link = _link(peers, "b" * 32)
    channel = _replicated_channel(tmp_path, copies)
    consumer = FakeSubscriber(rdy=3, msg_timeout=30.0)
    channel.add_client(consumer)
    fast, later, slow = [Message(b"%016d" % i, b"m%d" % i, 1) for i in range(3)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(copies.run_fins)
        nursery.start_soon(copies.confirms.run)
        await trio.sleep(0.05)
        channel.put_many([fast, later, slow])
        await trio.sleep(0.002)  # sent once a majority answered
        channel.finish_many(consumer, [fast.id])  # finished within the interval: its FIN says all
        channel.requeue(consumer, later.id, 60_000)
        due = channel.deferred.get(later.id).due_ns
        await trio.sleep(0.1)
        assert [type(request) for request in link.posted] == [Update, Fin]  # a FIN applied: the UPDATE was too
        assert _states(link) == [{later.id: (1, due)}]
        assert link.posted == [Fin("t", "c", [fast.id])]
        await trio.sleep(0.1)  # still in flight a batch later: its delivery counted
        assert _states(link) == [{slow.id: (1, 0)}]

        await trio.sleep(30)  # the slow one timed out and went out again, in one interval: posted once
        channel.process_timers()
        await trio.sleep(0.1)
        assert consumer.deliveries[-1] == (b"m2", 2)
        assert _states(link) == [{slow.id: (2, 0)}]
        await trio.sleep(1)
        assert _states(link) == []  # nothing changed: nothing posted
        nursery.cancel_scope.cancel()


async def test_a_delivery_finished_within_two_batches_is_never_posted(tmp_path, autojump_clock):
    copies, peers = _copies()
    link = _link(peers, "b" * 32)
    channel = _replicated_channel(tmp_path, copies)
    consumer = FakeSubscriber(rdy=10)
    channel.add_client(consumer)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(copies.run_fins)
        nursery.start_soon(copies.confirms.run)
        await trio.sleep(0.09)
        channel.put_many([Message(b"%016d" % i, b"m", 1) for i in range(3)])
        await trio.sleep(0.05)  # a batch went in between
        channel.finish_many(consumer, [msg.id for msg in consumer.received])
        await trio.sleep(0.5)
        assert _states(link) == [] and [type(request) for request in link.posted] == [Fin]
        nursery.cancel_scope.cancel()


async def test_a_kick_is_posted_with_its_attempts_reset(tmp_path, autojump_clock):
    copies, peers = _copies()
    link = _link(peers, "b" * 32)
    channel = _replicated_channel(tmp_path, copies, "--max-attempts=1")
    consumer = FakeSubscriber(rdy=1)
    channel.add_client(consumer)
    poison = Message(b"p" * 16, b"poison", 1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(copies.run_fins)
        nursery.start_soon(copies.confirms.run)
        channel.put_many([poison])
        channel.requeue(consumer, poison.id, 0)  # its next delivery buries it
        channel.dispatch()
        await trio.sleep(0.15)
        assert len(channel.buried) == 1 and _states(link) == [{poison.id: (1, 0)}]
        channel.remove_client(consumer)
        assert channel.kick(n=1) == 1
        await trio.sleep(0.1)
        assert _states(link) == [{poison.id: (0, 0)}]
        nursery.cancel_scope.cancel()


async def test_a_topic_without_replicas_posts_no_attempts(tmp_path, autojump_clock):
    copies, peers = _copies(replicas=1)  # a node in a cluster, its topics unreplicated by default
    link = _link(peers, "b" * 32)
    copies.configure("kept", 2)
    single = _replicated_channel(tmp_path / "single", copies)
    kept = _replicated_channel(tmp_path / "kept", copies, topic="kept")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(copies.run_fins)
        nursery.start_soon(copies.confirms.run)
        for channel in (single, kept):
            consumer = FakeSubscriber(rdy=1)
            channel.add_client(consumer)
            msg = Message(b"s" * 16, b"m", 1)
            channel.put_many([msg])
            channel.requeue(consumer, msg.id, 0)
        await trio.sleep(0.35)
        assert [(u.topic, u.ids) for u in link.posted if isinstance(u, Update)] == [("kept", [b"s" * 16])]
        nursery.cancel_scope.cancel()
