"""Replication across real network partitions between nodes, while every client reaches every node.

Real processes: nsq's ``nsqlookupd`` and ``pynsqd --replicas=2 --durable --replica-timeout=2s``
nodes, each on a loopback address of its own (``ReplicaCluster(own_ips=True)``) so that
iptables can separate the nodes (:mod:`tests.support.partitions`: ``cut``, ``blackhole``,
``slow``) while publishers and consumers on 127.0.0.1 still reach all of them.

Three nodes: the node that acknowledged a backlog nobody has read yet is isolated from the
other two for three replica timeouts, while publishers keep publishing to every node and
two consumers of the channel read and FIN: one connected to the isolated node alone, one
following nsqlookupd (it reaches every node). The consumers start reading once the majority
has taken the isolated node's messages over, or (``at_partition``) the moment the partition
begins, before any node can know of it: the isolated node must not deliver its backlog then
either, since its peers cannot hear of the FINs. Then the partition heals and everything
settles. Counted over both consumers:

- no acknowledged message is lost;
- no message is delivered both by the isolated node and by another node;
- duplicates stay under 1 % of the deliveries;
- no publish answered with an error is ever delivered;
- the isolated node holds delivery while it is in the minority: its channel's depth stays,
  nothing in flight, while a consumer is connected to it and ready.

A ``slow`` partition (each packet :data:`SLOW_DELAY` = 3 s late, each way) is a blackhole to the
links: 3 s is past their 2.5 s of silence and their 2 s to dial, so they drop and cannot come
back while it lasts, the majority takes over and the isolated node must hold, as with
``blackhole``; the packets that arrive late find their connections closed.

Two nodes: a node alone is no majority, so neither takes the other's messages over, and
both hold delivery until the other is back; then every message is delivered once, by its own node.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field

import pytest
import trio

from tests.support.nsq_programs import nsq_bin_missing
from tests.support.partitions import SLOW_DELAY, Partition, PartitionRefused, partitions_missing
from tests.support.replication_cluster import DISCONNECTED, Consumer, Deliveries, Node, ReplicaCluster, pub, publish_all
from tests.support.v2client import V2Client, connect
from tests.support.waiting import wait_for, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.skipif(nsq_bin_missing() is not None, reason=nsq_bin_missing() or "")]

TOPIC, CHANNEL = "orders", "work"
TIMEOUT = "2s"  # --replica-timeout
TIMEOUT_S = 2.0
#: how long the partition lasts
PARTITION_S = 3 * TIMEOUT_S
BACKLOG = 300
#: the longest a publish may wait for its answer: one refused while a holder may have stored its
#: copies is answered once the node reaches a majority again, after the partition
PUB_TIMEOUT = PARTITION_S + 4 * SLOW_DELAY + 20
#: what a node logs when it reaches no majority of the cluster's members
NO_MAJORITY = "no majority"
#: what a node logs when its replicated topics start holding delivery, having heard from no majority
HOLDING = ": its replicated topics hold delivery"


@pytest.fixture
def clusters(tmp_path):
    """Factory: a started :class:`ReplicaCluster`, each node on its own address; stopped at the end."""
    made: list[ReplicaCluster] = []

    def factory(nodes: int) -> ReplicaCluster:
        cluster = ReplicaCluster(tmp_path / f"cluster{len(made)}", nodes, replicas=2, replica_timeout=TIMEOUT,
                                 durable=True, own_ips=True)
        made.append(cluster)
        return cluster.start()

    yield factory
    for cluster in made:
        cluster.stop()


@pytest.fixture
def partitions():
    """Factory: a :class:`Partition` (not applied yet; the test skips when the machine cannot make
    one); every one is removed at the end, whatever happened."""
    made: list[Partition] = []

    def factory(kind: str, side: list[Node], other: list[Node]) -> Partition:
        missing = partitions_missing(kind)
        if missing is not None:
            pytest.skip(missing)
        partition = Partition(kind, side, other)
        made.append(partition)
        return partition

    yield factory
    problems = []
    for partition in made:
        try:
            partition.remove()
        except PartitionRefused as exc:  # the others are removed all the same
            problems.append(str(exc))
    assert not problems, problems


@dataclass
class Answers:
    """What the publishers were told, body by body."""

    acked: dict[bytes, float] = field(default_factory=dict)
    #: body -> the error frame's text
    refused: dict[bytes, str] = field(default_factory=dict)
    #: bodies whose connection broke (or stayed silent) before an answer: either may be true
    unconfirmed: set[bytes] = field(default_factory=set)


async def keep_publishing(node: Node, prefix: str, answers: Answers, stop: trio.Event) -> None:
    """PUB new bodies to ``node``, one at a time, each answer noted, until ``stop``."""
    client: V2Client | None = None
    count = 0
    try:
        while not stop.is_set():
            if client is None:
                try:
                    client = await connect(node.tcp, timeout=5)
                except DISCONNECTED:
                    await trio.sleep(0.1)  # the pace of reconnecting
                    continue
            body = f"{prefix}-{count}".encode()
            count += 1
            try:
                answer = await pub(client, TOPIC, body, timeout=PUB_TIMEOUT)
            except DISCONNECTED:
                answers.unconfirmed.add(body)
                with trio.CancelScope(shield=True):
                    await client.aclose()
                client = None
                continue
            if answer == "OK":
                answers.acked[body] = trio.current_time()
            else:
                answers.refused[body] = answer
            await trio.sleep(0.02)  # the publishing rate
    finally:
        if client is not None:
            with trio.CancelScope(shield=True):
                await client.aclose()


async def ready(cluster: ReplicaCluster) -> None:
    """The topic and its channel on every node, registered with nsqlookupd, and every node linked to every other."""
    await cluster.create(TOPIC, [CHANNEL])
    await cluster.wait_registered(TOPIC, cluster.nodes)
    await cluster.wait_replicating()
    await cluster.wait_linked()


async def channel_counts(node: Node) -> tuple[int, int] | None:
    """(depth, in flight) of the channel on ``node``; None when it does not answer or has no channel."""
    stats = await node.stats(TOPIC)
    for topic in (stats or {}).get("topics") or []:
        for channel in topic["channels"]:
            if channel["channel_name"] == CHANNEL:
                return channel["depth"], channel["in_flight_count"]
    return None


async def takeovers(nodes: list[Node]) -> int:
    """The messages of the topic ``nodes`` took over, in all."""
    total = 0
    for node in nodes:
        stats = await node.stats(TOPIC)
        for topic in (stats or {}).get("topics") or []:
            total += topic.get("replication", {}).get("takeovers", 0)
    return total


async def settle(cluster: ReplicaCluster, deliveries: Deliveries, answers: Answers, consumers: list[Consumer],
                 timeout: float = 45.0) -> None:
    """Return once every acknowledged body was delivered and every node's channel is empty, with
    every consumer connected again to every node (nothing left anywhere to deliver)."""

    async def settled() -> bool:
        if deliveries.missing(answers.acked):
            return False
        if not all(c.connected_to(node) for c in consumers for node in cluster.nodes
                   if c.lookupd_http is not None or node.tcp in c.addresses):
            return False
        return all([await channel_counts(node) == (0, 0) for node in cluster.nodes])

    try:
        await wait_until(settled, timeout, poll=0.2)
    except trio.TooSlowError:
        missing = deliveries.missing(answers.acked)
        counts = {node.name: await channel_counts(node) for node in cluster.nodes}
        raise AssertionError(f"not settled in {timeout} s: {len(missing)} acknowledged never delivered "
                             f"(first {missing[:5]}), channels {counts}, deliveries by node "
                             f"{dict(deliveries.by_node)}\n{cluster.logs(40)}") from None


def assert_alive(cluster: ReplicaCluster) -> None:
    crashed = cluster.crashed()
    assert not crashed, f"nodes exited by themselves: {crashed}\n{cluster.logs(60)}"


def delivered_by(deliveries: Deliveries, node: Node, since: float, until: float) -> list[bytes]:
    """The bodies ``node`` delivered between ``since`` and ``until``."""
    return [body for body in deliveries.first
            if any(at == node.address and since <= when <= until for when, at in deliveries.deliveries_of(body))]


@pytest.mark.deadline(150)
@pytest.mark.parametrize("kind", ["cut", "blackhole", "slow"])
@pytest.mark.parametrize("release", ["after_takeover", "at_partition"])
async def test_an_isolated_node_holds_while_the_majority_takes_its_messages_over(kind, release, clusters, partitions):
    cluster = clusters(3)
    isolated, majority = cluster.nodes[0], cluster.nodes[1:]
    await ready(cluster)
    backlog = [f"backlog-{n}".encode() for n in range(BACKLOG)]
    await publish_all(isolated, TOPIC, backlog)
    answers = Answers(acked={body: trio.current_time() for body in backlog})
    partition = partitions(kind, [isolated], majority)

    deliveries = Deliveries()
    direct = Consumer(TOPIC, CHANNEL, addresses=[isolated.tcp], deliveries=deliveries)
    follower = Consumer(TOPIC, CHANNEL, lookupd_http=cluster.lookupd.http, deliveries=deliveries)
    samples: list[tuple[float, tuple[int, int] | None]] = []
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        for consumer in (direct, follower):
            await consumer.hold()  # the backlog stays unread until the majority has taken it over
            await nursery.start(consumer.run)
        async with trio.open_nursery() as publishers:
            for node in cluster.nodes:
                for n in range(3 if node is isolated else 1):
                    publishers.start_soon(keep_publishing, node, f"{node.name}.{n}", answers, stop)
            with trio.fail_after(15):
                while not (direct.connected_to(isolated) and all(follower.connected_to(n) for n in cluster.nodes)):
                    await trio.sleep(0.05)

            partition.apply()
            began = trio.current_time()
            if release == "at_partition":  # ready for the backlog before any node can know of the partition
                for consumer in (direct, follower):
                    await consumer.release()
            # the majority takes the backlog over, once a majority agrees the isolated node is gone
            try:
                await wait_until(lambda: _at_least(takeovers(majority), BACKLOG), PARTITION_S, poll=0.1)
            except trio.TooSlowError:
                raise AssertionError(f"{kind}: the majority took over {await takeovers(majority)} of the "
                                     f"{BACKLOG} messages of the isolated node within {PARTITION_S} s\n"
                                     f"{cluster.logs(40)}") from None
            taken_at = trio.current_time()
            if release == "after_takeover":
                for consumer in (direct, follower):
                    await consumer.release()
            # the partition's length is the experiment's parameter; meanwhile the isolated node's channel is watched
            while trio.current_time() < began + PARTITION_S:
                samples.append((trio.current_time(), await channel_counts(isolated)))
                await trio.sleep(0.2)
            partition.remove()
            healed = trio.current_time()
            stop.set()  # each publisher ends once its publish in progress is answered
        await settle(cluster, deliveries, answers, [direct, follower])
        nursery.cancel_scope.cancel()

    assert_alive(cluster)
    lost = deliveries.missing(answers.acked)
    both = deliveries.delivered_by_both([isolated.address])
    both_during = deliveries.delivered_by_both([isolated.address], began, healed)
    refused_delivered = sorted(set(answers.refused) & set(deliveries.first))
    held_deliveries = delivered_by(deliveries, isolated, taken_at if release == "after_takeover" else began, healed)
    depths = {counts for _, counts in samples}
    ratio = deliveries.extra / deliveries.total
    print(f"{kind}: taken over {taken_at - began:.2f} s after the partition; {len(answers.acked)} acknowledged, "
          f"{len(answers.refused)} refused, {len(answers.unconfirmed)} unanswered, {deliveries.total} deliveries, "
          f"{deliveries.extra} duplicates ({ratio:.2%}), by node {dict(deliveries.by_node)}; delivered by both "
          f"sides {len(both)} ({len(both_during)} during the partition); isolated node's channel while held "
          f"{sorted(depths, key=str)}; refusals {sorted(set(answers.refused.values()))[:4]}")
    assert not lost, f"{kind}: {len(lost)} acknowledged never delivered: {lost[:10]}\n{cluster.logs(40)}"
    assert not both, (f"{kind}: {len(both)} delivered both by the isolated node and by another: "
                      f"{[(b, deliveries.deliveries_of(b)) for b in both[:5]]}\n{cluster.logs(40)}")
    assert not refused_delivered, (f"{kind}: {len(refused_delivered)} publishes answered with an error were "
                                   f"delivered: {[(b, answers.refused[b]) for b in refused_delivered[:5]]}")
    assert not held_deliveries, (f"{kind}: the isolated node delivered {len(held_deliveries)} after the majority "
                                 f"had taken its messages over: {held_deliveries[:5]}\n{cluster.logs(40)}")
    assert isolated.log_lines(NO_MAJORITY), f"{kind}: the isolated node never said it lacked a majority"
    if kind != "cut":
        # a packet 3 s late each way is past the links' 2.5 s of silence and their 2 s to dial: the
        # nodes see each other as through a blackhole, and the packets that come late change nothing
        silent = [line for line in isolated.log_lines("silent for") if "REPLICATION(" in line]
        assert len(silent) >= 2, f"{kind}: the isolated node's links to both peers fell silent: {silent}"
    assert len(samples) >= 3 and len(depths) == 1, f"{kind}: the isolated node's channel moved: {samples}"
    ((depth, in_flight),) = depths
    assert depth >= BACKLOG and in_flight == 0, f"{kind}: the isolated node's channel {depth, in_flight}"
    assert ratio < 0.01, f"{kind}: {deliveries.extra} of {deliveries.total} deliveries were duplicates"
    names = tuple(node.name.encode() + b"." for node in majority)
    assert any(body.startswith(names) and began <= at <= healed for body, at in answers.acked.items()), \
        f"{kind}: the majority acknowledged nothing while partitioned"


async def _connect_time(source: str, destination: tuple[str, int], limit: float) -> float | str:
    """Seconds a connection from ``source`` to ``destination`` took to open (and answer one byte
    back), or why it did not within ``limit`` seconds."""
    sock = trio.socket.socket()
    began = time.monotonic()
    try:
        await sock.bind((source, 0))
        with trio.fail_after(limit):
            await sock.connect(destination)
            await sock.send(b"x")
            assert await sock.recv(1) == b"x"
        return time.monotonic() - began
    except OSError as exc:
        return type(exc).__name__
    except trio.TooSlowError:
        return "no answer"
    finally:
        sock.close()


async def _echo(listener, task_status=trio.TASK_STATUS_IGNORED) -> None:
    task_status.started()
    async with trio.open_nursery() as nursery:
        while True:
            conn, _ = await listener.accept()

            async def serve(conn=conn) -> None:
                with conn:
                    while data := await conn.recv(100):
                        await conn.send(data)

            nursery.start_soon(serve)


@pytest.mark.parametrize("kind", ["cut", "blackhole", "slow"])
async def test_a_partition_separates_node_addresses_alone_and_leaves_no_rule_behind(kind, partitions):
    listeners = {}
    async with trio.open_nursery() as nursery:
        for ip in ("127.0.0.2", "127.0.0.3"):
            listener = trio.socket.socket()
            await listener.bind((ip, 0))
            listener.listen()
            listeners[ip] = listener.getsockname()
            await nursery.start(_echo, listener)
        a, b = listeners["127.0.0.2"], listeners["127.0.0.3"]
        assert isinstance(await _connect_time("127.0.0.2", b, 5), float)

        partition = partitions(kind, ["127.0.0.2"], ["127.0.0.3"]).apply()
        chain = partition.chain
        assert chain in subprocess.run(["iptables", "-S"], capture_output=True, text=True, check=True).stdout
        across = [await _connect_time("127.0.0.2", b, 6 * SLOW_DELAY), await _connect_time("127.0.0.3", a, 2.0)]
        # clients (127.0.0.1) still reach both sides at once
        clients = [await _connect_time("127.0.0.1", address, 2.0) for address in (a, b)]
        partition.remove()
        after = [await _connect_time("127.0.0.2", b, 2.0), await _connect_time("127.0.0.3", a, 2.0)]
        nursery.cancel_scope.cancel()
    print(kind, "across", across, "clients", clients, "after", after)
    if kind == "cut":
        assert across == ["ConnectionRefusedError", "ConnectionRefusedError"], across
    elif kind == "blackhole":
        assert across == ["no answer", "no answer"], across
    else:  # 3 s for the SYN, 3 s for its answer, 6 s for the byte and its echo
        assert isinstance(across[0], float) and across[0] >= 4 * SLOW_DELAY - 0.5, across
        assert across[1] == "no answer", across
    assert all(isinstance(t, float) and t < 1.0 for t in clients + after), (clients, after)
    assert chain not in subprocess.run(["iptables", "-S"], capture_output=True, text=True, check=True).stdout


async def _at_least(count, least: int) -> bool:
    return await count >= least


@pytest.mark.deadline(150)
async def test_two_nodes_apart_take_nothing_over_and_hold_delivery_until_healed(clusters, partitions):
    cluster = clusters(2)
    first, second = cluster.nodes
    await ready(cluster)
    backlogs = {node.name: [f"{node.name}-backlog-{n}".encode() for n in range(BACKLOG // 2)] for node in cluster.nodes}
    for node in cluster.nodes:
        await publish_all(node, TOPIC, backlogs[node.name])
    answers = Answers(acked={body: trio.current_time() for items in backlogs.values() for body in items})
    partition = partitions("cut", [first], [second])

    deliveries = Deliveries()
    consumers = [Consumer(TOPIC, CHANNEL, addresses=[node.tcp], deliveries=deliveries) for node in cluster.nodes]
    samples: list[dict[str, tuple[int, int] | None]] = []
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        for consumer in consumers:
            await consumer.hold()
            await nursery.start(consumer.run)
        async with trio.open_nursery() as publishers:
            for node in cluster.nodes:
                publishers.start_soon(keep_publishing, node, node.name, answers, stop)
            with trio.fail_after(15):
                while not all(c.connected_to(node) for c, node in zip(consumers, cluster.nodes)):
                    await trio.sleep(0.05)

            holding_before = {node.name: len(node.log_lines(HOLDING)) for node in cluster.nodes}
            partition.apply()
            began = trio.current_time()
            # each node says its replicated topics hold delivery (it has heard from no majority for
            # longer than its fence waits); a publish whose copy may have reached the other node is
            # answered only once the partition heals, the others are refused meanwhile
            await wait_for(lambda: all(len(node.log_lines(HOLDING)) > holding_before[node.name]
                                       for node in cluster.nodes), PARTITION_S, poll=0.1)
            held_from = trio.current_time()
            for consumer in consumers:
                await consumer.release()
            # apart for three replica timeouts, and for two at least while the consumers are ready
            while trio.current_time() < max(began + PARTITION_S, held_from + 2 * TIMEOUT_S):
                samples.append({node.name: await channel_counts(node) for node in cluster.nodes})
                await trio.sleep(0.2)
            taken = await takeovers(cluster.nodes)
            partition.remove()
            healed = trio.current_time()
            stop.set()
        await settle(cluster, deliveries, answers, consumers)
        nursery.cancel_scope.cancel()

    assert_alive(cluster)
    during = [body for body in deliveries.first
              if any(held_from <= when <= healed for when, _ in deliveries.deliveries_of(body))]
    print(f"two nodes: held from {held_from - began:.2f} s; {len(answers.acked)} acknowledged, "
          f"{len(answers.refused)} refused, {deliveries.total} deliveries, {deliveries.extra} duplicates, "
          f"by node {dict(deliveries.by_node)}; channels while apart {samples[0]} .. {samples[-1]}")
    assert taken == 0, f"a node alone took {taken} messages over\n{cluster.logs(40)}"
    assert not during, f"{len(during)} delivered while the nodes were apart: {during[:5]}\n{cluster.logs(40)}"
    for node in cluster.nodes:
        seen = {sample[node.name] for sample in samples}
        assert len(seen) == 1, f"{node.name}'s channel moved while apart: {[s[node.name] for s in samples]}"
        ((depth, in_flight),) = seen
        assert depth >= BACKLOG // 2 and in_flight == 0, (node.name, depth, in_flight)
    assert not deliveries.missing(answers.acked)
    assert not set(answers.refused) & set(deliveries.first), "a publish answered with an error was delivered"
    # once healed, each node delivers its own messages, once
    assert deliveries.extra == 0, f"{deliveries.extra} duplicates"
    for node in cluster.nodes:
        mine = [body for body in answers.acked if body.startswith(node.name.encode())]
        assert all(deliveries.first_node[body] == node.address for body in mine), node.name
