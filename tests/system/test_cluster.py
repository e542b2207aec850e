"""A cluster on loopback: two of nsq's nsqlookupd, three pynsqd registered with both, and
consumers that know only the lookupds (pynsq, gnsq), nsqadmin, and a real nsqd joining in.

The lookupds and the three nodes are shared by the module; each test uses its own topic.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import trio

from tests.support.http_client import request
from tests.support.interop import GNSQ, PYNSQ, assert_no_errors, of_kind, start_client
from tests.support.nsq_programs import NsqProgram, nsq_bin_missing
from tests.support.processes import BrokerProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.skipif(nsq_bin_missing() is not None, reason=nsq_bin_missing() or "")

LOOPBACK = "--broadcast-address=127.0.0.1"
#: How often the consumers ask the lookupds for producers, in seconds.
POLL = 1


class Cluster:
    """Two lookupds and the pynsqd nodes registered with both."""

    def __init__(self, root: Path):
        self.root = root
        self.lookupds = [
            NsqProgram("nsqlookupd", root / f"lookupd{n}.log", "--tcp-address=127.0.0.1:0",
                       "--http-address=127.0.0.1:0", LOOPBACK).start()
            for n in range(2)
        ]
        self.nodes: list[BrokerProcess] = []
        self.others: list[NsqProgram] = []

    def lookupd_flags(self) -> list[str]:
        return [f"--lookupd-tcp-address={lookupd.address('TCP')}" for lookupd in self.lookupds]

    def lookupd_http(self) -> list[str]:
        return [lookupd.address("HTTP") for lookupd in self.lookupds]

    def add_node(self) -> BrokerProcess:
        n = len(self.nodes)
        node = BrokerProcess(self.root / f"node{n}", *self.lookupd_flags(), LOOPBACK, f"--node-id={100 + n}",
                             log_path=self.root / f"node{n}.log")
        self.nodes.append(node)
        return node.start()

    def add_nsqd(self) -> NsqProgram:
        data = self.root / f"nsqd{len(self.others)}"
        data.mkdir()
        nsqd = NsqProgram("nsqd", self.root / f"{data.name}.log", "--tcp-address=127.0.0.1:0",
                          "--http-address=127.0.0.1:0", f"--data-path={data}", *self.lookupd_flags(), LOOPBACK,
                          "--node-id=900")
        self.others.append(nsqd)
        return nsqd.start()

    def stop(self) -> None:
        for program in [*self.nodes, *self.others, *self.lookupds]:
            program.kill()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        for _ in range(3):
            cluster.add_node()
        yield cluster
    finally:
        cluster.stop()


async def call(address, method: str, target: str, body: bytes | None = None):
    reply = await request(address, method, target, body)
    assert reply.status == 200, (method, target, reply.status, reply.body)
    return reply.json() if reply.body.startswith((b"{", b"[")) else reply.text


async def producers(lookupd: NsqProgram, topic: str) -> set[int]:
    """The TCP ports lookupd hands to a consumer of ``topic``."""
    reply = await request(lookupd.http, "GET", f"/lookup?topic={topic}")
    if reply.status == 404:
        return set()
    return {p["tcp_port"] for p in reply.json()["producers"]}


async def wait_producers(cluster: Cluster, topic: str, ports: set[int], timeout: float = 10.0) -> None:
    """Return once every lookupd hands out exactly ``ports`` for ``topic``."""

    async def all_hand_out_ports() -> bool:
        return all([await producers(lookupd, topic) == ports for lookupd in cluster.lookupds])

    await wait_until(all_hand_out_ports, timeout)


async def publish(node, topic: str, bodies: list[str]) -> None:
    await call(node.http, "POST", f"/mpub?topic={topic}", "\n".join(bodies).encode())


def bodies_by_channel(events: list[dict]) -> dict[str, Counter]:
    delivered: dict[str, Counter] = {}
    for event in of_kind(events, "message"):
        delivered.setdefault(event["channel"], Counter())[event["body"]] += 1
    return delivered


def consume(cluster: Cluster, topic: str, channel: str, expect: int) -> dict:
    return {"lookupd_http": cluster.lookupd_http(), "lookupd_poll_interval": POLL, "topic": topic,
            "channels": [channel], "expect": expect, "max_in_flight": 20, "linger": 0.5, "deadline": 40}


async def test_lookupd_only_consumers_get_every_message_of_every_node_once_per_channel(cluster, tmp_path):
    first = cluster.nodes[0]
    await call(first.http, "POST", "/topic/create?topic=orders")
    for channel in ("pynsq", "gnsq"):
        await call(first.http, "POST", f"/channel/create?topic=orders&channel={channel}")
    # the other nodes create the topic on their first publish, with the channels lookupd knows
    sent = []
    for n, node in enumerate(cluster.nodes):
        bodies = [f"node{n}-{i}" for i in range(30)]
        await publish(node, "orders", bodies)
        sent += bodies
    await wait_producers(cluster, "orders", {node.tcp[1] for node in cluster.nodes})

    with trio.fail_after(60):
        async with start_client(PYNSQ, "consume", consume(cluster, "orders", "pynsq", len(sent)),
                                log_dir=tmp_path) as pynsq, \
                start_client(GNSQ, "consume", consume(cluster, "orders", "gnsq", len(sent)),
                             log_dir=tmp_path) as gnsq:
            events = await pynsq.result() + await gnsq.result()
    assert_no_errors(events)
    assert bodies_by_channel(events) == {"pynsq": Counter(sent), "gnsq": Counter(sent)}
    for node in cluster.nodes:
        stats = await call(node.http, "GET", "/stats?format=json&topic=orders")
        assert {c["channel_name"]: c["depth"] for c in stats["topics"][0]["channels"]} == {"pynsq": 0, "gnsq": 0}


async def test_a_node_started_later_is_discovered_and_a_stopped_one_dropped(cluster, tmp_path):
    first = cluster.nodes[0]
    await call(first.http, "POST", "/topic/create?topic=late")
    await call(first.http, "POST", "/channel/create?topic=late&channel=c")
    await publish(first, "late", ["early-0", "early-1"])
    with trio.fail_after(60):
        async with start_client(PYNSQ, "consume", consume(cluster, "late", "c", 4), log_dir=tmp_path) as reader:
            await reader.wait_for("message", 2)
            late = cluster.add_node()
            await publish(late, "late", ["late-0", "late-1"])
            events = await reader.result()
    assert_no_errors(events)
    assert bodies_by_channel(events) == {"c": Counter(["early-0", "early-1", "late-0", "late-1"])}

    await wait_producers(cluster, "late", {first.tcp[1], late.tcp[1]})
    assert late.terminate() == 0
    await wait_producers(cluster, "late", {first.tcp[1]})
    for lookupd in cluster.lookupds:
        nodes = await call(lookupd.http, "GET", "/nodes")
        assert late.tcp[1] not in {p["tcp_port"] for p in nodes["producers"]}


async def test_nsqadmin_lists_every_node_topic_and_channel_with_depths(cluster, tmp_path):
    for n, node in enumerate(cluster.nodes[:3]):  # a node added by another test may be stopped
        await call(node.http, "POST", "/topic/create?topic=admin")
        await call(node.http, "POST", "/channel/create?topic=admin&channel=watch")
        await publish(node, "admin", [f"n{n}-{i}" for i in range(n + 1)])  # depths 1, 2, 3
    ports = {node.tcp[1] for node in cluster.nodes[:3]}
    await wait_producers(cluster, "admin", ports)
    admin = NsqProgram("nsqadmin", tmp_path / "nsqadmin.log", "--http-address=127.0.0.1:0",
                       *[f"--lookupd-http-address={a}" for a in cluster.lookupd_http()], expect=("HTTP",)).start()
    try:
        nodes = await call(admin.http, "GET", "/api/nodes")
        listed = {n["tcp_port"] for n in nodes["nodes"]}
        assert ports <= listed
        assert not nodes.get("message")
        topics = await call(admin.http, "GET", "/api/topics")
        assert "admin" in topics["topics"]
        topic = await call(admin.http, "GET", "/api/topics/admin")
        # the topic's own queue is empty: its messages went to the channel
        assert (topic["depth"], topic["message_count"]) == (0, 6)
        per_node = {f"127.0.0.1:{node.http[1]}": i + 1 for i, node in enumerate(cluster.nodes[:3])}
        assert {n["node"]: n["message_count"] for n in topic["nodes"]} == per_node
        channel = await call(admin.http, "GET", "/api/topics/admin/watch")
        assert channel["depth"] == 6
        assert {n["node"]: n["depth"] for n in channel["nodes"]} == per_node
    finally:
        admin.kill()


async def test_a_real_nsqd_joins_and_clients_cannot_tell_the_difference(cluster, tmp_path):
    nsqd = cluster.add_nsqd()
    mixed = [nsqd, *cluster.nodes[:2]]
    await call(nsqd.http, "POST", "/topic/create?topic=mixed")
    await call(nsqd.http, "POST", "/channel/create?topic=mixed&channel=c")
    sent = []
    for n, node in enumerate(mixed):
        bodies = [f"mixed{n}-{i}" for i in range(20)]
        await publish(node, "mixed", bodies)
        sent += bodies
    await wait_producers(cluster, "mixed", {node.tcp[1] for node in mixed})

    lookup = await call(cluster.lookupds[0].http, "GET", "/lookup?topic=mixed")
    assert lookup["channels"] == ["c"]
    shapes = {p["tcp_port"]: (tuple(sorted(p)), p["version"], p["broadcast_address"], p["hostname"])
              for p in lookup["producers"]}
    assert len(set(shapes.values())) == 1, shapes

    with trio.fail_after(60):
        async with start_client(GNSQ, "consume", consume(cluster, "mixed", "c", len(sent)), log_dir=tmp_path) as gnsq:
            events = await gnsq.result()
    assert_no_errors(events)
    assert bodies_by_channel(events) == {"c": Counter(sent)}

    # tombstoning the topic of one node through lookupd, then deleting it there, as nsqadmin does
    for node in (nsqd, cluster.nodes[1]):
        for lookupd in cluster.lookupds:
            await call(lookupd.http, "POST", f"/topic/tombstone?topic=mixed&node=127.0.0.1:{node.http[1]}")
    await wait_producers(cluster, "mixed", {cluster.nodes[0].tcp[1]})
    tombstoned = {}
    for lookupd in cluster.lookupds:
        for p in (await call(lookupd.http, "GET", "/nodes"))["producers"]:
            if "mixed" in p["topics"]:
                tombstoned[(lookupd.address("HTTP"), p["tcp_port"])] = dict(zip(p["topics"], p["tombstones"]))["mixed"]
    for lookupd in cluster.lookupds:
        assert tombstoned[(lookupd.address("HTTP"), nsqd.tcp[1])] is True
        assert tombstoned[(lookupd.address("HTTP"), cluster.nodes[1].tcp[1])] is True
        assert tombstoned[(lookupd.address("HTTP"), cluster.nodes[0].tcp[1])] is False
    for node in (nsqd, cluster.nodes[1]):
        await call(node.http, "POST", "/topic/delete?topic=mixed")

    async def gone_from_nodes() -> bool:
        for lookupd in cluster.lookupds:
            for p in (await call(lookupd.http, "GET", "/nodes"))["producers"]:
                if p["tcp_port"] in (nsqd.tcp[1], cluster.nodes[1].tcp[1]) and "mixed" in p["topics"]:
                    return False
        return True

    await wait_until(gone_from_nodes, timeout=10)
    await wait_producers(cluster, "mixed", {cluster.nodes[0].tcp[1]})
