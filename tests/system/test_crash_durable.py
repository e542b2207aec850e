"""Crash tests: a real ``pynsqd --durable`` process killed with SIGKILL at random moments.

Several publishers (PUB, MPUB, DPUB) and consumers (FIN, REQ, REQ with a delay)
work against the broker while it is killed and restarted, round after round;
then a last run drains the channel. The contract checked:

* every message that got ``OK`` is finished by a consumer eventually: a crash
  re-delivers, it never loses (duplicates are allowed, and reported);
* a deferred message (DPUB) is never delivered before its due time, in any
  incarnation of the broker;
* a REQ with a delay keeps its due time across a crash once the broker has
  applied it (a separate test: in the random one a crash may leave two copies
  of a message, and a client cannot tell which copy it was given).

The random choices are seeded, so a failing run can be replayed.
"""

from __future__ import annotations

import random

import pytest
import trio

from broker.core.durability.restart import decode_done
from broker.protocol import (
    decode_message,
    encode_dpub,
    encode_fin,
    encode_mpub,
    encode_pub,
    encode_req,
)
from diskqueue.checkpoint import load_checkpoint
from diskqueue.format import meta_filename
from tests.support import crash_clients
from tests.support.draining import drain
from tests.support.http_client import request
from tests.support.ledger import Ledger
from tests.support.v2client import connect, subscriber
from tests.support.waiting import wait_for, wait_until

SEED = 20240611
ROUNDS = 10
#: Checkpoints far more often than the defaults (2 s / 2500 operations), so that
#: committed cursors reach the disk inside every round and the kills land between
#: commits, syncs and checkpoints rather than always before the first one.
FLAGS = ("--durable", "--msg-timeout=3s", "--sync-timeout=100ms", "--sync-every=200")
PUBLISHERS = 4
CONSUMERS = 2
STATS = "/stats?format=json&topic=crash&channel=c"

def _publishes(name: str, ledger: Ledger, rng: random.Random):
    """PUB, MPUB of 2-19 and DPUB by 100-1500 ms, at random; the bodies are named after ``name``."""
    def next_publish(seq: int) -> tuple[bytes, list[bytes]]:
        kind = rng.random()
        if kind < 0.15:
            defer_ms = rng.randrange(100, 1500)
            body = f"{name}-{seq}-d{defer_ms}".encode()
            ledger.defer(body, defer_ms)
            return encode_dpub("crash", defer_ms, body), [body]
        if kind < 0.5:
            bodies = [f"{name}-{seq + i}".encode() for i in range(rng.randrange(2, 20))]
            return encode_mpub("crash", bodies), bodies
        body = f"{name}-{seq}".encode()
        return encode_pub("crash", body), [body]

    return next_publish


def _answers(rng: random.Random):
    """FIN (90 %) or REQ with no delay or one of 50-800 ms (10 %)."""
    def answer() -> tuple[str, int]:
        if rng.random() < 0.1:
            return "REQ", rng.choice((0, rng.randrange(50, 800)))
        return "FIN", 0

    return answer


async def _round(proc, ledger: Ledger, rng: random.Random, kill_after: float) -> None:
    """Publish and consume (FIN, REQ) with several clients, then SIGKILL the broker."""
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        for _ in range(CONSUMERS):
            nursery.start_soon(crash_clients.consumer, proc.tcp, ledger, stop, "crash", "c", 200, _answers(random.Random(rng.random())))
        for i in range(PUBLISHERS):
            next_publish = _publishes(f"i{ledger.run}p{i}", ledger, random.Random(rng.random()))
            nursery.start_soon(crash_clients.publisher, proc.tcp, ledger, stop, next_publish)
        # The crash comes at a random moment of the traffic: that is what is tested.
        await trio.sleep(kill_after)
        proc.kill()
        stop.set()


async def _start_published(broker_process, data, bodies: list[bytes], *, rdy: int, flags: tuple[str, ...] = ()):
    """Start ``pynsqd --durable`` (with ``flags``) on ``data``, MPUB ``bodies`` to ``crash``, and
    subscribe a consumer of ``crash``/``c`` with ``rdy``. Returns the process and the consumer."""
    proc = broker_process("--durable", *flags, data_path=data)
    producer = await connect(proc.tcp)
    await producer.send(encode_mpub("crash", bodies))
    await producer.expect_response(b"OK")
    return proc, await subscriber(proc, "crash", "c", rdy=rdy)


def _channel_is_empty(doc: dict) -> bool:
    """The ``crash``/``c`` channel of a ``/stats`` answer holds nothing: nothing more can be delivered."""
    (channel,) = doc["topics"][0]["channels"]
    return (channel["depth"], channel["in_flight_count"], channel["deferred_count"]) == (0, 0, 0)


async def _drain(proc, ledger: Ledger, want: set[bytes], timeout: float) -> None:
    """Consume (and FIN) until every body of ``want`` is finished and the channel holds nothing more.

    Stops after ``timeout`` seconds at the latest, so that what is missing is reported.
    """
    def record(client, msg) -> None:
        ledger.delivered(msg.body)
        ledger.answered(msg.body, "FIN")

    async def done() -> bool:
        # duplicates, if any, are delivered before the channel is empty
        return want <= ledger.finished and _channel_is_empty(await _stats(proc))

    client = await subscriber(proc, "crash", "c", rdy=200)
    with trio.move_on_after(timeout):
        await drain(client, done, on_message=record, poll=0.05)
    await client.aclose()


async def _restart_and_drain(broker_process, data, ledger: Ledger) -> None:
    """Start ``pynsqd --durable`` on ``data`` again and drain it: every acknowledged message is
    finished, none was delivered before its due time."""
    proc = broker_process("--durable", data_path=data)
    await _drain(proc, ledger, set(ledger.acked), timeout=15)
    proc.terminate()
    assert ledger.acked <= ledger.finished
    assert not ledger.early, ledger.early[:5]


async def test_kill_9_never_loses_an_acknowledged_message(broker_process, tmp_path):
    rng = random.Random(SEED)
    ledger = Ledger()
    data = tmp_path / "data"
    with trio.fail_after(90):
        for round_number in range(ROUNDS):
            ledger.run = round_number
            proc = broker_process(*FLAGS, data_path=data)
            await _round(proc, ledger, rng, rng.uniform(0.3, 1.5))
        ledger.run = ROUNDS
        proc = broker_process(*FLAGS, data_path=data)
        await _drain(proc, ledger, set(ledger.acked), timeout=20)
        proc.terminate()
    missing = ledger.acked - ledger.finished
    print(ledger.report(f"SIGKILL x{ROUNDS}"))
    assert len(ledger.acked) > 500, "the test published too little to mean anything"
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:5]}"
    assert not ledger.early, ledger.early[:5]


async def test_kill_9_keeps_deferred_due_times(broker_process, tmp_path):
    """DPUB'd messages killed before their due time come back after a restart, not before it."""
    data = tmp_path / "data"
    ledger = Ledger()
    with trio.fail_after(60):
        proc = broker_process("--durable", data_path=data)
        await subscriber(proc, "crash", "c", rdy=0)  # the channel exists, its messages wait
        producer = await connect(proc.tcp)
        for i in range(40):
            defer_ms = 4000 + 50 * i  # due well after the restarts below, even on a busy machine
            body = f"deferred-{i}".encode()
            ledger.defer(body, defer_ms)
            await producer.send(encode_dpub("crash", defer_ms, body))
            await producer.expect_response(b"OK")
            ledger.acked.add(body)
        proc.kill()
        for _ in range(2):  # crash once more while they are still waiting, once they are loaded
            proc = broker_process("--durable", data_path=data)
            await _wait_http(proc, STATS,
                             lambda doc: doc["topics"][0]["channels"][0]["deferred_count"] == 40)
            proc.kill()
        await _restart_and_drain(broker_process, data, ledger)


async def test_kill_9_keeps_the_delay_of_a_requeue(broker_process, tmp_path):
    """Messages REQ'd with a delay, killed while waiting, come back after the delay, not before."""
    data = tmp_path / "data"
    ledger = Ledger()
    bodies = [f"req-{i}".encode() for i in range(20)]
    with trio.fail_after(60):
        proc, consumer = await _start_published(broker_process, data, bodies, rdy=20)
        for msg in await consumer.read_messages(20):
            delay_ms = 1500 + 50 * int(msg.body.split(b"-")[1])
            ledger.defer(msg.body, delay_ms)
            await consumer.send(encode_req(msg.id, delay_ms))
        # applied once the broker counts them all as deferred
        await _wait_http(proc, STATS,
                         lambda doc: doc["topics"][0]["channels"][0]["deferred_count"] == 20)
        proc.kill()
        ledger.acked.update(bodies)
        await _restart_and_drain(broker_process, data, ledger)


async def test_kill_9_keeps_buried_messages(broker_process, tmp_path):
    data = tmp_path / "data"
    with trio.fail_after(60):
        proc, consumer = await _start_published(broker_process, data, [b"a", b"b", b"c"], rdy=10,
                                                 flags=("--max-attempts=1",))
        msgs = await consumer.read_messages(3)
        for msg in msgs:
            await consumer.send(encode_req(msg.id, 0))
        await _wait_http(proc, "/channel/peek?topic=crash&channel=c&state=buried",
                         lambda doc: doc["count"] == 3)
        proc.kill()
        proc = broker_process("--durable", "--max-attempts=1", data_path=data)
        doc = await _wait_http(proc, "/channel/peek?topic=crash&channel=c&state=buried", lambda doc: True)
        assert sorted(m["body"] for m in doc["messages"]) == ["a", "b", "c"]
        assert all(m["attempts"] == 1 for m in doc["messages"])
        proc.terminate()


async def _wait_http(proc, path: str, done, timeout: float = 5.0) -> dict:
    """GET ``path`` until the JSON answer satisfies ``done``; that answer."""

    async def answered() -> dict | None:
        reply = await request(proc.http, "GET", path)
        return reply.json() if reply.status == 200 and done(reply.json()) else None

    return await wait_until(answered, timeout)


async def _stats(proc) -> dict:
    """The ``/stats`` answer for the ``crash``/``c`` channel."""
    return await _wait_http(proc, STATS, lambda doc: True)


def _finished_in_checkpoint(data) -> int:
    """How many records of the ``crash``/``c`` queue its checkpoint on disk lists as finished
    past the committed cursor (0 before the first checkpoint)."""
    checkpoint, _ = load_checkpoint(str(data / meta_filename("crash:c")))
    if checkpoint is None:
        return 0
    return sum(end - first for first, end in decode_done(checkpoint.note, checkpoint.commit.seq))


@pytest.mark.parametrize("kind", ["MPUB", "PUB", "DPUB", "DPUB-due"])
async def test_kill_9_after_the_fan_out_does_not_copy_unconsumed_messages_twice(broker_process, tmp_path, kind):
    """Killed once the channel holds its copies, before the topic's checkpoint says so.

    Nobody consumed anything: after the restart the channel holds every message once.
    DPUB-due: deferred for 100 ms, so they are ready again (moved from the deferred
    store to the queue) when the broker is killed.
    """
    data = tmp_path / "data"
    bodies = [f"m{i}".encode() for i in range(5 if kind == "MPUB" else 20)]
    defer_ms = {"DPUB": 60_000, "DPUB-due": 100}.get(kind)
    stats = STATS

    def held(doc: dict) -> bool:
        channel = doc["topics"][0]["channels"][0]
        counts = channel["depth"], channel["deferred_count"]
        return counts == ((0, len(bodies)) if kind == "DPUB" else (len(bodies), 0))

    with trio.fail_after(60):
        proc = broker_process("--durable", data_path=data)
        for path in ("/topic/create?topic=crash", "/channel/create?topic=crash&channel=c"):
            assert (await request(proc.http, "POST", path)).status == 200
        producer = await connect(proc.tcp)
        if kind == "MPUB":
            await producer.send(encode_mpub("crash", bodies))
            await producer.expect_response(b"OK")
        for body in bodies if kind != "MPUB" else []:
            await producer.send(encode_pub("crash", body) if defer_ms is None else encode_dpub("crash", defer_ms, body))
            await producer.expect_response(b"OK")
        await _wait_http(proc, stats, held)
        proc.kill()
        for restart in range(2):  # and once more after a clean restart
            proc = broker_process("--durable", data_path=data)
            # the topic's own records reach the channel (or not) before /stats settles
            await _wait_http(proc, stats, lambda doc: doc["topics"][0]["depth"] == 0)
            doc = await _wait_http(proc, stats, lambda doc: True)
            channel = doc["topics"][0]["channels"][0]
            assert held(doc), f"restart {restart}: depth {channel['depth']}, deferred {channel['deferred_count']}"
            assert proc.terminate() == 0
        if kind == "DPUB":
            return
        proc = broker_process("--durable", data_path=data)
        consumer = await subscriber(proc, "crash", "c", rdy=100)
        got = [msg.body for msg in await consumer.read_messages(len(bodies))]
        assert sorted(got) == sorted(bodies)
        assert (await _stats(proc))["topics"][0]["channels"][0]["depth"] == 0
        proc.terminate()


async def test_kill_9_after_requeues_deferrals_and_releases_delivers_each_message_once(broker_process, tmp_path):
    """Every move of a message (REQ, REQ with a delay, its release when due) writes a new record
    before the old one is committed; a crash with all of them on disk leaves one live copy each.

    The first message stays in flight unanswered, so nothing after it can be committed.
    """
    data = tmp_path / "data"
    bodies = [f"m{i}".encode() for i in range(21)]
    with trio.fail_after(60):
        proc, consumer = await _start_published(broker_process, data, bodies, rdy=100)
        first = await consumer.read_messages(21)
        pinned = next(m for m in first if m.body == b"m0")
        moving = [m for m in first if m is not pinned]
        for delay in (0, 300, 0):  # REQ; REQ with a delay (released when due); REQ
            for msg in moving:
                await consumer.send(encode_req(msg.id, delay))
            moving = await consumer.read_messages(20)
        await _wait_http(proc, STATS,
                         lambda doc: doc["topics"][0]["channels"][0]["in_flight_count"] == 21)
        proc.kill()
        proc = broker_process("--durable", data_path=data)
        # one at a time, each finished before the next: a second copy cannot hide behind
        # its first one in flight (the channel skips those)
        consumer = await subscriber(proc, "crash", "c", rdy=1)
        got: list[bytes] = []
        with trio.move_on_after(1.5) as idle:
            while True:
                (msg,) = await consumer.read_messages(1)
                got.append(msg.body)
                await consumer.send(encode_fin(msg.id))
                idle.deadline = trio.current_time() + 1.5
        assert sorted(got) == sorted(bodies)
        doc = await _stats(proc)
        assert _channel_is_empty(doc), doc["topics"][0]["channels"][0]
        proc.terminate()


async def test_kill_9_does_not_bring_back_messages_finished_behind_one_in_flight(broker_process, tmp_path):
    """FINs behind a message that stays in flight cannot move the committed cursor; the
    checkpoint lists them (it is written by the commit step that follows), so a crash a
    moment later does not deliver them again. Only the one in flight comes back."""
    data = tmp_path / "data"
    bodies = [f"m{i}".encode() for i in range(50)]
    with trio.fail_after(60):
        proc, consumer = await _start_published(broker_process, data, bodies, rdy=100)
        got = await consumer.read_messages(50)
        for msg in got:
            if msg.body != b"m0":
                await consumer.send(encode_fin(msg.id))
        await _wait_http(proc, STATS,
                         lambda doc: doc["topics"][0]["channels"][0]["in_flight_count"] == 1)
        # the commit step that follows writes the checkpoint listing the 49 finished behind m0
        await wait_for(lambda: _finished_in_checkpoint(data) == 49, timeout=10)
        proc.kill()
        proc = broker_process("--durable", data_path=data)
        consumer = await subscriber(proc, "crash", "c", rdy=100)
        (msg,) = await consumer.read_messages(1)
        assert msg.body == b"m0"
        with trio.move_on_after(1.0):
            frame = await consumer.read_frame()
            raise AssertionError(f"a finished message came back: {decode_message(frame.data).body!r}")
        proc.terminate()
