"""Chaos: a replicated ``pynsqd`` cluster loses nodes round after round while clients keep working.

One nsq ``nsqlookupd`` and ``--nodes`` real ``pynsqd`` processes registered with it
(``--replicas=R --replica-timeout=T``, ``--durable`` if asked, each on fixed ports so that a
node started again keeps its address). Meanwhile:

- publishers (``--publishers``, ``--rate`` messages a second in all) PUB unique bodies
  (``b"%d" % seq``) to a random live node, a few dozen on one connection before they move on;
  a body is *acknowledged* when it got ``OK``; an error frame or a broken or silent
  connection acknowledges nothing (the publisher moves on, reconnects if it must);
- one consumer per channel (``--channels``) follows nsqlookupd as real consumers do
  (``/lookup?topic=T`` every second, a connection to every producer listed, connect failures
  tolerated), FINs every message and records every body delivered.

Each round the nemesis picks an action: ``kill`` (SIGKILL a node, start it again on its data),
``wipe`` (SIGKILL, delete its data directory: it comes back as a new node), ``pause`` (SIGSTOP,
then SIGCONT) or, with three replicas or more, ``kill2`` or ``wipe2`` (two nodes at once); the node stays
down for 1.5-3.5 replica timeouts plus a second. Chosen with ``--actions`` (they need root and
iptables: :mod:`tests.support.partitions`), ``partition-cut``, ``partition-blackhole`` and
``partition-slow`` separate nodes from each other for as long instead, while every client still
reaches every node (each node runs on a loopback address of its own): one node from the others,
or, with five nodes or more, in half of those rounds two nodes from the rest (2|3). The nodes of
the smaller side are the round's ``nodes``. In half of the rounds the consumers are held
(RDY 0) until the moment of the failure, so that every node has a backlog the failure puts at
risk. After the node is back, publishing stops and the round waits (``--settle`` seconds at most)
until every acknowledged body has been delivered on every channel. Per round:

- ``acknowledged``: bodies that got ``OK`` in the round; ``refused``/``unconfirmed``: publishes
  answered with an error / never answered;
- ``lost``: acknowledged in the round and not delivered on some channel by the round's end
  (must be 0 when at most replicas-1 nodes fail at once);
- ``deliveries``, ``duplicated``: deliveries during the round, and how many of them delivered a
  body that channel had been given before; the consumers follow nsqlookupd, which lists every
  node, so the deliveries of both sides of a partition are counted;
- ``both_sides`` (partitions only): bodies delivered on a channel, from the partition on, both by
  a node of the smaller side and by another node (a message the majority took over that the
  minority delivered too); ``minority_late``: those of them the smaller side delivered after the
  other side had (it delivered what the majority had taken over: its fence was late, or it did
  not learn of the takeover), where the rest were delivered by the smaller side first, before it
  could know of the partition, and again by the node that took them over;
- ``outstanding``: (channel, body) pairs acknowledged but not yet delivered when the node died;
  ``recovery_s``: seconds from the death until the last of them arrived (None: nothing was
  outstanding, or some never arrived); ``restored_s``: when the node was back, in seconds after
  its death (a recovery before it is the takeover's work); ``late_by_publisher``: the outstanding
  that arrived only after that, by the node that had acknowledged them.

Usage (from the repository root)::

    python -m tests.bench.chaos_replication --nodes 3 --replicas 2 --rounds 100 --replica-timeout 2s
    python -m tests.bench.chaos_replication --nodes 3 --replicas 3 --rounds 20 --durable --json out.json

    python -m tests.bench.chaos_replication --nodes 5 --replicas 2 --rounds 6 --durable \
        --actions partition-cut,partition-blackhole,partition-slow

A node that exits by itself (a crash) is noted (``crashed``, and in the summary with the end of its
log) and started again with the round's victims. After the last round the harness waits once more
for everything acknowledged, the bodies rounds gave up on included (``lost_at_end``). The
summary counts the rounds by action (``by_action``) and the publishes answered with an error
that were delivered all the same (``refused_delivered``).

Exit status 1 when an acknowledged message was lost, a refused publish delivered or a node crashed.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import trio

from tests.support.partitions import Partition, partitions_missing
from tests.support.replication_cluster import DISCONNECTED, Consumer, Deliveries, Node, ReplicaCluster, pub
from tests.support.v2client import V2Client, connect

__all__ = ["run_chaos", "run_chaos_async"]

TOPIC = "chaos"
ACTIONS = ("kill", "wipe", "pause")
#: Actions on two nodes at once (only with three replicas or more): killed, or killed and wiped.
PAIRS = ("kill2", "wipe2")
#: Partitions between nodes (only when asked for: they need root and iptables).
PARTITIONS = ("partition-cut", "partition-blackhole", "partition-slow")
_DURATION = re.compile(r"(\d+(?:\.\d*)?)(ms|s|m|h)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def seconds(duration: str) -> float:
    """A Go duration (``2s``, ``1500ms``, ``1m30s``) in seconds."""
    parts = _DURATION.findall(duration)
    if not parts or "".join(a + b for a, b in parts) != duration:
        raise ValueError(f"not a duration: {duration!r}")
    return sum(float(value) * _UNIT[unit] for value, unit in parts)


@dataclass
class Ledger:
    """What the publishers were told: each acknowledged body, when, in which round, by which node."""

    #: body -> (when, round, the node that acknowledged it)
    acked: dict[bytes, tuple[float, int, str]] = field(default_factory=dict)
    refused: Counter[str] = field(default_factory=Counter)
    refusals: list[str] = field(default_factory=list)
    #: the bodies whose publish was answered with an error (and the error): none may ever be delivered
    refused_bodies: dict[bytes, tuple[str, str]] = field(default_factory=dict)
    unconfirmed: int = 0
    round: int = 0
    by_round: Counter[int] = field(default_factory=Counter)
    refused_by_round: Counter[int] = field(default_factory=Counter)
    unconfirmed_by_round: Counter[int] = field(default_factory=Counter)
    _seq: int = 0

    def body(self) -> bytes:
        self._seq += 1
        return b"%d" % self._seq

    def ack(self, body: bytes, now: float, node: str) -> None:
        self.acked[body] = (now, self.round, node)
        self.by_round[self.round] += 1

    def refuse(self, body: bytes, answer: str, node: str) -> None:
        self.refused_bodies[body] = (node, answer[:160])
        self.refused[answer.split(" ", 1)[0]] += 1
        self.refused_by_round[self.round] += 1
        if len(self.refusals) < 20:
            self.refusals.append(answer[:200])

    def lose_track(self) -> None:
        self.unconfirmed += 1
        self.unconfirmed_by_round[self.round] += 1


class Publishers:
    """``count`` publishers sharing ``rate`` messages a second; they publish while :attr:`on`."""

    def __init__(self, cluster: ReplicaCluster, ledger: Ledger, rng: random.Random, count: int, rate: float,
                 pub_timeout: float):
        self.cluster = cluster
        self.ledger = ledger
        self.rngs = [random.Random(rng.random()) for _ in range(count)]
        self.interval = count / rate
        self.pub_timeout = pub_timeout
        self.on = False
        self.busy = 0
        self._turned_on = trio.Event()

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            for rng in self.rngs:
                nursery.start_soon(self._publisher, rng)
            task_status.started()

    def start(self) -> None:
        self.on = True
        self._turned_on.set()

    async def stop(self) -> None:
        """Stop publishing; returns once no publish is waiting for its answer."""
        self.on = False
        self._turned_on = trio.Event()
        with trio.fail_after(self.pub_timeout + 10):
            while self.busy:
                await trio.sleep(0.02)

    async def _publisher(self, rng: random.Random) -> None:
        client: V2Client | None = None
        node: Node | None = None
        left = 0
        next_at = trio.current_time()

        async def close() -> None:
            nonlocal client
            if client is not None:
                with trio.CancelScope(shield=True):
                    await client.aclose()
            client = None

        try:
            while True:
                if not self.on:
                    await close()
                    await self._turned_on.wait()
                    next_at = trio.current_time()
                    continue
                if client is None or left <= 0 or node is None or node.state != "up":
                    await close()
                    up = self.cluster.up()
                    if not up:
                        await trio.sleep(0.1)
                        continue
                    node, left = rng.choice(up), rng.randrange(1, 50)
                    try:
                        with trio.fail_after(3):
                            client = await connect(node.tcp, timeout=self.pub_timeout)
                    except DISCONNECTED:
                        client = None
                        await trio.sleep(0.05)
                        continue
                body = self.ledger.body()
                left -= 1
                self.busy += 1
                try:
                    answer = await pub(client, TOPIC, body, self.pub_timeout)
                except (*DISCONNECTED, AssertionError):
                    self.ledger.lose_track()
                    await close()
                    continue
                finally:
                    self.busy -= 1
                if answer == "OK":
                    self.ledger.ack(body, trio.current_time(), node.name)
                else:
                    self.ledger.refuse(body, answer, node.name)
                    if not answer.startswith("E_PUB_FAILED"):
                        await close()  # another error: probably fatal, the connection is closing
                next_at = max(next_at + self.interval, trio.current_time() - 1.0)
                await trio.sleep_until(next_at)  # the publishing rate
        finally:
            await close()


@dataclass
class RoundResult:
    round: int
    action: str
    nodes: list[str]
    consumers_held: bool
    acknowledged: int = 0
    refused: int = 0
    unconfirmed: int = 0
    delivered: int = 0
    lost: int = 0
    lost_by_channel: dict[str, int] = field(default_factory=dict)
    deliveries: int = 0
    duplicated: int = 0
    #: partitions: bodies delivered on a channel from the partition on by both sides (None: no partition)
    both_sides: int | None = None
    #: of those, the bodies the smaller side delivered after the other side had (after a takeover)
    minority_late: int | None = None
    outstanding: int = 0
    recovery_s: float | None = None
    restored_s: float = 0.0
    #: outstanding pairs that arrived only after the node was back, by the node that had acknowledged them
    #: (a takeover brings the dead node's copies before that)
    late_by_publisher: dict[str, int] = field(default_factory=dict)
    #: nodes whose process ended by itself during the round (restarted with the round's victims)
    crashed: list[str] = field(default_factory=list)
    settle_s: float = 0.0
    seconds: float = 0.0
    replication: dict[str, dict] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)


class Chaos:
    def __init__(self, root: Path, nodes: int, replicas: int, rounds: int, *, replica_timeout: str, durable: bool,
                 channels: int, publishers: int, rate: float, seed: int, settle: float, actions: tuple[str, ...],
                 schedule: tuple[str, ...], progress):
        self.rounds = rounds
        self.replicas = replicas
        self.timeout_s = seconds(replica_timeout)
        self.settle = settle
        self.progress = progress
        self.rng = random.Random(seed)
        self.actions = [a for a in actions if a not in PAIRS or (replicas >= 3 and nodes >= 3)]
        self.schedule = schedule
        partitions = any(a.partition(":")[0] in PARTITIONS for a in (*self.actions, *schedule))
        # partitions: each node on its own address, which the firewall tells apart
        self.cluster = ReplicaCluster(root, nodes, replicas=replicas,
                                      replica_timeout=replica_timeout if replicas > 1 else None, durable=durable,
                                      own_ips=partitions)
        self.ledger = Ledger()
        self.channels = [f"c{n}" for n in range(channels)]
        self.consumers: list[Consumer] = []
        # a publish the minority of a partition could not confirm is answered once it reaches a majority again
        outage = 3.5 * self.timeout_s + 1.0
        self.publishers = Publishers(self.cluster, self.ledger, self.rng, publishers, rate,
                                     pub_timeout=outage + 2 * self.timeout_s + 10 if partitions
                                     else 2 * self.timeout_s + 5)
        self.partition: Partition | None = None  # the round's, while it is in force
        self.given_up: set[bytes] = set()  # bodies a round's settle gave up on
        self.results: list[RoundResult] = []
        self.crashes: list[dict] = []
        self.started = 0.0
        self._wall_offset = 0.0  # time.time() - trio.current_time()

    def _clock(self, when: float) -> str:
        """A Trio time as the wall clock the nodes' logs show."""
        wall = when + self._wall_offset
        return time.strftime("%H:%M:%S", time.localtime(wall)) + f".{int(wall % 1 * 1000):03d}"

    def say(self, text: str) -> None:
        if self.progress is not None:
            self.progress(text)

    async def run(self) -> dict:
        started = time.monotonic()
        await trio.to_thread.run_sync(self.cluster.start)
        try:
            await self.cluster.create(TOPIC, self.channels)
            await self.cluster.wait_registered(TOPIC, self.cluster.nodes)
            await self.cluster.wait_replicating()
            async with trio.open_nursery() as nursery:
                for channel in self.channels:
                    consumer = Consumer(TOPIC, channel, lookupd_http=self.cluster.lookupd.http)
                    self.consumers.append(consumer)
                    await nursery.start(consumer.run)
                await nursery.start(self.publishers.run)
                nursery.start_soon(self._watch)
                self.started = trio.current_time()
                self._wall_offset = time.time() - self.started
                for number in range(1, self.rounds + 1):
                    self.ledger.round = number
                    result = await self._round(number)
                    self.results.append(result)
                    self.say(_row(result))
                final_settle = await self._final_settle()
                nursery.cancel_scope.cancel()
            return self._summary(time.monotonic() - started, final_settle)
        finally:
            try:
                if self.partition is not None:
                    self.partition.remove()
            finally:
                await trio.to_thread.run_sync(self.cluster.stop)

    async def _publish_for(self, count: int, limit: float) -> None:
        """Let the publishers run until ``count`` more bodies are acknowledged or ``limit`` seconds pass."""
        target = len(self.ledger.acked) + count
        with trio.move_on_after(limit):
            while len(self.ledger.acked) < target:
                await trio.sleep(0.05)

    async def _watch(self) -> None:
        """Note every node that exits by itself (a crash: it was neither killed nor paused)."""
        while True:
            for node in self.cluster.nodes:
                status = node.exited()
                if status is None:
                    continue
                node.state = "down"  # restarted with the round's victims
                self.crashes.append({"round": self.ledger.round, "node": node.name, "status": status,
                                     "at_s": round(trio.current_time() - self.started, 2),
                                     "log_tail": node.log_tail(12).splitlines()})
                self.say(f"round {self.ledger.round}: {node.name} exited by itself with status {status}")
            status = self.cluster.lookupd_exited()
            if status is not None:  # not the nodes' doing, but everything depends on it: noted, started again
                self.crashes.append({"round": self.ledger.round, "node": "nsqlookupd", "status": status,
                                     "at_s": round(trio.current_time() - self.started, 2), "log_tail": []})
                self.say(f"round {self.ledger.round}: nsqlookupd exited with status {status}; starting it again")
                await trio.to_thread.run_sync(self.cluster.lookupd.start)
            await trio.sleep(0.2)  # a process's exit is no event this loop can wait on

    async def _final_settle(self) -> float:
        """After the last round: wait (``settle`` seconds at most) for the bodies the rounds gave up on too."""
        began = trio.current_time()
        with trio.move_on_after(self.settle):
            while any(self._missing(self.ledger.acked).values()):
                await trio.sleep(0.1)
        return round(trio.current_time() - began, 2)

    def _missing(self, bodies) -> dict[str, list[bytes]]:
        return {c.channel: c.deliveries.missing(bodies) for c in self.consumers}

    async def _settle(self) -> float:
        """Wait until every acknowledged body (but those given up on) is delivered on every channel."""
        began = trio.current_time()
        wanted = [b for b in self.ledger.acked if b not in self.given_up]
        with trio.move_on_after(self.settle):
            while any(self._missing(wanted).values()):
                await trio.sleep(0.1)
        return trio.current_time() - began

    async def _round(self, number: int) -> RoundResult:
        rng = self.rng
        began = trio.current_time()
        action = rng.choice(self.actions)
        held = rng.random() < 0.5
        if self.schedule:  # the round's action (and whether the consumers are held) given instead
            action, _, hold = self.schedule[(number - 1) % len(self.schedule)].partition(":")
            held = {"held": True, "live": False}.get(hold, held)
        deliveries_before = sum(c.deliveries.total for c in self.consumers)
        extra_before = sum(c.deliveries.extra for c in self.consumers)
        if held:
            for consumer in self.consumers:
                await consumer.hold()
        self.publishers.start()
        await self._publish_for(rng.randrange(100, 400), limit=3.0)

        up = self.cluster.up()
        if action in PARTITIONS:  # the smaller side: one node, or with five nodes or more sometimes two
            nodes = self.cluster.nodes
            victims = rng.sample(nodes, 1 if len(nodes) < 5 or rng.random() < 0.5 else (len(nodes) - 1) // 2)
        else:
            victims = rng.sample(up, min(2 if action in PAIRS else 1, len(up)))
        result = RoundResult(round=number, action=action, nodes=[v.name for v in victims], consumers_held=held)
        death = trio.current_time()
        if action in PARTITIONS:
            others = [node for node in self.cluster.nodes if node not in victims]
            self.partition = Partition(action.removeprefix("partition-"), victims, others).apply()
        for victim in victims if action not in PARTITIONS else ():
            if action == "pause":
                victim.pause()
            else:
                victim.kill()
                if action in ("wipe", "wipe2"):
                    victim.wipe()
        if held:
            for consumer in self.consumers:
                await consumer.release()
        self.say(f"round {number}: {action} {', '.join(result.nodes)}{' (consumers held)' if held else ''}")
        # the outage: how long the nemesis keeps the node down is the experiment's parameter
        await trio.sleep(self.timeout_s * rng.uniform(1.5, 3.5) + 1.0)
        if self.partition is not None:
            self.partition.remove()
            self.partition = None
        result.crashed = [c["node"] for c in self.crashes if c["round"] == number]
        for victim in victims:
            if victim.state == "paused":
                victim.resume()
        for node in self.cluster.nodes:
            if node.state == "down":  # the victims, and any node that crashed
                await node.astart()
        result.restored_s = round(trio.current_time() - death, 2)
        await self._publish_for(rng.randrange(50, 200), limit=2.0)
        await self.publishers.stop()

        result.settle_s = round(await self._settle(), 2)
        outstanding = self._outstanding(death, {v.name for v in victims})
        mine = [body for body, (_, r, _) in self.ledger.acked.items() if r == number]
        missing = self._missing(mine)
        lost = set().union(*missing.values()) if missing else set()
        self.given_up |= lost
        result.acknowledged = len(mine)
        result.refused = self.ledger.refused_by_round[number]
        result.unconfirmed = self.ledger.unconfirmed_by_round[number]
        result.lost = len(lost)
        result.delivered = len(mine) - len(lost)
        result.lost_by_channel = {channel: len(bodies) for channel, bodies in missing.items()}
        result.deliveries = sum(c.deliveries.total for c in self.consumers) - deliveries_before
        result.duplicated = sum(c.deliveries.extra for c in self.consumers) - extra_before
        result.outstanding = len(outstanding)
        arrivals = [c.deliveries.first.get(body) for c, body in outstanding]
        if outstanding and all(t is not None for t in arrivals):
            result.recovery_s = round(max(t for t in arrivals if t is not None) - death, 2)
        result.examples = [f"lost {body!r} on {channel}" for channel, bodies in missing.items() for body in bodies[:3]]
        late = [(c, body, t) for (c, body), t in zip(outstanding, arrivals) if t is not None and t - death > result.restored_s]
        result.late_by_publisher = dict(Counter(self.ledger.acked[body][2] for _, body, _ in late))
        names = {node.address: node.name for node in self.cluster.nodes}
        result.examples += [f"{body.decode()} acknowledged by {self.ledger.acked[body][2]} at "
                            f"{self.ledger.acked[body][0] - death:+.2f} s, delivered on {c.channel} by "
                            f"{names.get(c.deliveries.first_node[body], '?')} at {t - death:+.2f} s"
                            for c, body, t in late[:5]]
        if action in PARTITIONS:
            minority = [victim.address for victim in victims]
            both = [(c, body) for c in self.consumers for body in c.deliveries.delivered_by_both(minority, since=death)]
            result.both_sides = len(both)
            both.sort(key=lambda pair: not _minority_late(pair[0].deliveries, pair[1], set(minority)))  # those first
            result.minority_late = sum(1 for c, body in both if _minority_late(c.deliveries, body, set(minority)))
            result.examples += [f"{body.decode()} delivered on {c.channel} by " + ", ".join(
                f"{names.get(node, node)} at {when - death:+.2f} s" for when, node in c.deliveries.deliveries_of(body))
                for c, body in both[:3]]
        twice = [(c, body) for c in self.consumers for body, times in c.deliveries.again.items()
                 if times[-1][0] >= began][:3]
        result.examples += [f"{body.decode()} delivered twice on {c.channel}: " + ", ".join(
            f"by {names.get(node, node)} at {when - death:+.2f} s" for when, node in c.deliveries.deliveries_of(body))
            for c, body in twice]
        for node in self.cluster.up():
            stats = await node.stats(TOPIC)
            topics = (stats or {}).get("topics") or []
            if topics and "replication" in topics[0]:
                result.replication[node.name] = topics[0]["replication"]
        result.crashed = [c["node"] for c in self.crashes if c["round"] == number]
        result.seconds = round(trio.current_time() - began, 1)
        return result

    def _outstanding(self, death: float, victims: set[str]) -> list[tuple[Consumer, bytes]]:
        """The (consumer, body) pairs acknowledged but not delivered on its channel when the node died: acknowledged
        before the death, or by a victim within a second after it (its OK was on its way), and first delivered
        after it, or never."""
        pairs = []
        for body, (when, _, node) in self.ledger.acked.items():
            if body in self.given_up or (when > death and (node not in victims or when > death + 1.0)):
                continue
            for consumer in self.consumers:
                first = consumer.deliveries.first.get(body)
                if first is None or first > death:
                    pairs.append((consumer, body))
        return pairs

    def _summary(self, elapsed: float, final_settle: float) -> dict:
        acked = list(self.ledger.acked)
        missing = self._missing(acked)
        lost_at_end = set().union(*missing.values()) if missing else set()
        deliveries = sum(c.deliveries.total for c in self.consumers)
        duplicated = sum(c.deliveries.extra for c in self.consumers)
        recoveries = [r.recovery_s for r in self.results if r.recovery_s is not None]
        refused_delivered = sorted((body for body in self.ledger.refused_bodies
                                    if any(body in c.deliveries.first for c in self.consumers)), key=int)
        names = {node.address: node.name for node in self.cluster.nodes}
        by_action: dict[str, dict] = {}
        for r in self.results:
            row = by_action.setdefault(r.action, {"rounds": 0, "acknowledged": 0, "refused": 0, "lost": 0,
                                                  "deliveries": 0, "duplicated": 0, "both_sides": 0,
                                                  "minority_late": 0})
            row["rounds"] += 1
            for name in ("acknowledged", "refused", "lost", "deliveries", "duplicated"):
                row[name] += getattr(r, name)
            row["both_sides"] += r.both_sides or 0
            row["minority_late"] += r.minority_late or 0
        for name, row in by_action.items():
            if name not in PARTITIONS:
                del row["both_sides"], row["minority_late"]
        problems = {node.name: node.log_lines("Traceback", "ERROR", "FATAL", "WARN") for node in self.cluster.nodes}
        return {
            "config": {"nodes": len(self.cluster.nodes), "replicas": self.replicas, "rounds": self.rounds,
                       "replica_timeout_s": self.timeout_s, "durable": self.cluster.durable,
                       "channels": self.channels, "root": str(self.cluster.root)},
            "rounds": [asdict(r) for r in self.results],
            "summary": {
                "acknowledged": len(acked),
                "refused": dict(self.ledger.refused),
                "refusal_examples": self.ledger.refusals[:5],
                "unconfirmed": self.ledger.unconfirmed,
                "lost_in_rounds": sum(r.lost for r in self.results),
                "lost_at_end": len(lost_at_end),
                "lost_examples": [body.decode() for body in sorted(lost_at_end, key=int)[:10]],
                "rounds_with_loss": [r.round for r in self.results if r.lost],
                "refused_delivered": len(refused_delivered),
                "refused_delivered_examples": [
                    f"{body.decode()} refused by {self.ledger.refused_bodies[body][0]} "
                    f"({self.ledger.refused_bodies[body][1]}), delivered on " + ", ".join(
                        f"{c.channel} by {names.get(node, node)} at {self._clock(when)}"
                        for c in self.consumers for when, node in c.deliveries.deliveries_of(body))
                    for body in refused_delivered[:10]],
                "both_sides": sum(r.both_sides or 0 for r in self.results),
                "rounds_with_both_sides": [r.round for r in self.results if r.both_sides],
                "minority_late": sum(r.minority_late or 0 for r in self.results),
                "by_action": by_action,
                "final_settle_s": final_settle,
                "late_after_restore": sum(sum(r.late_by_publisher.values()) for r in self.results),
                "crashes": self.crashes,
                "deliveries": deliveries,
                "duplicated": duplicated,
                "duplicate_ratio": round(duplicated / deliveries, 5) if deliveries else 0.0,
                "deliveries_by_node": {c.channel: dict(c.deliveries.by_node) for c in self.consumers},
                "consumer_errors": sum(len(c.errors) for c in self.consumers),
                "consumer_error_examples": [e for c in self.consumers for e in c.errors][:5],
                "recovery_s_max": max(recoveries) if recoveries else None,
                "recovery_s_median": round(statistics.median(recoveries), 2) if recoveries else None,
                "log_problem_lines": {name: len(lines) for name, lines in problems.items()},
                "log_problem_examples": {name: lines[:5] for name, lines in problems.items() if lines},
                "seconds": round(elapsed, 1),
            },
        }


async def run_chaos_async(root: Path, nodes: int, replicas: int, rounds: int, *, replica_timeout: str = "2s",
                          durable: bool = False, channels: int = 1, publishers: int = 2, rate: float = 200.0,
                          seed: int = 20261127, settle: float = 60.0, actions: tuple[str, ...] = (*ACTIONS, *PAIRS),
                          schedule: tuple[str, ...] = (), progress=None) -> dict:
    """Run the chaos rounds on a cluster under ``root`` and return what the clients saw (see the module).

    Each round's action is chosen at random from ``actions``, or taken from ``schedule`` (cycled):
    ``"wipe"``, or ``"wipe:held"``/``"wipe:live"`` to say whether the consumers are held too."""
    chaos = Chaos(root, nodes, replicas, rounds, replica_timeout=replica_timeout, durable=durable, channels=channels,
                  publishers=publishers, rate=rate, seed=seed, settle=settle, actions=actions, schedule=schedule,
                  progress=progress)
    return await chaos.run()


def run_chaos(root: Path, nodes: int, replicas: int, rounds: int, **options) -> dict:
    """:func:`run_chaos_async` in a new Trio run."""
    return trio.run(lambda: run_chaos_async(root, nodes, replicas, rounds, **options))


_COLUMNS = ["round", "action", "nodes", "consumers_held", "acknowledged", "refused", "unconfirmed", "lost",
            "deliveries", "duplicated", "both_sides", "minority_late", "outstanding", "recovery_s", "restored_s", "crashed", "settle_s", "seconds"]


def _minority_late(deliveries: Deliveries, body: bytes, minority: set[str]) -> bool:
    """Whether a node of ``minority`` delivered ``body`` after a node outside it had."""
    seen = deliveries.deliveries_of(body)
    first_other = min((when for when, node in seen if node not in minority), default=None)
    return first_other is not None and any(when > first_other for when, node in seen if node in minority)


def _row(result: RoundResult) -> str:
    return "  ".join(f"{name}={getattr(result, name)}" for name in _COLUMNS)


def table(report: dict) -> str:
    rows = [[",".join(r[name]) if isinstance(r[name], list) else str(r[name]) for name in _COLUMNS]
            for r in report["rounds"]]
    head = [name.replace("consumers_", "") for name in _COLUMNS]
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    return "\n".join(" | ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in [head, *rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--replica-timeout", default="2s", help="Go duration (default 2s)")
    parser.add_argument("--durable", action="store_true", help="run the nodes with --durable")
    parser.add_argument("--channels", type=int, default=1, choices=(1, 2))
    parser.add_argument("--publishers", type=int, default=2)
    parser.add_argument("--rate", type=float, default=200.0, help="messages a second, all publishers (default 200)")
    parser.add_argument("--settle", type=float, default=60.0,
                        help="seconds a round waits at most for every acknowledged message (default 60)")
    parser.add_argument("--actions", default=",".join((*ACTIONS, *PAIRS)),
                        help="comma-separated nemesis actions to choose from (kill2, wipe2 only with replicas >= 3; "
                             f"also {', '.join(PARTITIONS)}, which need root and iptables)")
    parser.add_argument("--schedule", default="",
                        help="comma-separated actions for the rounds in turn instead (action or action:held/live)")
    parser.add_argument("--seed", type=int, default=20261127)
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON to PATH ('-': stdout)")
    parser.add_argument("--workdir", metavar="DIR", help="keep the cluster's data and logs under DIR")
    args = parser.parse_args(argv)
    actions = tuple(args.actions.split(","))
    schedule = tuple(args.schedule.split(",")) if args.schedule else ()
    for action in (*actions, *schedule):
        name, _, hold = action.partition(":")
        if name not in (*ACTIONS, *PAIRS, *PARTITIONS) or hold not in ("", "held", "live"):
            parser.error(f"unknown action {action!r}")
        if name in PARTITIONS and (missing := partitions_missing(name.removeprefix("partition-"))) is not None:
            parser.error(f"{name}: {missing}")
    if args.replicas > args.nodes:
        parser.error("--replicas must not exceed --nodes")

    def progress(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    options = dict(replica_timeout=args.replica_timeout, durable=args.durable, channels=args.channels,
                   publishers=args.publishers, rate=args.rate, seed=args.seed, settle=args.settle, actions=actions,
                   schedule=schedule, progress=progress)
    if args.workdir:
        report = run_chaos(Path(args.workdir), args.nodes, args.replicas, args.rounds, **options)
    else:
        with tempfile.TemporaryDirectory(prefix="chaos-replication-") as tmp:
            report = run_chaos(Path(tmp), args.nodes, args.replicas, args.rounds, **options)
    if args.json == "-":
        print(json.dumps(report, indent=1))
    else:
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1))
        print(table(report))
        print(json.dumps(report["summary"], indent=1))
    summary = report["summary"]
    return 1 if summary["lost_at_end"] or summary["lost_in_rounds"] or summary["refused_delivered"] or \
        summary["crashes"] else 0


if __name__ == "__main__":
    sys.exit(main())
