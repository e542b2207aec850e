"""A topic's own number of replicas: ``POST /topic/create?topic=T&replicas=N`` on nodes that
take part in replication (``--replicas`` > 1, or a cluster secret alone), kept in ``nsqd.dat``
across restarts and shown in ``/stats``; ``--replicas`` stays every other topic's number."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack

import pytest

from tests.conftest import running_daemon
from tests.support.http_client import request
from tests.support.nsq_programs import nsq_bin_missing
from tests.support.replica_nodes import (
    copies_held,
    linked,
    node_flags,
    node_replication,
    topic_replication,
    topic_stats,
)
from tests.support.v2client import publish
from tests.support.waiting import wait_until

pytestmark = pytest.mark.skipif(nsq_bin_missing() is not None, reason=nsq_bin_missing() or "")


@pytest.fixture
def secret(tmp_path) -> str:
    path = tmp_path / "cluster-secret"
    path.write_text("a secret every node of the cluster has\n")
    path.chmod(0o600)
    return f"--replication-secret-file={path}"


def topic_entries(data_path) -> dict[str, dict]:
    return {entry["name"]: entry for entry in json.loads((data_path / "nsqd.dat").read_bytes())["topics"]}


async def test_a_topic_of_its_own_replicas_is_copied_while_others_are_not_and_keeps_it_across_a_restart(
        tmp_path, lookupd, secret):
    async with AsyncExitStack() as stack:
        b = await stack.enter_async_context(running_daemon(tmp_path / "b", *node_flags(lookupd, secret)))
        async with running_daemon(tmp_path / "a", *node_flags(lookupd, secret)) as a:
            await wait_until(lambda: linked(a, b))
            reply = await request(a.addresses.http, "POST", "/topic/create?topic=t&replicas=2")
            assert (reply.status, reply.json()) == (200, {"replicas": 2})
            assert topic_entries(tmp_path / "a")["t"]["replicas"] == 2  # written before the answer

            await publish(a, "t", *[b"t%d" % i for i in range(10)])
            await publish(a, "u", *[b"u%d" % i for i in range(10)])  # the node's --replicas: 1
            # t's publish was answered once b held its copies; u's made none
            assert (await node_replication(b))["copies_held"] == 10
            assert (await topic_replication(a, "t"))["replicas"] == 2
            assert (await topic_replication(a, "u"))["replicas"] == 1
            metrics = (await request(a.addresses.http, "GET", "/metrics")).text
            assert 'nsq_topic_replicas{topic="t"} 2.0' in metrics
            assert 'nsq_topic_replicas{topic="u"} 1.0' in metrics
        assert "replicas" not in topic_entries(tmp_path / "a")["u"]

        async with running_daemon(tmp_path / "a", *node_flags(lookupd, secret)) as a:
            assert (await topic_replication(a, "t"))["replicas"] == 2
            await wait_until(lambda: linked(a, b))
            await publish(a, "t", b"after the restart")
            assert await copies_held(b, "t", 11)

            reply = await request(a.addresses.http, "POST", "/topic/create?topic=t&replicas=default")
            assert (reply.status, reply.json()) == (200, {"replicas": 1})
            assert "replicas" not in topic_entries(tmp_path / "a")["t"]
            await publish(a, "t", b"one replica again")
            assert (await node_replication(b))["copies_held"] == 11


async def test_a_node_without_replication_refuses_more_than_one_replica_and_creates_nothing(start_daemon, tmp_path):
    async with start_daemon() as node:
        for query, status, message in [
            ("topic=t&replicas=2", 400, "REPLICATION_DISABLED"),
            ("topic=t&replicas=0", 400, "INVALID_ARG_REPLICAS"),
            ("topic=t&replicas=65", 400, "INVALID_ARG_REPLICAS"),
            ("topic=t&replicas=two", 400, "INVALID_ARG_REPLICAS"),
            ("topic=t&replicas=-1", 400, "INVALID_ARG_REPLICAS"),
            ("topic=t&replicas=", 400, "INVALID_ARG_REPLICAS"),
            ("replicas=2", 400, "MISSING_ARG_TOPIC"),
            ("topic=bad!name&replicas=1", 400, "INVALID_TOPIC"),
        ]:
            reply = await request(node.addresses.http, "POST", f"/topic/create?{query}")
            assert (reply.status, reply.json()) == (status, {"message": message}), query
        assert await topic_stats(node, "t") is None
        reply = await request(node.addresses.http, "POST", "/topic/create?topic=t&replicas=1")
        assert (reply.status, reply.json()) == (200, {"replicas": 1})
        assert await topic_stats(node, "t") is not None
    assert topic_entries(tmp_path / "data")["t"]["replicas"] == 1


async def test_a_damaged_replicas_entry_in_the_metadata_is_ignored_with_a_warning(start_daemon, tmp_path, caplog):
    data = tmp_path / "data"
    data.mkdir()
    (data / "nsqd.dat").write_text(json.dumps({"topics": [
        {"name": "t", "paused": False, "channels": [], "replicas": "many"},
        {"name": "u", "paused": False, "channels": [], "replicas": 3},
    ], "version": "1.3.0"}))
    async with start_daemon() as node:
        assert (await topic_stats(node, "t")) is not None and (await topic_stats(node, "u")) is not None
        await publish(node, "u", b"stored here alone")  # this node keeps no copies
    assert "ignoring replicas of topic t in nsqd.dat - not a number of nodes from 1 to 64" in caplog.text
    assert "ignoring replicas of topic u in nsqd.dat - this node keeps no copies" in caplog.text
    entries = topic_entries(data)
    assert "replicas" not in entries["t"] and "replicas" not in entries["u"]
