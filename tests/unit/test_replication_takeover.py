"""The takeover's decisions (broker/replication/takeover.py) on Trio's mock clock: when a node is
gone, which holder takes each copy, and what the taker queues, stores, records and tells.
The copies come from a real log (broker/replication/held.py) in a temporary directory; the
broker, the sending side and the other nodes are fakes that record what they are asked."""

from __future__ import annotations

import time
from collections import defaultdict

import pytest
import trio

from broker.config.options import parse_args
from broker.core.guid import GuidFactory
from broker.core.message import Message
from broker.replication.copies import ReplicaStats
from broker.replication.fence import ClockFence
from broker.replication.held import HeldCopies
from broker.replication.links import Waiter
from broker.replication.members import Members
from broker.replication.peers import Peers
from broker.replication.quorum import Quorum
from broker.replication.takeover import Takeover
from broker.replication.wire import Drop, Taken, pack_entries

ME, ORIGIN, OTHER, THIRD = "a" * 32, "b" * 32, "c" * 32, "d" * 32


class FakeBroker:
    def __init__(self, *flags: str):
        self.options = parse_args(["--replicas=2", "--replica-timeout=5s", *flags])
        self.guid = GuidFactory(7)
        self.taken: list[tuple[str, list[str], list[tuple[Message, list[str] | None]]]] = []

    async def put_taken(self, topic, channels, messages):
        self.taken.append((topic, channels, messages))


class FakeCopies:
    def __init__(self):
        self.stats = defaultdict(ReplicaStats)
        self.stored: list[tuple[str, list[Message], list, bool]] = []
        self.requeued_states: list[tuple[str, str, bytes, int, int]] = []
        self.keys: list[tuple[list[bytes] | None, int | list[int]]] = []

    async def store(self, topic, messages, dones=None, *, best_effort=False, keys=None, expires=0):
        self.stored.append((topic, messages, dones, best_effort))
        self.keys.append((keys, expires))
        return set()

    def requeued(self, topic, channel, messages):
        self.requeued_states.extend((topic, channel, m.id, m.attempts, m.due_ns) for m in messages)


class RecordingPeers(Peers):
    def __init__(self):
        super().__init__()
        self.posted: list = []

    def post(self, request, size=0):
        self.posted.append(request)

    def ask(self, request, size=0):
        self.posted.append(request)  # told: no link answers here
        return []


def _messages(n: int, start: int = 0, due_ns: int = 0) -> list[Message]:
    return [Message(b"%016d" % i, b"body %d" % i, 1_000 + i, i % 3, due_ns, None) for i in range(start, start + n)]


async def _takeover(tmp_path, *flags: str) -> tuple[Takeover, HeldCopies, FakeBroker, FakeCopies, RecordingPeers]:
    held = await HeldCopies.open(tmp_path, durable=False, max_record=1 << 20)
    broker, copies, peers = FakeBroker(*flags), FakeCopies(), RecordingPeers()
    return Takeover(broker, ME, peers, copies, held), held, broker, copies, peers


async def test_a_node_is_gone_once_unreachable_for_the_replica_timeout_from_the_last_bytes_heard(tmp_path,
                                                                                                 autojump_clock):
    takeover, held, *_ , peers = await _takeover(tmp_path)
    held.add(ORIGIN, "t", [ORIGIN, ME], [m.id for m in _messages(1)], pack_entries(_messages(1)))
    connection = object()
    peers.opened(ORIGIN, connection)
    assert takeover.gone(trio.current_time()) == []  # reachable
    await trio.sleep(10)
    peers.closed(ORIGIN, connection, last_heard=trio.current_time() - 3)  # silent for 3 s before it closed
    assert takeover.gone(trio.current_time()) == []
    await trio.sleep(1.9)
    assert takeover.gone(trio.current_time()) == []  # 4.9 s of silence
    await trio.sleep(0.2)
    assert takeover.gone(trio.current_time()) == [ORIGIN]
    peers.opened(ORIGIN, connection)  # it came back
    assert takeover.gone(trio.current_time()) == [] and ORIGIN not in takeover.gone_since
    await held.close()


async def test_the_first_holder_up_takes_each_copy_in_the_origins_order(tmp_path):
    takeover, held, *_ , peers = await _takeover(tmp_path)
    first, second = _messages(1), _messages(1, start=1)
    held.add(ORIGIN, "t", [ORIGIN, OTHER, ME], [m.id for m in first], pack_entries(first))
    held.add(ORIGIN, "t", [ORIGIN, ME, OTHER], [m.id for m in second], pack_entries(second))
    peers.opened(OTHER, object())
    assert takeover.mine(ORIGIN) == {"t": {second[0].id}}  # OTHER is up and first for the other copy
    assert takeover.first_up((ORIGIN, OTHER, ME), ORIGIN) == OTHER
    peers.closed(OTHER, next(iter(peers._inbound[OTHER])), 0.0)
    assert takeover.mine(ORIGIN) == {"t": {first[0].id, second[0].id}}  # OTHER down: both are mine
    assert takeover.first_up((ORIGIN, THIRD), ORIGIN) is None  # nobody up
    await held.close()


async def test_a_takeover_queues_what_no_channel_finished_with_new_ids_and_tells_the_others(tmp_path):
    takeover, held, broker, copies, peers = await _takeover(tmp_path)
    messages = _messages(3, due_ns=5_000)
    held.set_channels(ORIGIN, "t", ["c1", "c2"])
    held.add(ORIGIN, "t", [ORIGIN, ME], [m.id for m in messages], pack_entries(messages))
    held.finish(ORIGIN, "t", "c1", [messages[1].id])
    held.finish(ORIGIN, "t", "c1", [messages[2].id])
    held.finish(ORIGIN, "t", "c2", [messages[2].id])  # both channels: dropped already
    await takeover.take_over(ORIGIN, takeover.mine(ORIGIN))

    [(topic, channels, queued)] = broker.taken
    assert (topic, channels) == ("t", ["c1", "c2"])
    by_body = {msg.body: (msg, only) for msg, only in queued}
    assert sorted(by_body) == [b"body 0", b"body 1"]
    fresh, only = by_body[b"body 0"]
    assert only is None and fresh.id != messages[0].id  # every channel, under an id of this node
    assert (fresh.timestamp, fresh.attempts, fresh.due_ns) == (messages[0].timestamp, messages[0].attempts, 5_000)
    assert by_body[b"body 1"][1] == ["c2"]  # only the channel that had not finished it
    [(_, stored, dones, best_effort)] = copies.stored
    assert best_effort and [m.body for m in stored] == [b"body 0", b"body 1"] and dones == [None, ["c1"]]
    assert held.taken == {ORIGIN: {"t": {messages[0].id, messages[1].id}}}
    assert held.copies(ORIGIN, "t") is not None and not len(held.copies(ORIGIN, "t"))
    assert peers.posted == [Taken(ORIGIN, "t", [messages[0].id, messages[1].id])]
    assert copies.stats["t"].takeovers == 2
    await held.close()


async def test_an_origin_back_while_its_copies_are_stored_keeps_its_messages(tmp_path):
    # it reaches this node again: its HELLO may have been answered before the takeover was
    # recorded, so it delivers them itself, and this node queues nothing and keeps its copies
    takeover, held, broker, copies, peers = await _takeover(tmp_path)
    messages = _messages(2)
    held.add(ORIGIN, "t", [ORIGIN, ME], [m.id for m in messages], pack_entries(messages))
    mine = takeover.mine(ORIGIN)
    stored = copies.store

    async def store_while_it_returns(topic, new, dones=None, *, best_effort=False, keys=None, expires=0):
        await stored(topic, new, dones, best_effort=best_effort, keys=keys, expires=expires)
        peers.opened(ORIGIN, object())
        return set()

    copies.store = store_while_it_returns
    await takeover.take_over(ORIGIN, mine)
    assert broker.taken == [] and held.taken == {}
    assert takeover.mine(ORIGIN) == {"t": {m.id for m in messages}}  # still held for it
    [(_, new, _, _)] = copies.stored
    assert peers.posted == [Drop("t", [m.id for m in new])]  # the copies just stored elsewhere go
    await takeover.take_over(ORIGIN, takeover.mine(ORIGIN))  # reachable: nothing happens
    assert broker.taken == [] and len(copies.stored) == 1
    # one that came back after a crash without --durable asks for a takeover: it happens
    await takeover.take_over(ORIGIN, takeover.mine(ORIGIN), gone=False)
    assert [msg.body for _, _, queued in broker.taken for msg, _ in queued] == [b"body 0", b"body 1"]
    await held.close()


async def test_copies_missing_from_the_log_are_counted_lost_and_not_taken_again(tmp_path):
    takeover, held, broker, *_ = await _takeover(tmp_path)
    kept = _messages(1)
    held.add(ORIGIN, "t", [ORIGIN, ME], [kept[0].id, b"x" * 16], pack_entries(kept + _messages(1, start=9)))
    # the second copy's record is there, its entry says another id: as a damaged log would
    held.origins[ORIGIN]["t"].holders[b"y" * 16] = (ORIGIN, ME)
    await takeover.take_over(ORIGIN, takeover.mine(ORIGIN))
    assert [msg.body for _, _, queued in broker.taken for msg, _ in queued] == [b"body 0"]
    assert held.copies_lost == 2 and not takeover.mine(ORIGIN)
    await held.close()


async def test_one_topics_failed_takeover_does_not_hold_up_anothers(tmp_path):
    takeover, held, broker, copies, _ = await _takeover(tmp_path)
    for topic in ("bad", "good"):
        messages = _messages(2)
        held.add(ORIGIN, topic, [ORIGIN, ME], [m.id for m in messages], pack_entries(messages))

    async def refusing(topic, channels, messages):
        if topic == "bad":
            raise OSError("the disk refuses the topic's queue")
        broker.taken.append((topic, channels, messages))

    broker.put_taken = refusing
    await takeover.take_over(ORIGIN, takeover.mine(ORIGIN))
    assert [topic for topic, _, _ in broker.taken] == ["good"]
    assert takeover.mine(ORIGIN) == {"bad": {m.id for m in _messages(2)}}  # tried again at the next tick
    assert copies.stats["bad"].takeover_failures == 1
    await held.close()


@pytest.mark.parametrize("starting, armed, minority, doubt, stale, holds", [
    (True, False, False, False, False, True), (False, True, False, False, False, True),
    (False, False, True, False, False, True), (False, False, False, True, False, True),
    (False, False, False, False, True, True), (False, False, False, False, False, False)])
def test_the_fence_holds_from_the_start_while_asking_in_a_minority_without_answers_and_after_a_stall(
        starting, armed, minority, doubt, stale, holds):
    fence = ClockFence(limit=1.0, replicated=lambda topic: topic != "single")
    fence.starting, fence.armed, fence.minority, fence.doubt = starting, armed, minority, doubt
    if stale:
        fence.last_tick -= 2.0  # the clock task last ran two seconds ago: the process was stopped
    assert fence.holds("t") is holds
    assert fence.holds("single") is False  # a topic with one replica: nobody else delivers it


async def test_a_takeover_queues_each_channel_its_message_as_it_stood_there(tmp_path):
    takeover, held, broker, copies, _ = await _takeover(tmp_path)
    messages = [Message(b"%016d" % i, b"body %d" % i, 1_000 + i, 0, 0, None) for i in range(4)]
    plain, split, finished_by_one, alike = (m.id for m in messages)
    held.set_channels(ORIGIN, "t", ["c1", "c2", "c3"])
    held.add(ORIGIN, "t", [ORIGIN, ME], [m.id for m in messages], pack_entries(messages, published=True))
    held.update(ORIGIN, "t", "c1", [split, finished_by_one, alike], [2, 3, 1], [0, 9_000, 0])
    held.update(ORIGIN, "t", "c2", [split, finished_by_one, alike], [2, 1, 1], [0, 0, 0])
    held.update(ORIGIN, "t", "c3", [alike], [1], [0])
    held.finish(ORIGIN, "t", "c2", [finished_by_one])
    await takeover.take_over(ORIGIN, takeover.mine(ORIGIN))

    [(_, channels, queued)] = broker.taken
    assert channels == ["c1", "c2", "c3"]
    got = sorted((msg.body, msg.attempts, msg.due_ns, tuple(only) if only is not None else None) for msg, only in queued)
    assert got == [
        (b"body 0", 0, 0, None),  # no channel said anything: as its entry, through the topic
        (b"body 1", 0, 0, ("c3",)),  # c3 as its entry, c1 and c2 their own copy
        (b"body 1", 2, 0, ("c1", "c2")),
        (b"body 2", 0, 0, ("c3",)),  # c2 finished it
        (b"body 2", 3, 9_000, ("c1",)),
        (b"body 3", 1, 0, None),  # every channel stood alike: one message through the topic
    ]
    assert len({msg.id for msg, _ in queued if msg.body == b"body 1"}) == 1  # one new id for a message
    # the taker's peers get each message once, with the state of its first channels, and the others' states
    [(_, stored, dones, _)] = copies.stored
    assert [(m.body, m.attempts, m.due_ns) for m in stored] == [(b"body 0", 0, 0), (b"body 1", 2, 0),
                                                                   (b"body 2", 3, 9_000), (b"body 3", 1, 0)]
    assert dones == [None, None, ["c2"], None]
    new_id = {m.body: m.id for m in stored}
    assert sorted(copies.requeued_states) == [("t", "c3", new_id[b"body 1"], 0, 0), ("t", "c3", new_id[b"body 2"], 0, 0)]
    assert copies.stats["t"].takeovers == 4
    await held.close()


async def test_without_the_origins_channels_a_takeover_queues_messages_as_their_entries(tmp_path):
    takeover, held, broker, copies, _ = await _takeover(tmp_path)
    messages = _messages(1)
    held.add(ORIGIN, "t", [ORIGIN, ME], [m.id for m in messages], pack_entries(messages))
    held.update(ORIGIN, "t", "c1", [messages[0].id], [4], [9_000])
    await takeover.take_over(ORIGIN, takeover.mine(ORIGIN))
    [(_, _, [(msg, only)])] = broker.taken
    assert (msg.attempts, msg.due_ns, only) == (0, 0, None) and copies.requeued_states == []
    await held.close()


async def test_publish_keys_go_with_the_new_copies_and_stay_known_here_after_a_takeover(tmp_path):
    takeover, held, broker, copies, _ = await _takeover(tmp_path)
    messages = _messages(3)
    window_end = time.time_ns() + 3600 * 10**9
    held.add(ORIGIN, "t", [ORIGIN, ME], [m.id for m in messages], pack_entries(messages), None,
             [b"k0", b"", b"k2"], window_end)
    await takeover.take_over(ORIGIN, takeover.mine(ORIGIN))

    [(_, stored, _, _)] = copies.stored
    assert [m.body for m in stored] == [b"body 0", b"body 1", b"body 2"]
    assert copies.keys == [([b"k0", b"", b"k2"], [window_end, 0, window_end])]
    assert held.known("t", [b"k0", b"k2", b"other"], time.time_ns()) == [b"k0", b"k2"]  # a retry here is a duplicate
    await held.close()


class _Inbound:
    """A proven connection from a node, as the TCP server's client is to the replication."""

    def __init__(self) -> None:
        self.last_read = trio.current_time()


async def test_a_node_hears_from_no_majority_once_most_members_fell_silent_on_connections_still_open(
        tmp_path, autojump_clock):
    # a partition that drops packets: the connections stay open until their heartbeats give up,
    # and the majority may take over as soon as theirs do; the silence shows before that
    members = Members(tmp_path, ME)
    members.proven(ORIGIN, "127.0.0.3:4150")
    members.proven(OTHER, "127.0.0.4:4150")
    peers = Peers()
    quorum = Quorum(members, peers, timeout=2.0)
    first, second = _Inbound(), _Inbound()
    peers.opened(ORIGIN, first)
    peers.opened(OTHER, second)
    await trio.sleep(10)
    first.last_read = trio.current_time() - 0.5
    second.last_read = trio.current_time() - 4.0
    assert quorum.tick() == 0.0 and quorum.has_majority()  # both connections are open
    assert quorum.silent() == pytest.approx(0.5)  # this node and ORIGIN: a majority, heard 0.5 s ago
    first.last_read = trio.current_time() - 3.0
    assert quorum.tick() == 0.0  # still open
    assert quorum.silent() == pytest.approx(3.0)  # no majority heard for 3 s
    peers.closed(ORIGIN, first, first.last_read)
    peers.closed(OTHER, second, second.last_read)
    await trio.sleep(1)
    assert not quorum.members.majority(quorum.reachable())
    assert quorum.silent() == pytest.approx(4.0)  # closed connections count from their last bytes


class AnsweringLink:
    """A connected link to ``peer_id`` whose answers the test gives."""

    def __init__(self, peer_id: str):
        self.peer_id = peer_id
        self.connected = True
        self.posted: list = []

    def post(self, request, size=0):
        self.posted.append(request)


async def test_a_takeover_is_known_to_a_majority_before_any_of_its_messages_is_queued(tmp_path, autojump_clock):
    held = await HeldCopies.open(tmp_path, durable=False, max_record=1 << 20)
    broker, copies, peers = FakeBroker(), FakeCopies(), RecordingPeers()
    other, third = AnsweringLink(OTHER), AnsweringLink(THIRD)
    asked: list[tuple[AnsweringLink, Waiter]] = []

    def ask(request, size=0):
        peers.posted.append(request)
        asked.extend((link, Waiter()) for link in (other, third))
        return list(asked)

    peers.ask = ask  # type: ignore[method-assign]
    members = Members(tmp_path, ME)
    for node in (ORIGIN, OTHER, THIRD):
        members.proven(node, f"127.0.0.{len(members.nodes) + 2}:4150")
    takeover = Takeover(broker, ME, peers, copies, held, members.majority)  # 4 members: 3 make a majority
    messages = _messages(2)
    held.add(ORIGIN, "t", [ORIGIN, ME], [m.id for m in messages], pack_entries(messages))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(takeover.take_over, ORIGIN, takeover.mine(ORIGIN))
        await trio.sleep(0.5)
        assert isinstance(peers.posted[-1], Taken) and broker.taken == []
        asked[0][1].settle(None)  # this node and one more: 2 of 4
        await trio.sleep(0.5)
        assert broker.taken == []
        asked[1][1].settle("connection lost")  # its answer lost: told again once it is back
        await trio.sleep(0.5)
        assert broker.taken == []
    # no majority within --replica-timeout: the takeover goes on (it had been decided by a majority)
    [(topic, _channels, queued)] = broker.taken
    assert third.posted == [peers.posted[-1]] and other.posted == []
    assert topic == "t" and len(queued) == 2
    await held.close()


async def test_a_takeover_told_by_a_majority_at_once_queues_without_waiting(tmp_path, autojump_clock):
    held = await HeldCopies.open(tmp_path, durable=False, max_record=1 << 20)
    broker, copies, peers = FakeBroker(), FakeCopies(), RecordingPeers()
    members = Members(tmp_path, ME)
    members.proven(OTHER, "127.0.0.3:4150")
    link = AnsweringLink(OTHER)

    def ask(request, size=0):
        waiter = Waiter()
        waiter.settle(None)
        return [(link, waiter)]

    peers.ask = ask  # type: ignore[method-assign]
    takeover = Takeover(broker, ME, peers, copies, held, members.majority)
    held.add(ORIGIN, "t", [ORIGIN, ME], [m.id for m in _messages(1)], pack_entries(_messages(1)))
    started = trio.current_time()
    await takeover.take_over(ORIGIN, takeover.mine(ORIGIN))
    assert trio.current_time() == started and len(broker.taken) == 1
    await held.close()
