"""pynsqd registers with nsq 1.3.0's real nsqlookupd as nsqd does.

One nsqlookupd is shared by the module (each test uses its own topic names); the tests that
kill or reconfigure a lookupd start their own.
"""

from __future__ import annotations

import json
import re

import pytest
import trio

from tests.support.fake_lookupd import start_fake_lookupd
from tests.support.http_client import request
from tests.support.nsq_programs import NsqProgram, nsq_bin_missing
from tests.support.waiting import wait_for, wait_until

pytestmark = pytest.mark.skipif(nsq_bin_missing() is not None, reason=nsq_bin_missing() or "")

LOOPBACK = "--broadcast-address=127.0.0.1"


def start_lookupd(tmp_path, name: str = "lookupd", tcp: str = "127.0.0.1:0", http: str = "127.0.0.1:0") -> NsqProgram:
    return NsqProgram("nsqlookupd", tmp_path / f"{name}.log", f"--tcp-address={tcp}", f"--http-address={http}",
                      LOOPBACK).start()


@pytest.fixture(scope="module")
def lookupd(tmp_path_factory):
    program = start_lookupd(tmp_path_factory.mktemp("lookupd"))
    yield program
    program.kill()


async def get_json(address, target: str):
    reply = await request(address, "GET", target)
    assert reply.status == 200, (target, reply.status, reply.body)
    return reply.json()


async def post(address, target: str, body: bytes | None = None) -> None:
    reply = await request(address, "POST", target, body)
    assert reply.status == 200, (target, reply.status, reply.body)


async def producer_topics(lookupd: NsqProgram) -> dict[int, list[str]]:
    """lookupd's ``/nodes``: each producer's TCP port and the topics it registered."""
    nodes = await get_json(lookupd.http, "/nodes")
    return {p["tcp_port"]: sorted(p["topics"]) for p in nodes["producers"]}


async def wait_registered(lookupd: NsqProgram, tcp_port: int, topics: list[str], timeout: float = 10.0) -> None:
    """Return once lookupd lists the node on ``tcp_port`` with exactly ``topics`` (None: not at all)."""
    state: dict = {}

    async def listed() -> bool:
        state["seen"] = (await producer_topics(lookupd)).get(tcp_port)
        return state["seen"] == (sorted(topics) if topics is not None else None)

    try:
        await wait_until(listed, timeout)
    except trio.TooSlowError:
        raise AssertionError(f"lookupd lists {state.get('seen')} for :{tcp_port}, expected {topics}") from None


async def test_lookupd_answers_the_same_for_nsqd_and_pynsqd(lookupd, broker_process, tmp_path):
    nsqd = NsqProgram("nsqd", tmp_path / "nsqd.log", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                      f"--data-path={tmp_path}", f"--lookupd-tcp-address={lookupd.address('TCP')}", LOOPBACK)
    nsqd.start()
    try:
        pynsqd = broker_process(f"--lookupd-tcp-address={lookupd.address('TCP')}", LOOPBACK)
        for node in (nsqd, pynsqd):
            await post(node.http, "/topic/create?topic=same.a")
            await post(node.http, "/channel/create?topic=same.a&channel=c1")
            await post(node.http, "/channel/create?topic=same.a&channel=c2%23ephemeral")
            await post(node.http, "/topic/create?topic=same.b")
        for node in (nsqd, pynsqd):
            await wait_registered(lookupd, node.tcp[1], ["same.a", "same.b"])

        nodes = {p["tcp_port"]: p for p in (await get_json(lookupd.http, "/nodes"))["producers"]}
        theirs, ours = nodes[nsqd.tcp[1]], nodes[pynsqd.tcp[1]]
        assert sorted(ours) == sorted(theirs)
        for key in ("hostname", "broadcast_address", "version"):
            assert ours[key] == theirs[key], key
        # lookupd lists topics in map order; tombstones pair with them
        assert dict(zip(ours["topics"], ours["tombstones"])) == dict(zip(theirs["topics"], theirs["tombstones"]))
        assert ours["http_port"] == pynsqd.http[1]

        lookup = await get_json(lookupd.http, "/lookup?topic=same.a")
        assert sorted(lookup["channels"]) == ["c1", "c2#ephemeral"]  # lookupd answers in map order
        producers = {p["tcp_port"]: p for p in lookup["producers"]}
        assert set(producers) == {nsqd.tcp[1], pynsqd.tcp[1]}
        assert sorted(producers[pynsqd.tcp[1]]) == sorted(producers[nsqd.tcp[1]])
        assert {"same.a", "same.b"} <= set((await get_json(lookupd.http, "/topics"))["topics"])
        assert await get_json(lookupd.http, "/channels?topic=same.b") == {"channels": []}

        # deleting a channel and a topic unregisters them on both, the same way
        for node in (nsqd, pynsqd):
            await post(node.http, "/channel/delete?topic=same.a&channel=c1")
            await post(node.http, "/topic/delete?topic=same.b")
        for node in (nsqd, pynsqd):
            await wait_registered(lookupd, node.tcp[1], ["same.a"])
        assert (await get_json(lookupd.http, "/lookup?topic=same.b"))["producers"] == []
    finally:
        nsqd.kill()


async def test_a_new_topic_gets_the_channels_lookupd_knows_before_its_first_message(lookupd, broker_process, tmp_path):
    first = broker_process(f"--lookupd-tcp-address={lookupd.address('TCP')}", LOOPBACK, data_path=tmp_path / "one")
    await post(first.http, "/topic/create?topic=precreate")
    await post(first.http, "/channel/create?topic=precreate&channel=audit")
    await post(first.http, "/channel/create?topic=precreate&channel=live%23ephemeral")
    await wait_registered(lookupd, first.tcp[1], ["precreate"])
    # the channels' REGISTERs follow the topic's: wait until lookupd lists both
    async def both_listed() -> bool:
        return sorted((await get_json(lookupd.http, "/channels?topic=precreate"))["channels"]) == [
            "audit", "live#ephemeral"]

    await wait_until(both_listed, timeout=10)

    second = broker_process(f"--lookupd-tcp-address={lookupd.address('TCP')}", LOOPBACK, data_path=tmp_path / "two")
    await wait_for(lambda: "peer info" in second.log_text(), timeout=10)
    await post(second.http, "/pub?topic=precreate", b"first")
    stats = await get_json(second.http, "/stats?format=json&topic=precreate")
    channels = {c["channel_name"]: c["depth"] for c in stats["topics"][0]["channels"]}
    assert channels == {"audit": 1}  # the ephemeral one waits for a consumer of its own
    await wait_registered(lookupd, second.tcp[1], ["precreate"])
    lookup = await get_json(lookupd.http, "/lookup?topic=precreate")
    assert len(lookup["producers"]) == 2


async def test_log_and_metrics_show_the_peer(lookupd, broker_process):
    node = broker_process(f"--lookupd-tcp-address={lookupd.address('TCP')}", LOOPBACK)
    await post(node.http, "/topic/create?topic=logged")
    await post(node.http, "/channel/create?topic=logged&channel=c")
    await wait_registered(lookupd, node.tcp[1], ["logged"])
    address = lookupd.address("TCP")
    # the channel is registered after the topic: its line may come a moment later
    await wait_for(lambda: f"INFO: LOOKUPD({address}): channel REGISTER logged c" in node.log_text(), timeout=10)
    log = node.log_text()
    assert f"INFO: LOOKUP({address}): adding peer" in log
    assert (f"INFO: LOOKUPD({address}): peer info {{TCPPort:{lookupd.tcp[1]} HTTPPort:{lookupd.http[1]} "
            "Version:1.3.0 BroadcastAddress:127.0.0.1}") in log
    assert f"INFO: LOOKUPD({address}): topic REGISTER logged" in log
    assert f"INFO: LOOKUPD({address}): channel REGISTER logged c" in log
    metrics = (await request(node.http, "GET", "/metrics")).text
    assert f'nsq_lookupd_connected{{lookupd="{address}"}} 1.0' in metrics


async def test_a_restarted_lookupd_gets_every_topic_and_channel_again(broker_process, tmp_path):
    lookupd = start_lookupd(tmp_path, "first")
    try:
        node = broker_process(f"--lookupd-tcp-address={lookupd.address('TCP')}", LOOPBACK)
        await post(node.http, "/topic/create?topic=kept")
        await post(node.http, "/channel/create?topic=kept&channel=c1")
        await post(node.http, "/topic/create?topic=bare")
        await wait_registered(lookupd, node.tcp[1], ["bare", "kept"])
        tcp, http = lookupd.address("TCP"), lookupd.address("HTTP")
        lookupd.kill()
        lookupd = start_lookupd(tmp_path, "second", tcp, http)
        assert await producer_topics(lookupd) == {}
        # the next command (here a new topic; otherwise the 15 s ping) reconnects and re-registers all;
        # the command itself is not lost
        await post(node.http, "/topic/create?topic=later")
        await wait_registered(lookupd, node.tcp[1], ["bare", "kept", "later"])
        assert (await get_json(lookupd.http, "/channels?topic=kept"))["channels"] == ["c1"]
        metrics = (await request(node.http, "GET", "/metrics")).text
        assert f'nsq_lookupd_connected{{lookupd="{tcp}"}} 1.0' in metrics
    finally:
        lookupd.kill()


async def test_a_lookupd_that_never_answers_does_not_slow_publishing(broker_process):
    silent = trio.socket.socket()
    await silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # connections complete in the backlog and are never read
    address = "%s:%d" % silent.getsockname()
    try:
        node = broker_process(f"--lookupd-tcp-address={address}", LOOPBACK)
        with trio.fail_after(5):
            for n in range(50):
                await post(node.http, f"/pub?topic=silent.{n % 5}", b"x")
        stats = await get_json(node.http, "/stats?format=json")
        assert sum(t["message_count"] for t in stats["topics"]) == 50
        metrics = (await request(node.http, "GET", "/metrics")).text
        assert f'nsq_lookupd_connected{{lookupd="{address}"}} 0.0' in metrics
        await wait_for(lambda: f"ERROR: LOOKUPD({address}): REGISTER silent.0 - i/o timeout" in node.log_text(),
                       timeout=10)
    finally:
        silent.close()


async def test_put_config_adds_and_removes_a_lookupd(lookupd, broker_process, tmp_path):
    other = start_lookupd(tmp_path, "other")
    try:
        node = broker_process(f"--lookupd-tcp-address={lookupd.address('TCP')}", LOOPBACK)
        await post(node.http, "/topic/create?topic=moved")
        await wait_registered(lookupd, node.tcp[1], ["moved"])

        both = json.dumps([lookupd.address("TCP"), other.address("TCP")]).encode()
        reply = await request(node.http, "PUT", "/config/nsqlookupd_tcp_addresses", both)
        assert reply.status == 200 and reply.json() == json.loads(both)
        await wait_registered(other, node.tcp[1], ["moved"])

        only_other = json.dumps([other.address("TCP")]).encode()
        reply = await request(node.http, "PUT", "/config/nsqlookupd_tcp_addresses", only_other)
        assert reply.status == 200
        await wait_registered(lookupd, node.tcp[1], None)
        assert f"INFO: LOOKUP({lookupd.address('TCP')}): removing peer" in node.log_text()
        await post(node.http, "/topic/create?topic=moved.too")
        await wait_registered(other, node.tcp[1], ["moved", "moved.too"])
        assert (await producer_topics(lookupd)).get(node.tcp[1]) is None
        metrics = (await request(node.http, "GET", "/metrics")).text
        assert re.findall(r'nsq_lookupd_connected\{lookupd="([^"]+)"\}', metrics) == [other.address("TCP")]
    finally:
        other.kill()


def _without_pings(conversation: list) -> list:
    return [said for said in conversation if said != b"PING\n"]


async def test_the_v1_conversation_is_nsqds(broker_process, tmp_path, nursery):
    conversations: list[list] = []
    recorder = await start_fake_lookupd(nursery, conversations)
    nsqd = NsqProgram("nsqd", tmp_path / "nsqd.log", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                      f"--data-path={tmp_path}", f"--lookupd-tcp-address={recorder}", LOOPBACK).start()
    try:
        await wait_for(lambda: len(conversations) == 1 and len(conversations[0]) == 2, timeout=10)
        pynsqd = broker_process(f"--lookupd-tcp-address={recorder}", LOOPBACK)
        await wait_for(lambda: len(conversations) == 2 and len(conversations[1]) == 2, timeout=10)
        for node in (nsqd, pynsqd):
            await post(node.http, "/topic/create?topic=spoken")
            await post(node.http, "/channel/create?topic=spoken&channel=c")
            await post(node.http, "/channel/delete?topic=spoken&channel=c")
            await post(node.http, "/topic/delete?topic=spoken")
        # a PING comes every 15 s of each node's clock: on a loaded machine one may come between
        await wait_for(lambda: all(len(_without_pings(c)) >= 6 for c in conversations), timeout=10)
    finally:
        nsqd.kill()
    theirs, ours = (_without_pings(c) for c in conversations)
    assert ours[0] == theirs[0] == b"  V1"
    (_, our_identity), (_, their_identity) = ours[1], theirs[1]
    assert sorted(our_identity) == sorted(their_identity)
    assert our_identity["tcp_port"] == pynsqd.tcp[1] and our_identity["http_port"] == pynsqd.http[1]
    for key in ("broadcast_address", "hostname", "version"):
        assert our_identity[key] == their_identity[key]
    # nsqd unregisters a deleted topic before its channels; either order leaves lookupd the same
    assert ours[2:4] == theirs[2:4] == [b"REGISTER spoken\n", b"REGISTER spoken c\n"]
    assert sorted(ours[4:]) == sorted(theirs[4:]) == [b"UNREGISTER spoken\n", b"UNREGISTER spoken c\n"]
