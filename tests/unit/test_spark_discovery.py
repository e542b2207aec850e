"""What the connector learns from nsqlookupd: every node, in one order whatever order each
answer lists them in (nsqlookupd's follows Go's map order, which changes from call to call)."""

from __future__ import annotations

import itertools

import pytest

from pyspark_nsq import discovery
from pyspark_nsq.options import Address

PRODUCERS = [{"broadcast_address": "127.0.0.1", "tcp_port": port} for port in (4350, 4150, 4250)]


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_nodes_come_in_one_order_whatever_the_answer_order(monkeypatch, order):
    monkeypatch.setattr(discovery, "_get", lambda lookupd, target: {"producers": [PRODUCERS[i] for i in order]})
    nodes = discovery.all_nodes((Address("127.0.0.1", 4161),))
    assert nodes == [Address("127.0.0.1", 4150), Address("127.0.0.1", 4250), Address("127.0.0.1", 4350)]
    # the writer's task for partition p starts at node p % 3: partitions 0, 1, 2 reach every node
    assert {nodes[p % len(nodes)] for p in range(3)} == set(nodes)
