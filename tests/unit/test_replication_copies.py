"""The sending side (broker/replication/copies.py) on Trio's mock clock: a publish waits for its
copies and for peers to hold them, within --replica-timeout; too few are refused and the copies
taken back; each topic's copies go to the same peers."""

from __future__ import annotations

import pytest
import trio

from broker.config.options import parse_args
from broker.core.host import CopiesRefused
from broker.core.message import Message
from broker.replication.copies import UNKNOWN, PeerCopies
from broker.replication.links import Waiter
from broker.replication.peers import Peers
from broker.replication.wire import Add, Drop

ME = "a" * 32


class FakeLink:
    """A link to node ``peer_id`` that answers each request as ``answer`` says (None: never)."""

    def __init__(self, peer_id: str, answer: str | None = "ok"):
        self.peer_id = peer_id
        self.connected = True
        self.answer = answer
        self.requests: list = []
        self.posted: list = []

    def request(self, request, size=0, *, inline=False) -> Waiter:
        self.requests.append(request)
        waiter = Waiter()
        if self.answer is not None:
            waiter.settle(None if self.answer == "ok" else self.answer)
        return waiter

    async def flush(self) -> None:
        await trio.lowlevel.checkpoint()

    def post(self, request, size=0) -> None:
        self.posted.append(request)


def _copies(replicas: int = 2) -> tuple[PeerCopies, Peers]:
    peers = Peers()
    copies = PeerCopies(parse_args([f"--replicas={replicas}", "--replica-timeout=5s"]), peers, lambda t: 0, dict)
    copies.node_id = ME
    return copies, peers


def _link(peers: Peers, node: str, answer: str | None = "ok") -> FakeLink:
    link = FakeLink(node, answer)
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
        copies.finished("t", "c", [Message(b"1" * 16, b"x", 1)])
        copies.finished("t", "c", [Message(b"2" * 16, b"y", 1)])
        await trio.sleep(0.15)
        nursery.cancel_scope.cancel()
    for link in links:
        [fin] = link.posted
        assert (fin.topic, fin.channel, fin.ids) == ("t", "c", [b"1" * 16, b"2" * 16])
