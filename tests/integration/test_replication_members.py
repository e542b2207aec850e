"""The cluster's members: each node lists them in ``/stats`` with whether it reaches a majority
of them; a node lost for good is forgotten with ``POST /replication/forget?node=ID``, kept in
``replication.members``, after which the nodes left make a majority again and deliver."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack

import pytest

from broker.protocol import encode_rdy, encode_sub
from tests.conftest import running_daemon
from tests.support.http_client import request
from tests.support.nsq_programs import nsq_bin_missing
from tests.support.replica_nodes import linked, node_flags, node_replication
from tests.support.v2client import connect, publish
from tests.support.waiting import wait_until

pytestmark = pytest.mark.skipif(nsq_bin_missing() is not None, reason=nsq_bin_missing() or "")


async def test_a_node_lost_for_good_is_forgotten_and_the_one_left_delivers_again(tmp_path, lookupd):
    flags = node_flags(lookupd, "--replicas=2")
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(running_daemon(tmp_path / "a", *flags))
        async with running_daemon(tmp_path / "b", *flags) as b:
            await wait_until(lambda: linked(a, b))
            a_id, b_id = (await node_replication(a))["node_id"], (await node_replication(b))["node_id"]
            assert (await node_replication(a))["members"] == sorted([a_id, b_id])
            client = await connect(a.addresses.tcp)
            await client.send(encode_sub("t", "c"))
            await client.expect_response(b"OK")
            await publish(a, "t", b"one", b"two", b"three")  # b holds their copies

        async def alone() -> bool:
            return (await node_replication(a))["majority"] is False

        await wait_until(alone)  # 1 of 2 members: no majority, no delivery of replicated topics
        for query, status, message in [("", 400, "MISSING_ARG_NODE"), ("?node=zz", 400, "INVALID_ARG_NODE"),
                                       (f"?node={'0' * 32}", 404, "NODE_NOT_FOUND"),
                                       (f"?node={a_id}", 404, "NODE_NOT_FOUND")]:
            reply = await request(a.addresses.http, "POST", f"/replication/forget{query}")
            assert (reply.status, reply.json()) == (status, {"message": message}), query

        reply = await request(a.addresses.http, "POST", f"/replication/forget?node={b_id}")
        assert reply.status == 200
        assert (await node_replication(a))["members"] == [a_id]
        assert json.loads((tmp_path / "a" / "replication.members").read_bytes()) == {a_id: ""}

        async def majority() -> bool:
            return (await node_replication(a))["majority"] is True

        await wait_until(majority)
        await client.send(encode_rdy(10))
        assert sorted([(await client.read_message()).body for _ in range(3)]) == [b"one", b"three", b"two"]


async def test_forget_on_a_node_without_replication_is_refused(start_daemon):
    async with start_daemon() as node:
        reply = await request(node.addresses.http, "POST", f"/replication/forget?node={'0' * 32}")
        assert (reply.status, reply.json()) == (400, {"message": "REPLICATION_DISABLED"})
