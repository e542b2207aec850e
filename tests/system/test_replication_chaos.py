"""The replication chaos harness (``tests/bench/chaos_replication.py``) at CI size.

The full run (a hundred rounds) is the script's; here a few rounds each of three nodes with two
and with three replicas: nodes killed (their data kept or wiped), paused past the replica
timeout, two at once with three replicas, and (where iptables may be used) one node cut off,
blackholed and slowed down from the others while every client still reaches it, while
publishers and consumers that follow nsqlookupd keep working. Nothing acknowledged may be lost
in any round, and no publish answered with an error may be delivered; duplicates (a body
delivered twice on a channel) are allowed but must stay under 1 % of the deliveries once there
are enough deliveries to tell.
"""

from __future__ import annotations

import json

import pytest

from tests.bench.chaos_replication import run_chaos_async, table
from tests.support.nsq_programs import nsq_bin_missing
from tests.support.partitions import KINDS, partitions_missing

pytestmark = [
    pytest.mark.skipif(nsq_bin_missing() is not None, reason=nsq_bin_missing() or ""),
    pytest.mark.slow,
]


def check(report: dict) -> None:
    print(table(report))
    print(json.dumps(report["summary"], indent=1))
    summary = report["summary"]
    lost = [(r["round"], r["action"], r["nodes"], r["lost"], r["examples"]) for r in report["rounds"] if r["lost"]]
    assert not summary["crashes"], f"nodes exited by themselves: {summary['crashes']}"
    assert not lost, f"acknowledged messages lost: {lost}; summary {summary}"
    assert summary["lost_at_end"] == 0, summary
    assert summary["refused_delivered"] == 0, f"publishes answered with an error were delivered: {summary}"
    assert summary["minority_late"] == 0, f"the smaller side of a partition delivered what was taken over: {summary}"
    assert summary["acknowledged"] > 0, summary
    # duplicates are bounded and counted: a message in flight on a node that dies, or finished
    # in the FIN batch that had not left it, comes again from the taker. The 100-round runs in
    # deploy/README.md stay under 1 %; two short rounds (one of them two nodes killed at once) vary
    # more, so the bound here is looser
    if summary["deliveries"] >= 1000:
        assert summary["duplicate_ratio"] < 0.05, summary


@pytest.mark.parametrize(("replicas", "durable", "schedule"), [
    (2, True, ("wipe:held", "pause:held", "kill:live")),
    (3, False, ("kill2:held", "pause:held")),
], ids=["replicas2-durable", "replicas3"])
async def test_no_acknowledged_message_is_lost_while_nodes_fail(tmp_path, replicas, durable, schedule):
    report = await run_chaos_async(tmp_path, 3, replicas, len(schedule), replica_timeout="2s", durable=durable,
                                   channels=2 if replicas == 2 else 1, rate=150.0, seed=replicas, settle=30.0,
                                   schedule=schedule)
    check(report)


async def test_no_acknowledged_message_is_lost_while_nodes_are_partitioned(tmp_path):
    for kind in KINDS:
        if (missing := partitions_missing(kind)) is not None:
            pytest.skip(missing)
    schedule = ("partition-cut:live", "partition-blackhole:live", "partition-slow:live")
    report = await run_chaos_async(tmp_path, 3, 2, len(schedule), replica_timeout="2s", durable=True, channels=1,
                                   rate=150.0, seed=5, settle=30.0, schedule=schedule)
    check(report)
