"""Keyed publishes against a real ``pynsqd --durable`` killed with SIGKILL: retries store nothing twice.

Publishers send keyed PUBs and MPUBs over TCP, and keyed ``/pub`` and ``/mpub`` requests over
HTTP; when the broker goes away under a command they
reconnect to the restarted broker and send the same command again, as a publisher that
never heard its answer must, until it is answered. The broker is killed at random
moments of that traffic, several times. At the end the channel holds every message
exactly once: none lost (each was retried until acknowledged) and none stored twice
(a retry of a message the killed broker had stored is a duplicate). The random choices
are seeded, so a failing run can be replayed.
"""

from __future__ import annotations

import random

import h11
import pytest
import trio

from broker.core.keys import KEY_RECORD_MIN, encode_record
from broker.core.message import now_ns
from broker.protocol import encode_mpub, encode_pub
from broker.protocol.keys import duplicates_in_answer, prefix_key
from diskqueue import DiskQueue
from tests.support.crash_clients import DISCONNECTED
from tests.support.draining import drain
from tests.support.http_client import request
from tests.support.v2client import connect
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

SEED = 20261127
KILLS = 5
PUBLISHERS = 3
BATCHES = 150  # per publisher: PUBs and MPUBs of 2-30 messages
FLAGS = ("--durable", "--sync-timeout=100ms", "--sync-every=200")


class Broker:
    """The broker under test across its restarts, and the publishers' view of it."""

    def __init__(self, proc):
        self.proc = proc
        self.up = trio.Event()
        self.up.set()
        self.acked = 0  # batches answered
        self.duplicates = 0  # messages answered as duplicates

    async def restart(self) -> None:
        self.up = trio.Event()
        self.proc.kill()
        await trio.to_thread.run_sync(self.proc.start)
        self.up.set()


async def keyed_connection(broker: Broker):
    while True:
        await broker.up.wait()
        try:
            client = await connect(broker.proc.tcp, timeout=10)
            answer = await client.identify(feature_negotiation=True, publish_keys=True)
            assert answer["publish_keys"] is True
            return client
        except DISCONNECTED:
            await trio.sleep(0.05)  # the broker is going down: wait for the restart to begin


def batches_of(name: str, rng: random.Random) -> list[tuple[bytes, int]]:
    """The commands of one publisher: (payload, messages); bodies and keys are ``<name>-<n>``."""
    commands, n = [], 0
    for _ in range(BATCHES):
        size = 1 if rng.random() < 0.4 else rng.randrange(2, 31)
        messages = [prefix_key(b"%s-%d" % (name.encode(), n + i), b"%s-%d" % (name.encode(), n + i))
                    for i in range(size)]
        n += size
        commands.append((encode_pub("kc", messages[0]) if size == 1 else encode_mpub("kc", messages), size))
    return commands


async def publisher(broker: Broker, commands: list[tuple[bytes, int]]) -> None:
    client = await keyed_connection(broker)
    for payload, _size in commands:
        while True:  # the same command until it is answered
            try:
                await client.send(payload)
                answer = (await client.read_frame()).data
                break
            except DISCONNECTED:
                client = await keyed_connection(broker)
        broker.duplicates += duplicates_in_answer(answer)
        broker.acked += 1


def http_batches_of(name: str, rng: random.Random) -> list[tuple[str, bytes, int]]:
    """The requests of an HTTP publisher: (target, body, messages): ``/pub?key=`` or a keyed text ``/mpub``."""
    requests, n = [], 0
    for _ in range(BATCHES):
        size = 1 if rng.random() < 0.4 else rng.randrange(2, 31)
        names = [b"%s-%d" % (name.encode(), n + i) for i in range(size)]
        n += size
        if size == 1:
            requests.append((f"/pub?topic=kc&key={names[0].decode()}", names[0], 1))
        else:
            requests.append(("/mpub?topic=kc&keyed=true", b"".join(b"%s %s\n" % (m, m) for m in names), size))
    return requests


async def http_publisher(broker: Broker, requests: list[tuple[str, bytes, int]]) -> None:
    for target, body, _size in requests:
        while True:  # the same request until it is answered
            await broker.up.wait()
            try:
                reply = await request(broker.proc.http, "POST", target, body)
                break
            except (*DISCONNECTED, h11.RemoteProtocolError):  # the broker was killed under the request
                await trio.sleep(0.05)
        assert reply.status == 200, reply
        broker.duplicates += int(reply.headers["x-duplicates"])
        broker.acked += 1


async def test_retries_across_kills_store_every_keyed_message_exactly_once(broker_process, tmp_path):
    rng = random.Random(SEED)
    proc = broker_process(*FLAGS)
    assert (await request(proc.http, "POST", "/topic/create?topic=kc")).status == 200
    assert (await request(proc.http, "POST", "/channel/create?topic=kc&channel=c")).status == 200
    broker = Broker(proc)
    commands = [batches_of(f"p{i}", random.Random(rng.random())) for i in range(PUBLISHERS)]
    requests = http_batches_of("h", random.Random(rng.random()))
    sizes = {f"p{i}": sum(size for *_, size in c) for i, c in enumerate(commands)}
    sizes["h"] = sum(size for *_, size in requests)
    total = sum(sizes.values())
    kill_at = sorted(rng.sample(range(20, (PUBLISHERS + 1) * BATCHES - 20), KILLS))
    async with trio.open_nursery() as nursery:
        for publisher_commands in commands:
            nursery.start_soon(publisher, broker, publisher_commands)
        nursery.start_soon(http_publisher, broker, requests)
        for point in kill_at:
            # a random point of the traffic, by progress, not by time
            await wait_for(lambda point=point: broker.acked >= point, timeout=120, poll=0.005)
            await broker.restart()
    assert broker.acked == (PUBLISHERS + 1) * BATCHES

    consumer = await connect(proc.tcp)
    await consumer.send(b"SUB kc c\nRDY 500\n")
    await consumer.expect_response(b"OK")
    got: list[bytes] = []

    async def all_in() -> bool:
        if len(got) < total:
            return False
        (channel,) = (await request(proc.http, "GET", "/stats?format=json&topic=kc")).json()["topics"][0]["channels"]
        return channel["depth"] == channel["in_flight_count"] == 0

    with trio.move_on_after(60):
        await drain(consumer, all_in, on_message=lambda client, msg: got.append(msg.body))
    counts: dict[bytes, int] = {}
    for body in got:
        counts[body] = counts.get(body, 0) + 1
    expected = {b"%s-%d" % (name.encode(), n) for name, size in sizes.items() for n in range(size)}
    assert set(counts) == expected, f"{len(expected - set(counts))} lost, {len(set(counts) - expected)} unknown"
    twice = {body: count for body, count in counts.items() if count > 1}
    assert not twice, f"{len(twice)} stored more than once, e.g. {sorted(twice)[:5]}"
    print(f"{total} keyed messages, {KILLS} kills: each stored once; {broker.duplicates} retries were duplicates")


async def test_a_key_whose_message_never_was_written_does_not_hold_back_its_retry(broker_process, tmp_path):
    """A kill between the key's record and its message's leaves a key record naming a message
    record number the topic never wrote: after the restart the retry is stored."""
    data = tmp_path / "data"
    proc = broker_process("--durable", data_path=data)
    client = await connect(proc.tcp)
    await client.identify(feature_negotiation=True, publish_keys=True)
    await client.send(encode_mpub("kc", [prefix_key(b"k%d" % i, b"m%d" % i) for i in range(3)]))
    await client.expect_response(b"OK")
    await client.aclose()
    proc.terminate()
    # what the crash would have left: the journal has a record for the next message, which is not there
    journal = DiskQueue("kc#keys", str(data), min_msg_size=KEY_RECORD_MIN, max_msg_size=1 << 20, auto_commit=False)
    journal.put_many([encode_record(now_ns() + 600 * 10**9, 3, b"ghost"),
                      encode_record(now_ns() + 600 * 10**9, 2, b"k2")])
    await journal.close()
    proc.start()
    client = await connect(proc.tcp)
    await client.identify(feature_negotiation=True, publish_keys=True)
    await client.send(encode_mpub("kc", [prefix_key(b"ghost", b"retry"), prefix_key(b"k2", b"again")]))
    await client.expect_response(b"DUPLICATE 1")
    stats = (await request(proc.http, "GET", "/stats?format=json&topic=kc")).json()
    assert stats["topics"][0]["message_count"] == 1  # the ghost's retry; k2 was stored before
