"""Priorities: channels deliver in (priority, arrival) order, in memory, on disk and across restarts."""

from __future__ import annotations

import struct

import pytest
import trio

from broker.protocol import encode_dpub, encode_fin, encode_mpub, encode_pub, encode_rdy, encode_req
from broker.protocol.priorities import prefix_priority
from tests.support.http_client import create_channel, request
from tests.support.priorities import DEFAULT, expected_order, prioritised_client, publish_prioritised, random_priorities
from tests.support.v2client import connect, consume, consume_new, subscriber
from tests.support.waiting import wait_for

COUNT = 5000
#: Messages waiting on disk when a consumer comes: swept in one go, they held every client
#: of the broker for over a second.
BACKLOG = 1_000_000
#: The worst PUB round trip another client may see while they are swept: a sweep's step takes
#: under a millisecond; the margin is for a busy 2-core machine.
MAX_ROUND_TRIP = 0.5


async def test_identify_offers_priorities_only_to_a_client_that_asks(daemon):
    plain = await connect(daemon.addresses.tcp)
    answer = await plain.identify(feature_negotiation=True)
    assert "priorities" not in answer and "default_priority" not in answer
    await prioritised_client(daemon.addresses.tcp)


async def test_5000_random_priorities_in_memory_with_rdy_1(daemon):
    """Published before the channel exists: its SUB creates it, and the topic hands all over."""
    priorities = random_priorities(1, COUNT)
    await publish_prioritised(daemon.addresses.tcp, "t", priorities)
    assert await consume(daemon, "t", "c", COUNT, rdy=1, quiet=True) == expected_order(priorities)


async def test_5000_random_priorities_mostly_on_disk(start_daemon):
    priorities = random_priorities(2, COUNT)
    async with start_daemon("--mem-queue-size=100") as daemon:
        await create_channel(daemon.addresses.http)
        await publish_prioritised(daemon.addresses.tcp, "t", priorities)
        channel = daemon.broker.topics["t"].channels["c"]
        await wait_for(lambda: channel.depth == COUNT)
        assert channel.backend_depth >= COUNT - 100  # mostly on disk indeed
        # a peek shows the next ones in delivery order, each with its priority
        peek = (await request(daemon.addresses.http, "GET", "/channel/peek?topic=t&channel=c&n=300")).json()
        order = sorted(range(COUNT), key=lambda i: (priorities[i], i))[:300]
        assert [(m["body"], m["priority"]) for m in peek["messages"]] == [("m%d" % i, priorities[i]) for i in order]
        assert await consume(daemon, "t", "c", COUNT, rdy=1, quiet=True) == expected_order(priorities)


async def test_5000_random_priorities_across_a_graceful_restart(start_daemon, tmp_path):
    priorities = random_priorities(3, COUNT)
    async with start_daemon("--mem-queue-size=100") as daemon:
        await create_channel(daemon.addresses.http)
        await publish_prioritised(daemon.addresses.tcp, "t", priorities)
        await wait_for(lambda: daemon.broker.topics["t"].channels["c"].depth == COUNT)
    assert b'"prioritised":true' in (tmp_path / "data" / "nsqd.dat").read_bytes()
    async with start_daemon("--mem-queue-size=100") as daemon:
        assert daemon.broker.topics["t"].ranked
        assert await consume(daemon, "t", "c", COUNT, rdy=1, quiet=True) == expected_order(priorities)


async def test_5000_random_priorities_across_kill_9_with_durable(broker_process):
    priorities = random_priorities(4, COUNT)
    proc = broker_process("--durable", "--mem-queue-size=100")
    await create_channel(proc.http)
    await publish_prioritised(proc.tcp, "t", priorities)
    # some delivered and finished before the crash
    seen: set[bytes] = set()
    first, _ = await consume_new(proc, "t", "c", 10, seen)
    assert first == expected_order(priorities)[:10]
    proc.kill()
    proc.start()
    # delivered again after the crash: those finished since the last commit, at most
    rest, _ = await consume_new(proc, "t", "c", COUNT - 10, seen)
    assert rest == expected_order(priorities)[10:]


async def test_unprioritised_messages_keep_publish_order_and_plain_frames(daemon):
    """A topic that never sees a priority is FIFO (requeues to the tail, as ever); a
    priority equal to the default does not make a topic rank."""
    client = await prioritised_client(daemon.addresses.tcp)
    await client.send(encode_mpub("t", [prefix_priority(DEFAULT, b"a"), prefix_priority(DEFAULT, b"b")]))
    await client.expect_response(b"OK")
    await client.send(encode_pub("t", prefix_priority(DEFAULT, b"c")))
    await client.expect_response(b"OK")
    assert not daemon.broker.topics["t"].ranked
    assert await consume(daemon, "t", "c", 3, rdy=1, quiet=True) == [b"a", b"b", b"c"]


async def test_a_prioritised_consumer_sees_each_priority_before_the_body(daemon):
    client = await prioritised_client(daemon.addresses.tcp)
    await client.send(encode_mpub("t", [prefix_priority(7, b"seven"), prefix_priority(DEFAULT, b"plain")]))
    await client.expect_response(b"OK")
    await client.send(encode_dpub("t", 0, prefix_priority(3, b"three")))
    await client.expect_response(b"OK")
    reader = await subscriber(daemon, "t", "c", rdy=10, feature_negotiation=True, priorities=True)
    got = [m.body for m in await reader.read_messages(3)]
    assert got == [struct.pack(">I", 3) + b"three", struct.pack(">I", 7) + b"seven",
                   struct.pack(">I", DEFAULT) + b"plain"]
    # a plain consumer of another channel gets nsqd's frames
    assert await consume(daemon, "t", "other", 0, rdy=1, quiet=True) == []


async def test_req_timeout_and_deferral_keep_priorities(start_daemon):
    async with start_daemon("--msg-timeout=1s") as daemon:
        address = daemon.addresses.tcp
        await publish_prioritised(address, "t", [50, 10, 30, 20])  # m0..m3
        reader = await subscriber(daemon, "t", "c", rdy=1)
        first = await reader.read_message()
        assert first.body == b"m1"  # priority 10
        await reader.send(encode_req(first.id, 0))  # back at once: still the most urgent
        again = await reader.read_message()
        assert (again.body, again.attempts) == (b"m1", 2)
        await reader.send(encode_fin(again.id))
        nxt = await reader.read_message()
        assert nxt.body == b"m3"  # 20
        # deferred 300 ms: m2 (30) goes first meanwhile, then m3 takes its place before m0 (50)
        await reader.send(encode_req(nxt.id, 300))
        m2 = await reader.read_message()
        assert m2.body == b"m2"
        channel = daemon.broker.topics["t"].channels["c"]
        await wait_for(lambda: not channel.deferred.timers.live())
        # m2 times out (no FIN): it is ready again with priority 30, after m3 (20)
        await reader.send(encode_rdy(0))
        await wait_for(lambda: channel.timeout_count == 1, timeout=10)
        await reader.send(encode_rdy(1))
        assert [(await reader.read_message()).body] == [b"m3"]


async def test_kicked_messages_keep_their_priority(start_daemon):
    async with start_daemon("--max-attempts=1") as daemon:
        address = daemon.addresses.tcp
        await publish_prioritised(address, "t", [40, 5])
        reader = await subscriber(daemon, "t", "c", rdy=1)
        msg = await reader.read_message()
        assert msg.body == b"m1"
        await reader.send(encode_req(msg.id, 0))  # its one attempt used: buried
        channel = daemon.broker.topics["t"].channels["c"]
        await wait_for(lambda: len(channel.buried.messages) == 1)
        other = await reader.read_message()
        assert other.body == b"m0"  # REQ'd and buried too
        await reader.send(encode_req(other.id, 0))
        await wait_for(lambda: len(channel.buried.messages) == 2)
        await reader.send(encode_rdy(0))
        await reader.expect_quiet()
        await publish_prioritised(address, "t", [20], first=2)
        assert (await request(daemon.addresses.http, "POST", "/channel/kick?topic=t&channel=c")).status == 200
        await wait_for(lambda: channel.depth == 3)
        await reader.send(encode_rdy(1))
        got = []
        while len(got) < 3:
            m = await reader.read_message()
            got.append(m.body)
            await reader.send(encode_fin(m.id))
        assert got == [b"m1", b"m2", b"m0"]  # 5, 20, 40


async def test_http_priority_on_pub_mpub_and_deferred_pub(daemon):
    http = daemon.addresses.http
    assert (await request(http, "POST", "/pub?topic=t&priority=9", b"nine")).status == 200
    assert (await request(http, "POST", "/mpub?topic=t&priority=1", b"one-a\none-b")).status == 200
    assert (await request(http, "POST", "/pub?topic=t", b"plain")).status == 200
    assert (await request(http, "POST", "/pub?topic=t&priority=0&defer=100", b"zero-later")).status == 200
    assert (await request(http, "POST", "/pub?topic=t&priority=5", b"five")).status == 200
    for bad in ("-1", "4294967296", "x", "", "1e3"):
        reply = await request(http, "POST", f"/pub?topic=t&priority={bad}", b"bad")
        assert (reply.status, reply.body) == (400, b'{"message":"INVALID_PRIORITY"}'), bad
    reply = await request(http, "POST", "/mpub?topic=t&priority=-2", b"bad")
    assert (reply.status, reply.body) == (400, b'{"message":"INVALID_PRIORITY"}')
    channel_order = await consume(daemon, "t", "c", 6, rdy=1, quiet=True)
    assert channel_order[:5] == [b"one-a", b"one-b", b"five", b"nine", b"plain"] or \
        channel_order == [b"zero-later", b"one-a", b"one-b", b"five", b"nine", b"plain"]
    assert sorted(channel_order) == sorted([b"nine", b"one-a", b"one-b", b"plain", b"zero-later", b"five"])


@pytest.mark.parametrize("payload, error", [
    (encode_pub("t", b"abc"), b"E_BAD_MESSAGE PUB invalid message size 3 (a priority takes 4 bytes)"),
    (encode_pub("t", b"\x00\x00\x00\x01"), b"E_BAD_MESSAGE PUB invalid message body size 0"),
    (encode_mpub("t", [prefix_priority(1, b"ok"), b"\x00\x00\x00\x02"]), b"E_BAD_MESSAGE MPUB invalid message(1) body size 0"),
    (encode_dpub("t", 10, b"ab"), b"E_BAD_MESSAGE DPUB invalid message size 2 (a priority takes 4 bytes)"),
    # sizes on the wire count the priority
    (encode_pub("t", prefix_priority(1, b"x" * 101)), b"E_BAD_MESSAGE PUB message too big 105 > 104"),
    (encode_mpub("t", [prefix_priority(1, b"x" * 101)]), b"E_BAD_MESSAGE MPUB message too big 105 > 104"),
])
async def test_bad_prioritised_messages_get_fatal_errors(start_daemon, payload, error):
    async with start_daemon("--max-msg-size=100") as daemon:
        client = await prioritised_client(daemon.addresses.tcp)
        # the body may be --max-msg-size long, its priority besides
        await client.send(encode_pub("t", prefix_priority(1, b"x" * 100)))
        await client.expect_response(b"OK")
        await client.send(payload)
        await client.expect_error(error)
        assert daemon.broker.topics["t"].message_count == 1


async def test_stats_and_metrics_show_ready_messages_per_priority(daemon):
    http = daemon.addresses.http
    await create_channel(http)
    await publish_prioritised(daemon.addresses.tcp, "t", [3, 3, 1, DEFAULT, 7])
    channel = daemon.broker.topics["t"].channels["c"]
    await wait_for(lambda: channel.depth == 5)
    stats = (await request(http, "GET", "/stats?format=json&topic=t")).json()
    [ch] = stats["topics"][0]["channels"]
    assert ch["priorities"] == [{"priority": 1, "depth": 1}, {"priority": 3, "depth": 2},
                                {"priority": 7, "depth": 1}, {"priority": DEFAULT, "depth": 1}]
    text = (await request(http, "GET", "/metrics")).body.decode()
    assert 'nsq_channel_priority_depth{channel="c",priority="3",topic="t"} 2.0' in text
    # a topic without priorities keeps nsqd's /stats shape
    await request(http, "POST", "/pub?topic=plain", b"x")
    await request(http, "POST", "/channel/create?topic=plain&channel=c")
    stats = (await request(http, "GET", "/stats?format=json&topic=plain")).json()
    assert "priorities" not in stats["topics"][0]["channels"][0]


async def test_with_rdy_n_at_most_n_go_ahead_of_a_more_urgent_message(daemon):
    """What broker/protocol/README.md promises: a consumer with RDY n holds at most n messages in flight, so
    at most n go out ahead of a more urgent message published after them."""
    await publish_prioritised(daemon.addresses.tcp, "t", [50] * 20)  # m0..m19
    reader = await subscriber(daemon, "t", "c", rdy=5)
    ahead = await reader.read_messages(5)
    assert [m.body for m in ahead] == [b"m%d" % i for i in range(5)]
    await publish_prioritised(daemon.addresses.tcp, "t", [1], first=20)
    await reader.expect_quiet()  # its window is full
    await reader.send(encode_fin(ahead[0].id))
    assert (await reader.read_message()).body == b"m20"
    await reader.send(encode_fin(ahead[1].id))
    assert (await reader.read_message()).body == b"m5"


async def test_a_stream_of_urgent_messages_starves_a_less_urgent_one(daemon):
    """The starvation broker/protocol/README.md describes (there is no aging): while more urgent messages keep
    coming, a less urgent one waits; it goes out once they stop."""
    address = daemon.addresses.tcp
    await publish_prioritised(address, "t", [100])  # m0, the patient one
    await publish_prioritised(address, "t", [1], first=1)
    reader = await subscriber(daemon, "t", "c", rdy=1)
    for i in range(1, 31):
        msg = await reader.read_message()
        assert msg.body == b"m%d" % i
        await publish_prioritised(address, "t", [1], first=i + 1)  # the next urgent one, before the FIN
        await reader.send(encode_fin(msg.id))
    last = await reader.read_message()
    assert last.body == b"m31"
    await reader.send(encode_fin(last.id))
    assert (await reader.read_message()).body == b"m0"


async def test_an_ephemeral_channel_past_its_memory_drops_the_least_urgent(start_daemon):
    async with start_daemon("--mem-queue-size=3") as daemon:
        reader = await subscriber(daemon, "t", "c#ephemeral", rdy=0)
        await publish_prioritised(daemon.addresses.tcp, "t", [5, 9, 1, 7, 3])
        channel = daemon.broker.topics["t"].channels["c#ephemeral"]
        await wait_for(lambda: channel.put_count == 5)
        await reader.send(encode_rdy(10))
        assert [m.body for m in await reader.read_messages(3)] == [b"m2", b"m4", b"m0"]  # 1, 3, 5
        await reader.expect_quiet()


async def test_stats_text_lists_priorities_of_a_prioritised_channel_only(daemon):
    http = daemon.addresses.http
    await create_channel(http)
    await create_channel(http, "plain")
    await publish_prioritised(daemon.addresses.tcp, "t", [4, 4, 2])
    await wait_for(lambda: daemon.broker.topics["t"].channels["c"].depth == 3)
    text = (await request(http, "GET", "/stats")).body.decode()
    [line] = [ln for ln in text.splitlines() if "[c " in ln and "priorities" in ln]
    assert line.endswith(" priorities: 2=1 4=2")
    assert sum("priorities" in ln for ln in text.splitlines()) == 1


@pytest.mark.parametrize("flags", [(), ("--durable",)], ids=["spilling", "durable"])
async def test_a_disk_that_refuses_a_sweep_loses_nothing(start_daemon, flags):
    """The channel's disk fills while its consumer drains a backlog, so sweeps cannot write
    back what they read: those messages stay in memory and every message is still delivered
    once. (Each phase's consumer leaves the message sent after its last FIN in flight: it
    times out and comes again to the next.)"""
    import errno

    from tests.support.diskfaults import FaultyDisk

    priorities = random_priorities(5, 600)
    disk = FaultyDisk(lambda name: name.startswith("t:c."))
    with disk.installed():
        async with start_daemon("--mem-queue-size=20", "--msg-timeout=1s", *flags) as daemon:
            await create_channel(daemon.addresses.http)
            await publish_prioritised(daemon.addresses.tcp, "t", priorities)
            channel = daemon.broker.topics["t"].channels["c"]
            await wait_for(lambda: channel.depth == 600)
            seen: set[bytes] = set()
            got, _ = await consume_new(daemon, "t", "c", 50, seen)
            disk.fail(errno.ENOSPC)
            got += (await consume_new(daemon, "t", "c", 200, seen))[0]
            assert disk.refused > 0
            disk.fail(None)
            got += (await consume_new(daemon, "t", "c", 350, seen))[0]
    assert sorted(got) == sorted(b"m%d" % i for i in range(600))  # each once, none lost
    assert got[:50] == expected_order(priorities)[:50]


@pytest.mark.slow
async def test_a_sweep_of_a_large_backlog_keeps_every_other_client_answered(start_daemon):
    """A consumer comes to a backlog of a million on ten levels past a memory of 1,000: each sweep
    reads all of it. Meanwhile another client's PUBs are answered within milliseconds, and the
    consumer gets the most urgent messages in order."""
    async with start_daemon("--mem-queue-size=1000") as daemon:
        await create_channel(daemon.addresses.http)
        await publish_prioritised(daemon.addresses.tcp, "t", [i % 10 for i in range(BACKLOG)], batch=2000)
        channel = daemon.broker.topics["t"].channels["c"]
        await wait_for(lambda: channel.depth == BACKLOG, timeout=60)
        prober = await connect(daemon.addresses.tcp)
        trips: list[float] = []
        got: list[bytes] = []

        async def probe(stop: trio.CancelScope) -> None:
            with stop:
                while True:
                    trips.append(await prober.timed_pub("probe", b"p"))

        async with trio.open_nursery() as nursery:
            stop = trio.CancelScope()
            nursery.start_soon(probe, stop)
            reader = await subscriber(daemon, "t", "c", rdy=500)
            reader.timeout = 60
            while len(got) < 2000:  # memory's 1,000, then what a sweep brings
                msg = await reader.read_message()
                got.append(msg.body)
                await reader.send(encode_fin(msg.id))
            stop.cancel()
        assert got == [b"m%d" % i for i in range(0, 20000, 10)]  # priority 0, by arrival
        assert trips and max(trips) < MAX_ROUND_TRIP, (len(trips), max(trips))
