"""Power cuts under ``pynsqd --durable``: every acknowledged message is delivered after the
restart, and no deferred message before its due time.

An in-process durable broker with small segments and frequent checkpoints runs a seeded
random workload, recorded by ``tests/support/powercut.py`` (its disk queues and
``nsqd.dat`` go through the recording file layer): publishers send PUB, MPUB and DPUB
(deferred 50-400 ms, or 30 minutes) and wait for each ``OK``, mostly to a topic with two
channels that exist from the start, sometimes to a topic whose only channel is created
once publishing is over; one consumer per channel FINs, REQs (now or after a delay) or
holds each delivery until it times out, until it has finished every message. Then, at
crash points of the record (``Recorder.crash_points``: anywhere, right after an ``OK``,
right after a checkpoint, right after a file creation or rename), the data directory is
rebuilt as a power cut there could leave it, and a broker started on it is drained. A third
of the crash points are kills instead: the broker restarts on everything the killed one
wrote (fsynced or not), that restart and its drain are recorded in turn, and a power cut
at one of its crash points is drained by a third broker.

The power-cut model is the one of ``tests/unit/test_power_loss_diskqueue.py``: only what
was fsynced is stable (each unsynced write kept, dropped, torn, lost by sectors or
zero-filled; each name change not followed by a directory fsync kept or not), tried as
random cuts and as the two extremes.

The promises checked after each restart:

* acknowledged: a publish whose ``OK`` was read (in durable mode ``OK`` waits for the
  topic's group commit and the metadata naming the topic and its channels). Each
  acknowledged message is delivered on each channel of its topic, at least once, unless
  the consumer of that channel had sent ``FIN`` for it before the cut (it may come back:
  a duplicate);
* a message deferred by 30 minutes is never delivered, and ``/channel/peek`` shows it
  deferred with its due time; any other DPUB is delivered no earlier than its due time,
  before and after the cut;
* the restart never fails, and the broker settles (nothing in flight, nothing ready,
  nothing deferred but the long deferrals).

Duplicates are counted and printed: messages finished before the cut and delivered again,
deliveries of one message more than once by one broker, messages delivered that were never
acknowledged. Run longer as the disk queue's simulation says (the
same variables; ``PYNSQD_POWERCUT_POINTS`` counts crash points here too, ``POINTS_PER_RUN``
per recorded run)::

    PYNSQD_POWERCUT_POINTS=400 PYNSQD_POWERCUT_SEED=random python -m pytest -q -s \\
        -p no:cacheprovider tests/integration/test_power_loss_broker.py
"""

from __future__ import annotations

import random
import time
from collections import Counter
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import trio

from broker.protocol import encode_dpub, encode_fin, encode_mpub, encode_pub, encode_req
from tests.support.draining import drain
from tests.support.http_client import request
from tests.support.powercut import BROKER_FLAGS, Disk, Recorder, check_model, crash_points, first_seed, write_directory
from tests.support.v2client import connect, subscriber

#: (topic, channel) of every consumer group; "events:late" is created after the publishes.
SUBSCRIPTIONS = (("orders", "billing"), ("orders", "audit"), ("events", "late"))
TOPICS = ("orders", "events")
#: Crash points per recorded run.
POINTS_PER_RUN = 8
#: Crash points in the CI run.
CI_POINTS = 16
PUBLISHERS = 3
PUBLISHES = 40
LONG_DEFER_MS = 30 * 60 * 1000
#: How far a delivery may precede its due time: clock reads on either side of the socket.
SLACK_NS = 2_000_000

Subscription = tuple[str, str]


@dataclass
class Promises:
    """What the marks before a crash point promise: acknowledged bodies per topic, FINs sent per channel."""

    acked: dict[str, set[bytes]] = field(default_factory=lambda: {t: set() for t in TOPICS})
    finished: dict[Subscription, set[bytes]] = field(default_factory=lambda: {s: set() for s in SUBSCRIPTIONS})

    def apply(self, event: tuple) -> None:
        if event[0] == "acked":
            self.acked[event[1]].update(event[2])
        elif event[0] == "fin":
            self.finished[event[1]].add(event[2])

    def owed(self, sub: Subscription) -> set[bytes]:
        return self.acked[sub[0]] - self.finished[sub]


def promised(marks: list[tuple[int, tuple]], point: int, promises: Promises | None = None) -> Promises:
    """``promises`` (or new ones) updated with the marks recorded before ``point``."""
    promises = promises or Promises()
    for i, event in marks:
        if i < point:
            promises.apply(event)
    return promises


@dataclass
class Workload:
    """What the live run's clients did: messages acknowledged and finished, due times asked for."""

    done: Promises = field(default_factory=Promises)
    due: dict[bytes, int] = field(default_factory=dict)  # DPUB body -> earliest wall time it may arrive
    long: set[bytes] = field(default_factory=set)  # deferred by LONG_DEFER_MS
    early: list[str] = field(default_factory=list)
    published: trio.Event = field(default_factory=trio.Event)

    def delivered(self, body: bytes, sub: Subscription, when: str) -> None:
        now = time.time_ns()
        due = self.due.get(body)
        if due is not None and now < due - SLACK_NS:
            self.early.append(f"{body!r} on {sub} {when}, {(due - now) / 1e6:.0f} ms before its due time")

    def consumed(self, sub: Subscription) -> bool:
        """Publishing is over and every message was finished on ``sub`` (but the long deferrals)."""
        return self.published.is_set() and not self.done.owed(sub) - self.long


async def publisher(d, number: int, rng: random.Random, recorder: Recorder, workload: Workload) -> None:
    client = await connect(d.addresses.tcp)
    for op in range(PUBLISHES):
        topic = "events" if rng.random() < 0.2 else "orders"
        name = b"%s-p%d-%d" % (topic[0].encode(), number, op)
        roll = rng.random()
        if roll < 0.4:
            bodies = [name]
            command = encode_pub(topic, name)
        elif roll < 0.7:
            bodies = [b"%s-%d" % (name, k) for k in range(rng.randrange(2, 7))]
            command = encode_mpub(topic, bodies)
        else:
            defer_ms = LONG_DEFER_MS if roll > 0.9 else rng.randrange(50, 400)
            bodies = [b"%s-deferred-%d" % (name, defer_ms)]
            command = encode_dpub(topic, defer_ms, bodies[0])
            workload.due[bodies[0]] = time.time_ns() + defer_ms * 1_000_000
            if defer_ms == LONG_DEFER_MS:
                workload.long.add(bodies[0])
        await client.send(command)
        await client.expect_response(b"OK")
        recorder.mark(("acked", topic, bodies))
        workload.done.apply(("acked", topic, bodies))
    await client.aclose()


async def consumer(d, sub: Subscription, rng: random.Random, recorder: Recorder, workload: Workload,
                   *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """FIN most deliveries, REQ some (now or later), hold some until they time out; until
    every message published was finished."""
    client = await subscriber(d, topic=sub[0], channel=sub[1], rdy=20)
    task_status.started()
    while not workload.consumed(sub):
        for msg in await client.sync():
            workload.delivered(msg.body, sub, "before the cut")
            roll = rng.random()
            if roll < 0.6:
                recorder.mark(("fin", sub, msg.body))  # from now on it may be gone
                workload.done.apply(("fin", sub, msg.body))
                await client.send(encode_fin(msg.id))
            elif roll < 0.75:
                await client.send(encode_req(msg.id, 0))
            elif roll < 0.95:
                await client.send(encode_req(msg.id, rng.randrange(50, 300)))
        await trio.sleep(0.005)  # polls: what is released later (deferred, requeued) has no event to wait on
    await client.aclose()


async def record_run(start_daemon, path: Path, rng: random.Random, workload: Workload) -> Recorder:
    """Run the workload on a broker in ``path`` under a recorder; returns the recorder."""
    path.mkdir()
    recorder = Recorder(path)
    early, late = SUBSCRIPTIONS[:2], SUBSCRIPTIONS[2:]
    with recorder.installed(), trio.fail_after(60):
        async with start_daemon(*BROKER_FLAGS, data_path=path) as d:
            async with trio.open_nursery() as consumers:
                for sub in early:  # these channels exist before the first publish
                    await consumers.start(consumer, d, sub, random.Random(rng.random()), recorder, workload)
                async with trio.open_nursery() as publishers:
                    for number in range(PUBLISHERS):
                        publishers.start_soon(publisher, d, number, random.Random(rng.random()), recorder, workload)
                workload.published.set()
                for sub in late:  # this one gets the backlog its topic kept for its first channel
                    await consumers.start(consumer, d, sub, random.Random(rng.random()), recorder, workload)
    return recorder


def settled(d) -> bool:
    """Nothing ready, in flight or due soon on any channel, nothing left in the topics."""
    later = time.time_ns() + 60 * 1_000_000_000
    for name, channel_name in SUBSCRIPTIONS:
        topic = d.broker.topics.get(name)
        if topic is None or topic.depth:
            return False
        channel = topic.channels.get(channel_name)
        if channel is None or channel.depth or channel.in_flight:
            return False
        if any(msg.due_ns < later for msg in channel.deferred.values()):
            return False
    return True


async def drain_restarted(start_daemon, path: Path, workload: Workload,
                          recorder: Recorder | None = None) -> tuple[dict, dict]:
    """Start a broker on ``path``, FIN everything each channel delivers until it settles;
    returns the deliveries per channel and the deferred messages ``/channel/peek`` shows.
    With ``recorder`` the run is recorded (and each FIN marked)."""
    delivered: dict[Subscription, Counter[bytes]] = {sub: Counter() for sub in SUBSCRIPTIONS}
    deferred: dict[Subscription, dict[bytes, int]] = {}
    with recorder.installed() if recorder is not None else nullcontext():
        async with start_daemon(*BROKER_FLAGS, data_path=path) as d:
            # a long timeout: nothing times out while the drain looks at another channel
            clients = {sub: await subscriber(d, topic=sub[0], channel=sub[1], rdy=200, msg_timeout=60_000)
                       for sub in SUBSCRIPTIONS}
            subs = {client: sub for sub, client in clients.items()}

            def fin(client, msg) -> None:
                sub = subs[client]
                workload.delivered(msg.body, sub, "after the restart")
                delivered[sub][msg.body] += 1
                if recorder is not None:
                    recorder.mark(("fin", sub, msg.body))

            with trio.fail_after(20):
                await drain(clients.values(), lambda: settled(d), on_message=fin)
            for topic, channel in SUBSCRIPTIONS:
                reply = await request(d.addresses.http, "GET",
                                      f"/channel/peek?topic={topic}&channel={channel}&state=deferred&n=1000")
                assert reply.status == 200, reply
                deferred[topic, channel] = {m["body"].encode(): m["due"] for m in reply.json()["messages"]}
            for client in clients.values():
                await client.aclose()
    return delivered, deferred


@dataclass
class Tally:
    """What the restarts found."""

    tried: int = 0
    killed: int = 0
    finished: int = 0  # messages finished before the cut, delivered again
    repeated: int = 0  # second and later deliveries of a message by one broker
    unacked: int = 0  # messages delivered that were never acknowledged

    def check(self, promises: Promises, workload: Workload, delivered: dict, deferred: dict) -> None:
        """Every owed message delivered on every channel of its topic, or held deferred
        until its due time; nothing deferred for long delivered; nothing delivered early."""
        for sub in SUBSCRIPTIONS:
            owed = promises.owed(sub)
            held = {body for body in owed & workload.long
                    if deferred[sub].get(body, 0) >= workload.due[body] - SLACK_NS}
            got = set(delivered[sub])
            missing = sorted(owed - got - held)
            assert not missing, f"{sub}: {len(missing)} acknowledged message(s) lost: {missing}"
            too_soon = sorted(got & workload.long)
            assert not too_soon, f"{sub}: delivered 30 minutes early: {too_soon}"
            self.finished += len(got & promises.finished[sub])
            self.repeated += sum(delivered[sub].values()) - len(got)
            self.unacked += len(got - promises.acked[sub[0]])
        assert not workload.early, workload.early


async def test_power_cuts_lose_no_acknowledged_message(start_daemon, tmp_path: Path) -> None:
    points, seed = crash_points(CI_POINTS), first_seed()
    print(f"\npower cuts under pynsqd --durable: seed {seed}, {points} crash points")
    tally = Tally()
    for run in range(-(-points // POINTS_PER_RUN)):
        base = tmp_path / f"run{run}"
        base.mkdir()
        workload = Workload()
        recorder = await record_run(start_daemon, base / "live", random.Random(seed + run), workload)
        rng = random.Random(f"{seed + run} cuts")  # the workload's tasks draw in no fixed order
        assert not workload.early, workload.early
        check_model(Disk(recorder.initial), recorder, base / "live")
        marks = recorder.marks()
        disk = Disk(recorder.initial)
        for n, point in enumerate(recorder.crash_points(min(POINTS_PER_RUN, points - run * POINTS_PER_RUN), rng)):
            disk.advance(recorder.ops, point)
            promises = promised(marks, point)
            killed = rng.random() < 1 / 3
            mode = "kept" if killed else rng.choices(["random", "kept", "lost"], weights=[6, 2, 2])[0]
            files, choices = disk.power_cut(rng, mode)
            kept = write_directory(base / f"cut{n}", files)
            target = write_directory(base / f"cut{n}-recovered", files)
            context = (f"seed {seed} run {run}, crash point {point} of {len(recorder.ops)}, "
                       f"{'killed' if killed else mode + ' cut'}: {'; '.join(choices) or '-'}\n"
                       f"the directory the cut left: {kept}\noperations before the cut:\n{recorder.trace(point)}")
            try:
                restart = Recorder(target) if killed else None
                tally.check(promises, workload, *await drain_restarted(start_daemon, target, workload, restart))
                if restart is not None:
                    # killed: the restart ran on the page cache's view; now the power fails during it
                    check_model(disk.killed(), restart, target)
                    after = disk.killed()
                    again = restart.crash_points(1, rng)[0]
                    after.advance(restart.ops, again)
                    files, choices = after.power_cut(rng, rng.choice(["random", "lost"]))
                    target = write_directory(base / f"cut{n}-restart", files)
                    context += (f"\nthen the restart was cut at {again} of {len(restart.ops)}: {'; '.join(choices)}"
                                f"\nits operations before the cut:\n{restart.trace(again)}")
                    promises = promised(restart.marks(), again, promises)
                    tally.check(promises, workload, *await drain_restarted(start_daemon, target, workload))
                    tally.killed += 1
            except BaseException as exc:
                raise AssertionError(f"{exc!r}\n{context}") from exc
            tally.tried += 1
    print(f"power cuts under pynsqd --durable: {tally.tried} crash points tried ({tally.killed} of them a kill, "
          f"then a power cut during the restart), nothing acknowledged lost; delivered again: {tally.finished} "
          f"finished before the cut, {tally.repeated} twice or more by one broker; {tally.unacked} never "
          f"acknowledged")
    assert tally.tried == points
