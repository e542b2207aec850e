"""Power cuts under ``pynsqd --durable`` with keyed publishes: the key of every acknowledged
publish survives, and a retry is never dropped for a message that is not there.

A durable broker in a recorded data directory (``tests/support/powercut.py``, the model of
``test_power_loss_broker.py``: only what was fsynced is stable, each unsynced write kept,
dropped, torn or zero-filled) takes keyed PUBs and MPUBs from a few publishers, each waiting
for its answer. At crash points of the record the directory is rebuilt as a power cut there
could leave it, and a broker started on it is given every publish again, as publishers that
cannot know what the cut kept retry what they sent. The promises:

* a message whose publish was acknowledged before the cut is answered ``DUPLICATE`` (its key
  was kept: the retry stores nothing) and is delivered (at least once, as durable delivery
  is; a repeat is counted);
* any other message sent before the cut is delivered at least once: a retry answered as a
  duplicate must have a stored message behind it (a key kept without its message would lose
  it). One stored twice (its message kept, its key not: a publish the cut left unanswered)
  is counted, as broker/protocol/README.md allows ("What survives").
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import trio

from broker.protocol import encode_mpub, encode_pub
from broker.protocol.keys import duplicates_in_answer, prefix_key
from tests.support.draining import drain
from tests.support.http_client import request
from tests.support.powercut import BROKER_FLAGS, Disk, Recorder, check_model, crash_points, first_seed, write_directory
from tests.support.v2client import connect, subscriber

TOPIC, CHANNEL = "keyed", "c"
PUBLISHERS = 3
PUBLISHES = 30
POINTS_PER_RUN = 8
CI_POINTS = 8

#: One publish: the command's messages as (key, body) pairs.
Publish = list[tuple[bytes, bytes]]


def command(messages: Publish) -> bytes:
    keyed = [prefix_key(key, body) for key, body in messages]
    return encode_pub(TOPIC, keyed[0]) if len(keyed) == 1 else encode_mpub(TOPIC, keyed)


async def keyed_client(d):
    client = await connect(d.addresses.tcp)
    answer = await client.identify(feature_negotiation=True, publish_keys=True)
    assert answer["publish_keys"] is True
    return client


async def publisher(d, number: int, rng: random.Random, recorder: Recorder, sent: list[Publish]) -> None:
    client = await keyed_client(d)
    for op in range(PUBLISHES):
        size = 1 if rng.random() < 0.5 else rng.randrange(2, 8)
        messages = [(b"k%d-%d-%d" % (number, op, i), b"m%d-%d-%d" % (number, op, i)) for i in range(size)]
        sent.append(messages)
        recorder.mark(("sent", messages))
        await client.send(command(messages))
        answer = (await client.read_frame()).data
        assert duplicates_in_answer(answer) == 0, answer  # every key is new
        recorder.mark(("acked", messages))
    await client.aclose()


async def record_run(start_daemon, path: Path, rng: random.Random) -> tuple[Recorder, list[Publish]]:
    path.mkdir()
    recorder = Recorder(path)
    sent: list[Publish] = []
    with recorder.installed(), trio.fail_after(60):
        async with start_daemon(*BROKER_FLAGS, data_path=path) as d:
            for target in (f"/topic/create?topic={TOPIC}", f"/channel/create?topic={TOPIC}&channel={CHANNEL}"):
                reply = await request(d.addresses.http, "POST", target)
                assert reply.status == 200, reply
            async with trio.open_nursery() as publishers:
                for number in range(PUBLISHERS):
                    publishers.start_soon(publisher, d, number, random.Random(rng.random()), recorder, sent)
    return recorder, sent


async def retry_and_drain(start_daemon, path: Path, sent: list[Publish]) -> tuple[Counter, set[bytes]]:
    """Start a broker on ``path``, publish everything sent again; returns how often each body
    is delivered, and the bodies whose retry was a duplicate."""
    delivered: Counter[bytes] = Counter()
    duplicates: set[bytes] = set()
    async with start_daemon(*BROKER_FLAGS, data_path=path) as d:
        client = await keyed_client(d)
        for messages in sent:
            for key, body in messages:  # one by one, to know which were duplicates
                await client.send(command([(key, body)]))
                if (await client.read_frame()).data == b"DUPLICATE":
                    duplicates.add(body)
        await client.aclose()
        consumer = await subscriber(d, topic=TOPIC, channel=CHANNEL, rdy=200, msg_timeout=60_000)

        def settled() -> bool:  # nothing left to deliver: what is missing now is lost
            topic = d.broker.topics[TOPIC]
            channel = topic.channels[CHANNEL]
            return not (topic.depth or channel.depth or channel.in_flight)

        with trio.fail_after(20):
            await drain(consumer, settled, on_message=lambda client, msg: delivered.update([msg.body]))
        await consumer.aclose()
    return delivered, duplicates


async def test_power_cuts_keep_the_keys_of_acknowledged_publishes(start_daemon, tmp_path: Path) -> None:
    points, seed = crash_points(CI_POINTS), first_seed()
    print(f"\npower cuts under pynsqd --durable with keyed publishes: seed {seed}, {points} crash points")
    tried = stored_twice = redelivered = 0
    for run in range(-(-points // POINTS_PER_RUN)):
        base = tmp_path / f"run{run}"
        base.mkdir()
        recorder, sent = await record_run(start_daemon, base / "live", random.Random(seed + run))
        check_model(Disk(recorder.initial), recorder, base / "live")
        marks = recorder.marks()
        rng = random.Random(f"{seed + run} cuts")
        disk = Disk(recorder.initial)
        for n, point in enumerate(recorder.crash_points(min(POINTS_PER_RUN, points - run * POINTS_PER_RUN), rng)):
            disk.advance(recorder.ops, point)
            acked = {body for i, (kind, messages) in marks if i < point and kind == "acked" for _, body in messages}
            before = [messages for i, (kind, messages) in marks if i < point and kind == "sent"]
            files, choices = disk.power_cut(rng, rng.choices(["random", "kept", "lost"], weights=[6, 2, 2])[0])
            target = write_directory(base / f"cut{n}", files)
            context = (f"seed {seed} run {run}, crash point {point} of {len(recorder.ops)}: "
                       f"{'; '.join(choices) or '-'}\noperations before the cut:\n{recorder.trace(point)}")
            try:
                delivered, duplicates = await retry_and_drain(start_daemon, target, before)
                lost_keys = sorted(acked - duplicates)
                assert not lost_keys, f"{len(lost_keys)} acknowledged key(s) lost: {lost_keys[:5]}"
                bodies = {body for messages in before for _, body in messages}
                missing = sorted(bodies - set(delivered))
                assert not missing, f"{len(missing)} message(s) lost (a retry dropped for nothing?): {missing[:5]}"
                # every acknowledged retry was a duplicate (above): it stored nothing. A message may
                # still come twice, as durable delivery is at least once (a cut that tore a channel's
                # copy of what the topic fanned out brings the topic's record to the channel again)
                repeats = sum(delivered[body] > 1 for body in acked)
                redelivered += repeats
                stored_twice += sum(1 for body in bodies - acked if delivered[body] > 1)
            except BaseException as exc:
                raise AssertionError(f"{exc!r}\n{context}") from exc
            tried += 1
    print(f"power cuts with keyed publishes: {tried} crash points, every acknowledged key kept and its message "
          f"delivered; {redelivered} acknowledged messages delivered twice (a torn channel copy), "
          f"{stored_twice} messages not acknowledged before the cut delivered twice")
    assert tried == points
