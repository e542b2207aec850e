"""A refused publish whose holders may have its copies (broker/replication/refused.py), on
Trio's mock clock: the origin learns from each holder's HELLO whether it took them over, or
has them dropped; and a holder answers HELLO only once its takeover of the asker ended
(broker/replication/holder.py with broker/replication/takeover.py), so that answer is whole."""

from __future__ import annotations

import time

import msgpack
import pytest
import trio

from broker.replication.held import HeldCopies
from broker.replication.holder import Holder
from broker.replication.links import Waiter
from broker.replication.refused import RETRY, SETTLE_WAITS, RefusedPublishes
from broker.replication.takeover import Takeover
from broker.replication.wire import Drop, Hello, encode_request, pack, pack_entries
from tests.unit.test_replication_takeover import ME, ORIGIN, FakeBroker, FakeCopies, RecordingPeers, _messages

TIMEOUT = 2.0
IDS = [b"%016d" % i for i in range(3)]


class FakeLink:
    """A holder's link: up or not, and the requests sent on it, each answered by the test."""

    def __init__(self, connected: bool):
        self.connected = connected
        self.requests: list[tuple[Drop, Waiter]] = []

    def request(self, req, size=0, *, inline=False) -> Waiter:
        waiter = Waiter()
        if not self.connected:
            waiter.settle("not connected")
        else:
            self.requests.append((req, waiter))
        return waiter


class Majority:
    def __init__(self, reached: bool):
        self.reached = trio.Event()
        if reached:
            self.reached.set()

    def has(self) -> bool:
        return self.reached.is_set()

    async def wait(self) -> None:
        await self.reached.wait()

    def lose(self) -> None:
        self.reached = trio.Event()


def _refusals(majority: Majority) -> RefusedPublishes:
    return RefusedPublishes(majority.has, majority.wait, TIMEOUT)


async def _settling(nursery, refused: RefusedPublishes, links) -> list:
    outcome: list = []

    async def settle():
        outcome.append(await refused.settle("t", IDS, links))
        outcome.append(trio.current_time())

    nursery.start_soon(settle)
    await trio.testing.wait_all_tasks_blocked()
    return outcome


async def test_a_refusal_waits_for_a_majority_then_learns_from_the_holders_hello_that_it_took_them(autojump_clock):
    majority = Majority(False)
    refused = RefusedPublishes(majority.has, majority.wait, TIMEOUT)
    link = FakeLink(connected=False)  # its answer was lost with the connection
    async with trio.open_nursery() as nursery:
        outcome = await _settling(nursery, refused, [link])
        await trio.sleep(60)
        assert outcome == []  # a minority: the holder may be taking them over
        majority.reached.set()
        await trio.sleep(1)
        refused.taken("u", IDS)  # another topic's
        refused.taken("t", IDS[:1])  # (a part)
        await trio.sleep(1)
        assert outcome == []
        refused.taken("t", IDS)  # the HELLO answered on the new connection says all
        link.connected = True
    assert outcome[0] is True  # delivered there: the publish is acknowledged
    assert link.requests == []


async def test_a_refusal_has_its_holders_drop_the_copies_when_none_took_them(autojump_clock):
    refused = _refusals(Majority(True))
    links = [FakeLink(connected=True), FakeLink(connected=True)]
    async with trio.open_nursery() as nursery:
        outcome = await _settling(nursery, refused, links)
        for link in links:
            [(request, waiter)] = link.requests
            assert (request.topic, request.ids) == ("t", IDS)
        links[0].requests[0][1].settle(None)
        await trio.testing.wait_all_tasks_blocked()
        assert outcome == []  # one holder has not dropped them yet
        links[1].requests[0][1].settle(None)
    assert outcome[0] is False


async def test_a_drop_lost_with_its_connection_is_settled_by_the_next_hello(autojump_clock):
    refused = _refusals(Majority(True))
    link = FakeLink(connected=True)
    async with trio.open_nursery() as nursery:
        outcome = await _settling(nursery, refused, [link])
        link.connected = False
        link.requests[0][1].settle("connection lost")
        await trio.sleep(1)
        assert outcome == []
        refused.taken("t", IDS)  # taken over while this node was away: the next HELLO says so
        link.connected = True
    assert outcome[0] is True


async def test_a_holder_whose_disk_refuses_the_drop_is_asked_again_at_a_steady_pace(autojump_clock):
    refused = _refusals(Majority(True))
    link = FakeLink(connected=True)
    async with trio.open_nursery() as nursery:
        outcome = await _settling(nursery, refused, [link])
        for asked in range(1, 4):
            link.requests[-1][1].settle("storing failed: no space left on device")
            await trio.sleep(RETRY / 2)
            assert len(link.requests) == asked and outcome == []  # not asked again before RETRY
            await trio.sleep(RETRY)
        link.requests[-1][1].settle(None)
    assert outcome[0] is False
    assert len(link.requests) == 4


async def test_a_holder_not_back_within_the_settle_wait_is_given_up_on(autojump_clock):
    refused = _refusals(Majority(True))
    link = FakeLink(connected=False)
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        outcome = await _settling(nursery, refused, [link])
    assert outcome[0] is False
    assert outcome[1] - start == pytest.approx(SETTLE_WAITS * TIMEOUT, abs=0.02)
    refused.taken("t", IDS)  # a HELLO after the refusal: nothing is remembered of it
    assert refused._taken == set() and refused._settling == {}


class BlockingBroker(FakeBroker):
    def __init__(self):
        super().__init__()
        self.queued = trio.Event()
        self.release = trio.Event()

    async def put_taken(self, topic, channels, messages):
        self.queued.set()
        await self.release.wait()
        await super().put_taken(topic, channels, messages)


async def _holder_and_takeover(tmp_path) -> tuple[Holder, Takeover, BlockingBroker, RecordingPeers]:
    held = await HeldCopies.open(tmp_path, durable=False, max_record=1 << 20)
    broker, peers = BlockingBroker(), RecordingPeers()
    takeover = Takeover(broker, ME, peers, FakeCopies(), held)
    holder = Holder(broker.options, peers, b"", lambda node: trio.sleep(0), lambda node: None,
                    lambda topic, keys: [], takeover.under_way)
    holder.node_id, holder.held = ME, held
    messages = _messages(3)
    held.add(ORIGIN, "t", [ORIGIN, ME], [m.id for m in messages], pack_entries(messages, published=True))
    return holder, takeover, broker, peers


async def test_a_hello_during_a_takeover_of_its_sender_is_answered_with_what_it_took(tmp_path, autojump_clock):
    holder, takeover, broker, peers = await _holder_and_takeover(tmp_path)
    hello = pack([1, [encode_request(Hello())]])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(takeover.take_over, ORIGIN, takeover.mine(ORIGIN))
        await broker.queued.wait()  # past the last look at whether the origin is back
        peers.opened(ORIGIN, type("Connection", (), {"last_read": time.monotonic()})())
        answer = holder.receive(ORIGIN, hello)
        assert not isinstance(answer, bytes)  # it waits for the takeover's end
        answered: list = []

        async def wait_answer():
            answered.append(msgpack.unpackb(await answer, raw=False))

        nursery.start_soon(wait_answer)
        await trio.sleep(1)
        assert answered == []
        broker.release.set()
    [(seq, error, [mine, _everything, _holding])] = answered
    assert (seq, error) == (1, None)
    assert sorted(mine["t"]) == [m.id for m in _messages(3)]  # the origin skips them, or settles its refusal
    assert takeover.under_way(ORIGIN) is None
    again = holder.receive(ORIGIN, hello)
    assert isinstance(again, bytes)  # no takeover under way: answered at once
    assert holder.held is not None
    await holder.held.close()


async def test_a_takeover_stopped_by_its_origin_coming_back_leaves_the_hello_saying_nothing_taken(tmp_path,
                                                                                                 autojump_clock):
    holder, takeover, broker, peers = await _holder_and_takeover(tmp_path)
    stored = trio.Event()
    store = takeover._copies.store

    async def slow_store(*args, **kwargs):
        stored.set()
        await trio.sleep(TIMEOUT)  # the copies' answers
        return await store(*args, **kwargs)

    takeover._copies.store = slow_store  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(takeover.take_over, ORIGIN, takeover.mine(ORIGIN))
        await stored.wait()
        peers.opened(ORIGIN, type("Connection", (), {"last_read": time.monotonic()})())
        answer = holder.receive(ORIGIN, pack([1, [encode_request(Hello())]]))
        assert not isinstance(answer, bytes)
        _seq, _error, [mine, _everything, _holding] = msgpack.unpackb(await answer, raw=False)
    assert mine == {}
    assert broker.taken == []  # the origin delivers them itself
    assert any(isinstance(request, Drop) for request in peers.posted)  # the copies just stored are dropped
    assert holder.held is not None
    await holder.held.close()


async def test_a_majority_lost_while_settling_starts_the_wait_for_the_holders_again(autojump_clock):
    # a refusal can begin before the node noticed it lost its majority: it gives up on a holder
    # only after a whole wait with a majority, which a holder taking it over would break
    majority = Majority(True)
    refused = _refusals(majority)
    link = FakeLink(connected=False)
    async with trio.open_nursery() as nursery:
        outcome = await _settling(nursery, refused, [link])
        await trio.sleep(0.5)
        majority.lose()
        await trio.sleep(60)
        assert outcome == []
        majority.reached.set()
        regained = trio.current_time()
    assert outcome[0] is False
    assert outcome[1] - regained == pytest.approx(SETTLE_WAITS * TIMEOUT, abs=0.02)
