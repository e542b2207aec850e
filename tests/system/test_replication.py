"""Replication's guarantees with real processes: ``pynsqd --replicas=N`` nodes registered with one
of nsq's ``nsqlookupd``, and consumers that follow it (``/lookup?topic=T``) as real ones do.

- a publish is acknowledged only once ``replicas`` nodes hold it, so losing its node (killed,
  data wiped; or paused past ``--replica-timeout``) loses nothing: a surviving holder takes over;
- a publish that cannot get its copies is refused (non-fatal ``E_PUB_FAILED``, HTTP 503) and
  nothing of it is delivered later;
- a node started again on its data after its copies were taken over does not deliver them again;
- a takeover keeps each message's attempts and due time: ``--max-attempts`` and dead letters
  count on where they were, a REQ's delay and a DPUB's deferral are not cut short;
- with one replica (the default) nothing changes.

Every wait is on a condition with a deadline; duplicates (a body delivered twice) are allowed
where the guarantee is at-least-once, and counted.
"""

from __future__ import annotations

import json
import time

import pytest
import trio

from broker.protocol import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    decode_message,
    encode_dpub,
    encode_fin,
    encode_mpub,
    encode_nop,
    encode_rdy,
    encode_req,
    encode_sub,
)
from tests.support.http_client import request
from tests.support.nsq_programs import nsq_bin_missing
from tests.support.processes import BrokerProcess
from tests.support.replication_cluster import Consumer, Node, ReplicaCluster, pub, publish_all
from tests.support.v2client import V2Client, connect, publish_batch
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow
needs_nsq = pytest.mark.skipif(nsq_bin_missing() is not None, reason=nsq_bin_missing() or "")

TOPIC, CHANNEL = "orders", "work"
TIMEOUT = "2s"  # --replica-timeout
TIMEOUT_S = 2.0


def bodies(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}-{n}".encode() for n in range(count)]


async def wait_delivered(consumer: Consumer, wanted: list[bytes], timeout: float, cluster: ReplicaCluster) -> None:
    """Return once ``consumer`` has been given every body of ``wanted``; fail with the nodes' logs."""
    with trio.move_on_after(timeout):
        while consumer.deliveries.missing(wanted):
            await trio.sleep(0.05)
    missing = consumer.deliveries.missing(wanted)
    assert not missing, (f"{len(missing)} of {len(wanted)} never delivered in {timeout} s (first {missing[:5]}); "
                         f"deliveries by node {dict(consumer.deliveries.by_node)}; "
                         f"consumer errors {consumer.errors[:5]}; crashed {cluster.crashed()}\n{cluster.logs()}")


def assert_alive(cluster: ReplicaCluster) -> None:
    """No node that should be running has exited by itself."""
    crashed = cluster.crashed()
    assert not crashed, f"nodes exited by themselves: {crashed}\n{cluster.logs(60)}"


def duplicates(consumer: Consumer) -> int:
    return consumer.deliveries.extra


@pytest.fixture
def clusters(tmp_path):
    """Factory: a started :class:`ReplicaCluster` under the test's directory; all stopped at the end."""
    made: list[ReplicaCluster] = []

    def factory(nodes: int, **options) -> ReplicaCluster:
        cluster = ReplicaCluster(tmp_path / f"cluster{len(made)}", nodes, **options)
        made.append(cluster)
        return cluster.start()

    yield factory
    for cluster in made:
        cluster.stop()


async def ready(cluster: ReplicaCluster) -> None:
    """The topic and its channel on every node, registered with nsqlookupd, and the nodes linked."""
    await cluster.create(TOPIC, [CHANNEL])
    await cluster.wait_registered(TOPIC, cluster.nodes)
    await cluster.wait_replicating()


async def published(cluster: ReplicaCluster, label: str, count: int) -> tuple[Node, list[bytes]]:
    """The cluster readied, and ``count`` bodies acknowledged by its first node, which is returned."""
    await ready(cluster)
    first = cluster.nodes[0]
    sent = bodies(label, count)
    await publish_all(first, TOPIC, sent)
    return first, sent


async def delivered_through_lookupd(cluster: ReplicaCluster, sent: list[bytes]) -> Consumer:
    """A consumer that follows nsqlookupd, once it has been given every body of ``sent``."""
    consumer = Consumer(TOPIC, CHANNEL, lookupd_http=cluster.lookupd.http)
    async with trio.open_nursery() as nursery:
        await nursery.start(consumer.run)
        await wait_delivered(consumer, sent, 30, cluster)
        nursery.cancel_scope.cancel()
    return consumer


async def channel_counts(node: Node) -> tuple[int, int] | None:
    """(depth, in flight) of the channel on ``node``; None before it has the channel."""
    stats = await node.stats(TOPIC)
    for topic in (stats or {}).get("topics") or []:
        for channel in topic["channels"]:
            if channel["channel_name"] == CHANNEL:
                return channel["depth"], channel["in_flight_count"]
    return None


@needs_nsq
async def test_a_killed_and_wiped_node_loses_no_acknowledged_message(clusters):
    cluster = clusters(3, replicas=2, replica_timeout=TIMEOUT, durable=True)
    first, sent = await published(cluster, "wiped", 500)

    first.kill()
    first.wipe()
    consumer = await delivered_through_lookupd(cluster, sent)
    print(f"500 published, {consumer.deliveries.total} deliveries, {duplicates(consumer)} duplicates, "
          f"by node {dict(consumer.deliveries.by_node)}")
    assert set(consumer.deliveries.counts) == set(sent)
    assert_alive(cluster)


@needs_nsq
async def test_a_publish_without_enough_nodes_is_refused_and_never_delivered(clusters):
    cluster = clusters(2, replicas=2, replica_timeout=TIMEOUT)
    first, second = cluster.nodes
    await ready(cluster)
    stats = await first.stats(TOPIC)
    assert stats is not None and stats["topics"][0].get("replication", {}).get("replicas") == 2, stats

    second.kill()
    client = await connect(first.tcp, timeout=TIMEOUT_S + 10)
    try:
        refused = bodies("refused", 3)
        with trio.fail_after(TIMEOUT_S + 5):
            answer = await pub(client, TOPIC, refused[0], timeout=TIMEOUT_S + 5)
        assert answer.startswith("E_PUB_FAILED PUB failed") and "copies" in answer, answer

        # the connection stays open: MPUB and DPUB on it are refused the same way
        await client.send(encode_mpub(TOPIC, [refused[1], b"refused-mpub"]))
        frame = await _answer(client)
        assert frame.frame_type == FRAME_TYPE_ERROR and frame.data.startswith(b"E_MPUB_FAILED MPUB failed"), frame
        assert b"copies" in frame.data, frame
        await client.send(encode_dpub(TOPIC, 10, refused[2]))
        frame = await _answer(client)
        assert frame.frame_type == FRAME_TYPE_ERROR and frame.data.startswith(b"E_DPUB_FAILED DPUB failed"), frame

        with trio.fail_after(TIMEOUT_S + 5):
            reply = await request(first.http, "POST", f"/pub?topic={TOPIC}", b"refused-http")
        assert reply.status == 503, (reply.status, reply.body)
        assert json.loads(reply.body)["message"].startswith("PUB_FAILED"), reply.body

        # the peer comes back; once the node can place its copies again it acknowledges, on the same connection
        await second.astart()
        marker = await _publish_marker(client, deadline=30)
    finally:
        await client.aclose()

    acknowledged = {marker}
    consumer = await connect(first.tcp, timeout=10)
    try:
        await consumer.send(encode_sub(TOPIC, CHANNEL))
        await consumer.expect_response(b"OK")
        await consumer.send(encode_rdy(100))
        given: list[bytes] = []
        with trio.fail_after(15):
            while marker not in given:
                given += [msg.body for msg in await consumer.sync()]
                await trio.sleep(0.05)
        given += [msg.body for msg in await consumer.sync()]  # anything behind the marker
    finally:
        await consumer.aclose()
    assert set(given) <= acknowledged, f"delivered what was refused: {sorted(set(given) - acknowledged)}"
    assert_alive(cluster)


async def _answer(client: V2Client):
    with trio.fail_after(TIMEOUT_S + 5):
        return await client.read_frame()


async def _publish_marker(client: V2Client, deadline: float) -> bytes:
    """PUB markers (each body new) until one is acknowledged; its body."""
    with trio.fail_after(deadline):
        for n in range(1000):
            body = f"marker-{n}".encode()
            answer = await pub(client, TOPIC, body, timeout=TIMEOUT_S + 5)
            if answer == "OK":
                return body
            assert answer.startswith("E_PUB_FAILED"), answer
            await trio.sleep(0.2)  # the node learns of its peer through nsqlookupd; no event to wait on
    raise AssertionError("no marker was acknowledged")


@needs_nsq
async def test_a_paused_node_is_taken_over_and_its_messages_delivered(clusters):
    cluster = clusters(3, replicas=2, replica_timeout=TIMEOUT)
    count = 300
    first, sent = await published(cluster, "paused", count)

    first.pause()
    consumer = Consumer(TOPIC, CHANNEL, lookupd_http=cluster.lookupd.http)
    async with trio.open_nursery() as nursery:
        await nursery.start(consumer.run)
        try:
            # while it is paused: its copies come from the node that took them over
            await wait_delivered(consumer, sent, TIMEOUT_S + 20, cluster)
        finally:
            first.resume()
        # back: once the consumer is connected to it again and it holds nothing, count what it sent again
        with trio.fail_after(30):
            while not (consumer.connected_to(first) and await channel_counts(first) == (0, 0)):
                await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    extra = duplicates(consumer)
    print(f"{count} published, {consumer.deliveries.total} deliveries, {extra} duplicates, "
          f"by node {dict(consumer.deliveries.by_node)}")
    assert set(consumer.deliveries.counts) == set(sent)
    assert_alive(cluster)
    # the resumed node holds delivery until its peers said what they took: nothing comes twice
    assert extra <= count // 100, f"{extra} duplicates: the resumed node delivered its copies again\n{cluster.logs()}"


@needs_nsq
async def test_a_restarted_node_does_not_deliver_what_was_finished_elsewhere(clusters):
    cluster = clusters(3, replicas=2, replica_timeout=TIMEOUT, durable=True)
    count = 200
    first, sent = await published(cluster, "restarted", count)

    first.kill()  # its data stays
    consumer = Consumer(TOPIC, CHANNEL, lookupd_http=cluster.lookupd.http)
    async with trio.open_nursery() as nursery:
        await nursery.start(consumer.run)
        await wait_delivered(consumer, sent, 30, cluster)
        # every one is FIN'd where it came from once the taker's channel holds nothing
        with trio.fail_after(15):
            while any([await channel_counts(node) not in ((0, 0), None) for node in cluster.up()]):
                await trio.sleep(0.1)
        nursery.cancel_scope.cancel()

    await first.astart()
    again = Consumer(TOPIC, CHANNEL, addresses=[first.tcp])
    async with trio.open_nursery() as nursery:
        await nursery.start(again.run)
        # it holds nothing to deliver (or delivered and had FIN'd what it still held)
        with trio.fail_after(20):
            while not (again.connected_to(first) and await channel_counts(first) == (0, 0)):
                await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    assert_alive(cluster)
    redelivered = sum(again.deliveries.counts[body] for body in sent)
    print(f"restarted node delivered {redelivered} of {count} again")
    assert redelivered <= 5, (f"the restarted node delivered {redelivered} of {count} finished elsewhere\n"
                              f"{cluster.logs()}")


@needs_nsq
async def test_a_node_restarted_at_once_after_a_crash_without_durable_loses_nothing(clusters):
    # without --durable a kill -9 loses what the node held in memory; it comes back well within
    # --replica-timeout, so no takeover is due: its HELLO says it lost its memory, and the peers
    # take over its copies at once
    cluster = clusters(3, replicas=2, replica_timeout=TIMEOUT)
    count = 300
    first, sent = await published(cluster, "forgotten", count)

    first.kill()
    await first.astart()
    consumer = await delivered_through_lookupd(cluster, sent)
    assert any(node.log_lines("restarted after a crash without --durable") for node in cluster.nodes[1:])
    assert_alive(cluster)
    assert duplicates(consumer) <= count // 100, f"{duplicates(consumer)} duplicates\n{cluster.logs()}"


async def published_in_batches(cluster: ReplicaCluster, label: str, count: int) -> tuple[Node, list[bytes]]:
    """The cluster readied, each node linked to every other (all copies of the first node's topic
    go to one peer), and ``count`` bodies acknowledged by its first node, MPUB'd 500 at a time."""
    await ready(cluster)
    await cluster.wait_linked()
    first = cluster.nodes[0]
    sent = bodies(label, count)
    await publish_batch(first.tcp, TOPIC, *sent, per_mpub=500, timeout=TIMEOUT_S + 30)
    return first, sent


async def topic_replication_of(node: Node) -> dict:
    """The topic's replication block of ``node``'s ``/stats`` ({} when it does not answer)."""
    stats = await node.stats(TOPIC)
    topics = (stats or {}).get("topics") or []
    return topics[0].get("replication", {}) if topics else {}


async def holder_of(cluster: ReplicaCluster, origin: Node, count: int) -> Node:
    """The node other than ``origin`` that holds ``count`` copies of the topic's messages."""
    found: list[Node] = []
    held: dict[str, object] = {}

    async def one_holds() -> bool:
        for node in cluster.up():
            if node is not origin:
                held[node.name] = (await topic_replication_of(node)).get("copies_held")
        found[:] = [node for node in cluster.up() if held.get(node.name) == count]
        return len(found) == 1

    with trio.move_on_after(30):
        await wait_until(one_holds, 30)
    assert len(found) == 1, f"copies held of {count}: {held}\n{cluster.logs()}"
    return found[0]


async def restored(origin: Node, holder: Node, count: int) -> bool:
    """``origin`` made ``count`` copies of the topic's messages again, on ``holder``, and counts none missing."""
    stats = await origin.stats()
    node = (stats or {}).get("replication", {})
    return (node.get("copies_missing") == 0 and node.get("copies_restored", 0) >= count
            and (await topic_replication_of(origin)).get("copies_missing") == 0
            and (await topic_replication_of(holder)).get("copies_held") == count)


@needs_nsq
async def test_copies_a_lost_holder_held_are_made_again_so_losing_the_origin_next_loses_nothing(clusters):
    cluster = clusters(3, replicas=2, replica_timeout=TIMEOUT, durable=True)
    count = 10_000
    first, sent = await published_in_batches(cluster, "recopied", count)
    holder = await holder_of(cluster, first, count)
    [third] = [node for node in cluster.nodes if node not in (first, holder)]

    holder.kill()
    holder.wipe()
    started = trio.current_time()
    await wait_until(lambda: restored(first, third, count), 60)
    print(f"{count} copies made again {trio.current_time() - started:.1f} s after the holder was killed")
    assert_alive(cluster)
    # the holder comes back as a new node (a majority again), then the origin is lost with its disk
    await holder.astart()
    await cluster.wait_replicating([holder])
    await cluster.wait_linked()  # every node knows it replaced the holder lost
    first.kill()
    first.wipe()
    consumer = Consumer(TOPIC, CHANNEL, lookupd_http=cluster.lookupd.http)
    async with trio.open_nursery() as nursery:
        await nursery.start(consumer.run)
        await wait_delivered(consumer, sent, 120, cluster)
        nursery.cancel_scope.cancel()
    lost = len(consumer.deliveries.missing(sent))
    print(f"{count} published, {lost} lost, {consumer.deliveries.total} deliveries, by node "
          f"{dict(consumer.deliveries.by_node)}")
    assert lost == 0
    assert_alive(cluster)


@needs_nsq
async def test_publishes_are_acknowledged_quickly_while_a_large_backlog_is_copied_again(clusters):
    cluster = clusters(3, replicas=2, replica_timeout=TIMEOUT, durable=True)
    count = 100_000
    first, _sent = await published_in_batches(cluster, "backlog", count)
    holder = await holder_of(cluster, first, count)
    client = await connect(first.tcp, timeout=10)
    try:
        baseline = [await _timed_pub(client, f"before-{n}".encode()) for n in range(50)]
        holder.kill()
        holder.wipe()
        await wait_until(lambda: _missing_above_zero(first), 30)
        started = trio.current_time()
        during: list[float] = []
        done = False

        async def watch() -> None:
            nonlocal done
            await wait_until(lambda: _nothing_missing(first, count), 120, poll=0.2)
            done = True

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            while not done:
                during.append(await _timed_pub(client, f"during-{len(during)}".encode()))
        took = trio.current_time() - started
    finally:
        await client.aclose()
    during.sort()
    baseline.sort()
    print(f"{count} copies made again in {took:.1f} s; PUB latency before: median {baseline[25] * 1000:.1f} ms, "
          f"max {baseline[-1] * 1000:.1f} ms; during ({len(during)} PUBs): median "
          f"{during[len(during) // 2] * 1000:.1f} ms, p99 {during[len(during) * 99 // 100] * 1000:.1f} ms, "
          f"max {during[-1] * 1000:.1f} ms")
    assert len(during) >= 20, f"the copies were made again before publishes could be measured ({took:.1f} s)"
    assert during[-1] < 1.0, f"a publish waited {during[-1]:.2f} s while copies were made again"
    assert_alive(cluster)


async def _timed_pub(client: V2Client, body: bytes) -> float:
    """PUB ``body``, require ``OK``; how long the answer took."""
    started = trio.current_time()
    answer = await pub(client, TOPIC, body, timeout=TIMEOUT_S + 10)
    assert answer == "OK", answer
    return trio.current_time() - started


async def _missing_above_zero(node: Node) -> bool:
    return (await topic_replication_of(node)).get("copies_missing", 0) > 0


async def _nothing_missing(node: Node, count: int) -> bool:
    """``node`` made at least ``count`` copies again and counts none missing."""
    replication = ((await node.stats()) or {}).get("replication", {})
    return replication.get("copies_missing") == 0 and replication.get("copies_restored", 0) >= count


DEFER_S = 30


@needs_nsq
async def test_a_takeover_keeps_each_messages_attempts_and_due_time(clusters):
    """A consumer REQs a message twice on its node (``--max-attempts=3``), REQs another with a
    delay, and a third was published deferred; the node is killed and wiped. The taker delivers
    the first with its third attempt and, REQ'd once more, buries it as the origin would have;
    the others come when they were due, not at the takeover."""
    cluster = clusters(3, replicas=2, replica_timeout=TIMEOUT, durable=True, extra=["--max-attempts=3"])
    await ready(cluster)
    origin = cluster.nodes[0]
    publisher = await connect(origin.tcp, timeout=TIMEOUT_S + 10)
    consumer = await connect(origin.tcp, timeout=10)
    try:
        await consumer.send(encode_sub(TOPIC, CHANNEL) + encode_rdy(1))
        await consumer.expect_response(b"OK")
        deferred_at = time.time()
        await publisher.send(encode_dpub(TOPIC, DEFER_S * 1000, b"deferred"))
        await publisher.expect_response(b"OK")
        assert await pub(publisher, TOPIC, b"delayed", timeout=TIMEOUT_S + 10) == "OK"
        msg = await consumer.read_message()
        assert (msg.body, msg.attempts) == (b"delayed", 1)
        delayed_at = time.time()
        await consumer.send(encode_req(msg.id, DEFER_S * 1000))
        assert await pub(publisher, TOPIC, b"poison", timeout=TIMEOUT_S + 10) == "OK"
        for attempt in (1, 2):
            msg = await consumer.read_message()
            assert (msg.body, msg.attempts) == (b"poison", attempt)
            if attempt == 1:
                await consumer.send(encode_req(msg.id, 0))
        # a marker behind it, finished after the second REQ: once the holder dropped its copy,
        # it had the REQ's word too (a node posts a batch's states before its FINs)
        assert await pub(publisher, TOPIC, b"marker", timeout=TIMEOUT_S + 10) == "OK"
        holder = await wait_until(lambda: _holding(cluster.nodes[1:], 4), 15)
        await consumer.send(encode_req(msg.id, 0))
        marker = await consumer.read_message()
        assert marker.body == b"marker"
        await consumer.send(encode_rdy(0) + encode_fin(marker.id))
        await consumer.expect_quiet()
        await wait_until(lambda: _holding([holder], 3), 15)
    finally:
        await publisher.aclose()
        await consumer.aclose()

    origin.kill()
    origin.wipe()
    taken = await connect(holder.tcp, timeout=10)
    try:
        await taken.identify(heartbeat_interval=2000)
        await taken.send(encode_sub(TOPIC, CHANNEL) + encode_rdy(10))
        await taken.expect_response(b"OK")
        with trio.fail_after(30):  # the takeover, after --replica-timeout
            msg = await _next_message(taken)
        assert (msg.body, msg.attempts) == (b"poison", 3), msg  # the origin's third attempt
        await taken.send(encode_req(msg.id, 0))
        await wait_until(lambda: _buried(holder, 1), 15)  # no fourth attempt: a dead letter, as at the origin
        due = {b"deferred": deferred_at + DEFER_S, b"delayed": delayed_at + DEFER_S}
        for _ in list(due):
            with trio.fail_after(DEFER_S + 30):
                msg = await _next_message(taken)
            now = time.time()
            assert msg.body in due, msg
            # not before it was due (what the node counts from came after these times; a
            # little slack for the node's conversion of due times to its own clock)
            assert now >= due[msg.body] - 0.1, (msg.body, due[msg.body] - now)
            assert msg.attempts == (1 if msg.body == b"deferred" else 2), msg  # the delayed one was tried once
            await taken.send(encode_fin(msg.id))
            del due[msg.body]
    finally:
        await taken.aclose()
    assert_alive(cluster)


async def _holding(nodes: list[Node], count: int) -> Node | None:
    """The one of ``nodes`` that holds ``count`` copies of the topic."""
    for node in nodes:
        stats = await node.stats(TOPIC)
        for topic in (stats or {}).get("topics") or []:
            if topic.get("replication", {}).get("copies_held") == count:
                return node
    return None


async def _buried(node: Node, count: int) -> bool:
    stats = await node.stats(TOPIC)
    for topic in (stats or {}).get("topics") or []:
        for channel in topic["channels"]:
            if channel["channel_name"] == CHANNEL and channel.get("buried_count") == count:
                return True
    return False


async def _next_message(client: V2Client):
    """The next message on ``client``, heartbeats answered on the way."""
    while True:
        frame = await client.read_frame(skip_heartbeats=False)
        if frame.frame_type == FRAME_TYPE_MESSAGE:
            return decode_message(frame.data)
        assert frame.frame_type == FRAME_TYPE_RESPONSE and frame.data == b"_heartbeat_", frame
        await client.send(encode_nop())


async def test_one_replica_changes_nothing(tmp_path):
    node = BrokerProcess(tmp_path / "data", log_path=tmp_path / "broker.log").start()
    try:
        await _publish_and_check_no_replication(node)
    finally:
        node.kill()


async def test_an_explicit_replicas_1_changes_nothing(tmp_path):
    node = BrokerProcess(tmp_path / "data", "--replicas=1", log_path=tmp_path / "broker.log").start()
    try:
        await _publish_and_check_no_replication(node)
    finally:
        node.kill()


async def _publish_and_check_no_replication(node: BrokerProcess) -> None:
    assert node.tcp is not None and node.http is not None
    client = await connect(node.tcp)
    try:
        assert await pub(client, TOPIC, b"one", timeout=10) == "OK"
    finally:
        await client.aclose()
    reply = await request(node.http, "POST", f"/pub?topic={TOPIC}", b"two")
    assert (reply.status, reply.body) == (200, b"OK")
    reply = await request(node.http, "GET", "/stats?format=json")
    topics = reply.json()["topics"]
    assert [t["topic_name"] for t in topics] == [TOPIC]
    assert "replication" not in topics[0], topics[0]
    assert topics[0]["message_count"] == 2
