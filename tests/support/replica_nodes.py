"""Replicating daemons in one test process, found through a real nsqlookupd, and what their
``/stats`` says of replication (``tests/integration/test_replication_*.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.http_client import request
from tests.support.nsq_programs import NsqProgram

__all__ = ["copies_held", "holder_of", "linked", "lookupd_running", "node_flags", "node_replication", "topic_replication",
           "topic_stats"]


@contextmanager
def lookupd_running(folder: Path) -> Iterator[NsqProgram]:
    """nsq's nsqlookupd on ephemeral ports, killed at the end."""
    program = NsqProgram("nsqlookupd", folder / "lookupd.log", "--tcp-address=127.0.0.1:0",
                         "--http-address=127.0.0.1:0", "--broadcast-address=127.0.0.1").start()
    try:
        yield program
    finally:
        program.kill()


def node_flags(lookupd: NsqProgram, *extra: str) -> list[str]:
    """The flags of a node registered with ``lookupd`` on loopback, gone after two silent seconds."""
    return [f"--lookupd-tcp-address={lookupd.address('TCP')}", "--broadcast-address=127.0.0.1",
            "--replica-timeout=2s", *extra]


async def topic_stats(node, topic: str) -> dict | None:
    reply = await request(node.addresses.http, "GET", f"/stats?format=json&topic={topic}")
    topics = reply.json()["topics"]
    return topics[0] if topics else None


async def topic_replication(node, topic: str) -> dict:
    """The topic's replication block of ``/stats`` ({} when the node has no such topic)."""
    stats = await topic_stats(node, topic)
    return stats["replication"] if stats is not None else {}


async def node_replication(node) -> dict:
    """The node's own replication block of ``/stats``."""
    reply = await request(node.addresses.http, "GET", "/stats?format=json")
    return reply.json().get("replication", {})


async def linked(*nodes) -> bool:
    """Every one of ``nodes`` has a link up to some peer."""
    for node in nodes:
        if not any(peer["connected"] for peer in (await node_replication(node)).get("peers", ())):
            return False
    return True


async def copies_held(node, topic: str, count: int) -> bool:
    """The node holds ``count`` copies for its peers (of ``topic``, when it has that topic too)."""
    stats = await topic_stats(node, topic)
    if stats is not None:
        return stats["replication"]["copies_held"] == count
    return (await node_replication(node)).get("copies_held") == count


async def holder_of(nodes, topic: str, count: int, timeout: float = 15.0):
    """The one of ``nodes`` that holds ``count`` copies of ``topic`` (the peers a topic's copies
    go to are chosen by hashing: a test does not know which)."""
    found: list = []

    async def one_holds() -> bool:
        found[:] = [node for node in nodes if await copies_held(node, topic, count)]
        return len(found) == 1

    from tests.support.waiting import wait_until

    await wait_until(one_holds, timeout)
    return found[0]
