"""A node that has just started waits for its peers, as it waits for its copies: a publish sent
the moment its ports listen is answered ``OK`` once a peer holds its copy (within
``--replica-timeout``), not refused because no peer was found yet. Real processes, registered
with nsq's nsqlookupd; the consumer follows nsqlookupd and counts every delivery."""

from __future__ import annotations

import pytest
import trio

from tests.support.nsq_programs import nsq_bin_missing
from tests.support.replication_cluster import Consumer, Node, ReplicaCluster, pub
from tests.support.v2client import connect

pytestmark = [pytest.mark.slow, pytest.mark.skipif(nsq_bin_missing() is not None, reason=nsq_bin_missing() or "")]

TOPIC, CHANNEL = "orders", "work"


async def first_answers(nodes: list[Node], label: str) -> dict[bytes, str]:
    """One PUB to each node at once, on a connection opened as soon as it listens: the answers."""
    answers: dict[bytes, str] = {}

    async def publish_one(node: Node) -> None:
        body = f"{label}-{node.name}".encode()
        client = await connect(node.tcp, timeout=10)
        try:
            answers[body] = await pub(client, TOPIC, body, timeout=30)
        finally:
            await client.aclose()

    async with trio.open_nursery() as nursery:
        for node in nodes:
            nursery.start_soon(publish_one, node)
    return answers


async def test_a_publish_the_moment_nodes_start_is_acknowledged_and_delivered(tmp_path):
    cluster = ReplicaCluster(tmp_path, 3, replicas=2, replica_timeout="5s", durable=True)
    try:
        cluster.start()  # returns once every node listens: none has looked for its peers yet
        answers = await first_answers(cluster.nodes, "at-start")
        assert answers == {body: "OK" for body in answers}, cluster.logs()

        restarted = cluster.nodes[1]
        restarted.kill()
        await restarted.astart()
        answers.update(await first_answers([restarted], "after-restart"))
        assert all(answer == "OK" for answer in answers.values()), (answers, cluster.logs())

        consumer = Consumer(TOPIC, CHANNEL, lookupd_http=cluster.lookupd.http)
        async with trio.open_nursery() as nursery:
            await nursery.start(consumer.run)
            with trio.move_on_after(30):
                while consumer.deliveries.missing(list(answers)):
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
        assert not consumer.deliveries.missing(list(answers)), (dict(consumer.deliveries.by_node), cluster.logs())
        assert not cluster.crashed(), cluster.logs()
    finally:
        cluster.stop()
