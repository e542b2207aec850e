"""The exactly-once Spark copy on a replicated cluster: the sink writes through nsqlookupd to
three ``pynsqd --durable --replicas=2`` nodes, and the node one of its tasks writes to is
killed and its data wiped mid-copy. The task publishes its unanswered batches again to
another node (the keys travel with the copies, so that node knows those the lost node had
stored), the dead node's messages are taken over by their holder, and a consumer following
nsqlookupd is given every source message once."""

from __future__ import annotations

from collections import Counter

import pytest
import trio

from tests.support.http_client import request
from tests.support.nsq_programs import nsq_bin_missing
from tests.support.processes import BrokerProcess
from tests.support.replication_cluster import Consumer, Node, ReplicaCluster
from tests.support.spark_queries import EXACTLY_ONCE_KEY, kill_group, run_copy_process
from tests.system.test_spark import WORKER_PATH, bodies_of

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.deadline(600),
              pytest.mark.skipif(nsq_bin_missing() is not None, reason=nsq_bin_missing() or "")]

SOURCE, SINK = "spark_in", "spark_out"
COUNT = 20_000


async def message_count(node: Node, topic: str) -> int:
    stats = await node.stats(topic)
    return sum(t["message_count"] for t in (stats or {}).get("topics") or [] if t["topic_name"] == topic)


async def drained(node: Node | _Source) -> bool:
    """The copy has finished every source message on ``node``."""
    stats = await node.stats(SOURCE)
    channels = [c for t in (stats or {}).get("topics") or [] for c in t["channels"] if c["channel_name"] == "spark"]
    return bool(channels) and channels[0]["depth"] == 0 and channels[0]["in_flight_count"] == 0 \
        and channels[0]["deferred_count"] == 0 and channels[0]["message_count"] >= COUNT


async def emptied(nodes: list[Node]) -> bool:
    """Every live node's sink channel has nothing left to give (so no second delivery is on its way)."""
    for node in nodes:
        stats = await node.stats(SINK)
        for topic in (stats or {}).get("topics") or []:
            for channel in topic["channels"]:
                if channel["depth"] or channel["in_flight_count"] or channel["deferred_count"]:
                    return False
    return True


class _Source:
    """The copy's source node (a :class:`BrokerProcess`), asked as a cluster's :class:`Node` is."""

    def __init__(self, proc: BrokerProcess):
        assert proc.tcp is not None and proc.http is not None
        self.proc = proc
        self.http = proc.http
        self.address = f"{proc.tcp[0]}:{proc.tcp[1]}"

    async def stats(self, topic: str) -> dict:
        return (await request(self.http, "GET", f"/stats?format=json&topic={topic}")).json()


async def _written_to(nodes: list[Node]) -> Node | None:
    """The node of ``nodes`` the copy has written a tenth of the messages to, if any yet."""
    for node in nodes:
        if await message_count(node, SINK) >= COUNT // 10:
            return node
    return None


async def test_a_keyed_copy_whose_sink_node_is_killed_and_wiped_copies_each_message_once(tmp_path):
    cluster = ReplicaCluster(tmp_path / "cluster", 3, replicas=2, replica_timeout="2s", durable=True).start()
    # the source is a node of its own, unknown to the cluster's nsqlookupd: the sink writes to one
    # of the nodes nsqlookupd lists, and losing that one must not take the source with it
    source = _Source(BrokerProcess(tmp_path / "source" / "data").start())
    sinks = cluster.nodes
    copy = None
    try:
        for target in (f"/topic/create?topic={SOURCE}", f"/channel/create?topic={SOURCE}&channel=spark"):
            assert (await request(source.http, "POST", target)).status == 200
        await cluster.create(SINK, ["check"], sinks)
        await cluster.wait_registered(SINK, sinks)
        await cluster.wait_replicating()
        await cluster.wait_linked()
        expected = bodies_of("replicated", COUNT)
        for start in range(0, COUNT, 1000):
            reply = await request(source.http, "POST", f"/mpub?topic={SOURCE}", b"\n".join(expected[start:start + 1000]))
            assert reply.status == 200, reply
        log = tmp_path / "copy.log"
        copy = run_copy_process(source.address, SOURCE, SINK, tmp_path / "checkpoint", log, worker_path=WORKER_PATH,
                                key=EXACTLY_ONCE_KEY, restarts=3,
                                sink_lookupd="%s:%d" % cluster.lookupd.http)
        with trio.fail_after(300):  # the copy is under way on the node to be lost: the one it writes to
            while not (victim := await _written_to(sinks)):
                await trio.sleep(0.05)
        assert await message_count(victim, SINK) < COUNT, "the copy ended before its sink's node could be lost"
        victim.kill()
        victim.wipe()
        with trio.fail_after(300):
            while not await drained(source):
                await trio.sleep(0.2)
        kill_group(copy)
        copy = None

        consumer = Consumer(SINK, "check", lookupd_http=cluster.lookupd.http)
        async with trio.open_nursery() as nursery:
            await nursery.start(consumer.run)
            with trio.move_on_after(120):
                while consumer.deliveries.missing(expected) or not await emptied(cluster.up()):
                    await trio.sleep(0.1)
            nursery.cancel_scope.cancel()
        counts: Counter[bytes] = consumer.deliveries.counts
        missing = consumer.deliveries.missing(expected)
        twice = [body for body, n in counts.items() if n > 1]
        print(f"{COUNT} copied through a node's loss: {len(missing)} missing, {len(twice)} twice, "
              f"by node {dict(consumer.deliveries.by_node)}")
        assert not missing, (missing[:5], log.read_text(errors="replace")[-3000:], cluster.logs())
        assert not twice and set(counts) == set(expected), twice[:5]
    finally:
        if copy is not None:
            kill_group(copy)
        cluster.stop()
        source.proc.kill()
