"""Keyed publishes with replication, real processes: a publish retried on another node after the
node that acknowledged it was lost (killed, its data wiped) is a duplicate, so every keyed
message is stored once in the cluster; over TCP and HTTP, with 3 and 5 nodes.

The producer sends 3,000 keyed messages to one node, which acknowledges them; that node is
killed and wiped; the producer, unsure what landed, sends all 3,000 again with the same keys to
another node: every one is answered as a duplicate, at once and again after the takeover,
and a consumer following nsqlookupd is given each message once.
"""

from __future__ import annotations

import pytest
import trio

from broker.protocol import encode_mpub
from broker.protocol.keys import duplicates_in_answer, prefix_key
from tests.support.http_client import request
from tests.support.nsq_programs import nsq_bin_missing
from tests.support.replication_cluster import Node, ReplicaCluster
from tests.support.v2client import connect
from tests.system.test_replication import TIMEOUT, assert_alive, bodies, clusters, delivered_through_lookupd, ready
from tests.system.test_replication import TOPIC as TOPIC

pytestmark = pytest.mark.slow
needs_nsq = pytest.mark.skipif(nsq_bin_missing() is not None, reason=nsq_bin_missing() or "")
__all__ = ["clusters"]  # the fixture, used by name

BATCH = 100


async def keyed_publish(node: Node, messages: list[bytes], via: str) -> int:
    """Publish ``messages`` (each its own key) to ``node`` in MPUBs of :data:`BATCH`, over TCP or
    HTTP; every batch must be acknowledged. Returns how many were answered as duplicates."""
    duplicates = 0
    if via == "http":
        for start in range(0, len(messages), BATCH):
            lines = b"".join(b"%s %s\n" % (m, m) for m in messages[start:start + BATCH])
            with trio.fail_after(30):
                reply = await request(node.http, "POST", f"/mpub?topic={TOPIC}&keyed=true", lines)
            assert reply.status == 200, (reply.status, reply.body)
            duplicates += int(reply.headers["x-duplicates"])
        return duplicates
    client = await connect(node.tcp, timeout=10)
    try:
        answer = await client.identify(feature_negotiation=True, publish_keys=True)
        assert answer["publish_keys"] is True
        for start in range(0, len(messages), BATCH):
            await client.send(encode_mpub(TOPIC, [prefix_key(m, m) for m in messages[start:start + BATCH]]))
            with trio.fail_after(30):
                frame = await client.read_frame()
            assert frame.data.startswith((b"OK", b"DUPLICATE")), frame
            duplicates += duplicates_in_answer(frame.data)
    finally:
        await client.aclose()
    return duplicates


@needs_nsq
@pytest.mark.parametrize("nodes, replicas, via", [(3, 2, "tcp"), (3, 2, "http"), (5, 2, "tcp"), (5, 3, "http")])
async def test_a_keyed_publish_retried_on_another_node_after_its_node_is_lost_is_stored_once(clusters, nodes,
                                                                                            replicas, via):
    cluster: ReplicaCluster = clusters(nodes, replicas=replicas, replica_timeout=TIMEOUT, durable=True)
    await ready(cluster)
    await cluster.wait_linked()  # a node asks the peers it is linked to which keys they know
    first, second = cluster.nodes[0], cluster.nodes[1]
    sent = bodies(f"keyed-{via}", 3000)
    assert await keyed_publish(first, sent, via) == 0

    first.kill()
    first.wipe()
    assert await keyed_publish(second, sent, via) == len(sent)  # before the takeover: the holders know the keys
    consumer = await delivered_through_lookupd(cluster, sent)
    assert await keyed_publish(cluster.nodes[-1], sent, via) == len(sent)  # and after it
    print(f"{len(sent)} published, {consumer.deliveries.total} deliveries, by node {dict(consumer.deliveries.by_node)}")
    extra = {body: count for body, count in consumer.deliveries.counts.items() if count > 1}
    assert set(consumer.deliveries.counts) == set(sent) and not extra, f"{len(extra)} delivered twice"
    assert_alive(cluster)
