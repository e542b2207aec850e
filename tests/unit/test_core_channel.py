"""A Channel alone: delivery, FIN/REQ/TOUCH, timeouts, deferral and dead letters on a mock clock."""

from __future__ import annotations

import trio

from broker.core.message import now_ns
from broker.protocol import ProtocolError


def subscribe_and_put(channel, consumer, batch):
    """Subscribe ``consumer`` to ``channel``, then put the messages of ``batch`` into it; returns ``consumer``."""
    channel.add_client(consumer)
    channel.put_many(batch)
    return consumer


async def test_delivers_within_the_rdy_window_and_keeps_the_rest_ready(make_host, subscriber, messages):
    channel = make_host().channel()
    consumer = subscribe_and_put(channel, subscriber(rdy=2), messages(b"a", b"b", b"c"))
    assert consumer.bodies() == [b"a", b"b"]
    assert (channel.depth, len(channel.in_flight)) == (1, 2)
    channel.finish_many(consumer, [consumer.received[0].id])
    channel.dispatch()
    assert consumer.bodies() == [b"a", b"b", b"c"]
    assert consumer.finish_count == 1 and consumer.in_flight_count == 2


async def test_fin_of_a_message_not_in_flight_or_not_owned_fails(make_host, subscriber, messages):
    channel = make_host().channel()
    first, second = subscriber(rdy=1), subscriber(rdy=1)
    channel.add_client(first)
    channel.put_many(messages(b"a"))
    msg_id = first.received[0].id
    channel.add_client(second)
    errors = channel.finish_many(second, [msg_id, b"z" * 16])
    assert [e.payload for e in errors] == [
        b"E_FIN_FAILED FIN " + msg_id + b" failed client does not own message",
        b"E_FIN_FAILED FIN " + b"z" * 16 + b" failed ID not in flight",
    ]
    assert all(not e.fatal for e in errors)
    assert channel.finish_many(first, [msg_id]) == []
    assert not channel.in_flight


async def test_message_timeout_requeues_and_redelivers(make_host, subscriber, messages, autojump_clock):
    channel = make_host().channel()
    consumer = subscribe_and_put(channel, subscriber(rdy=1, msg_timeout=30.0), messages(b"slow"))
    await trio.sleep(29)
    assert not channel.process_timers()
    await trio.sleep(2)
    assert channel.process_timers()
    assert consumer.deliveries == [(b"slow", 1), (b"slow", 2)]
    assert (channel.timeout_count, consumer.timeout_count, consumer.in_flight_count) == (1, 1, 1)


async def test_touch_extends_the_deadline(make_host, subscriber, messages, autojump_clock):
    channel = make_host().channel()
    consumer = subscribe_and_put(channel, subscriber(rdy=1, msg_timeout=30.0), messages(b"a"))
    await trio.sleep(20)
    channel.touch(consumer, consumer.received[0].id)
    await trio.sleep(20)  # 40 s after delivery, 20 s after the touch
    channel.process_timers()
    assert channel.timeout_count == 0
    await trio.sleep(11)
    channel.process_timers()
    assert channel.timeout_count == 1


async def test_touch_never_extends_past_max_msg_timeout(make_host, subscriber, messages, autojump_clock):
    channel = make_host("--max-msg-timeout=45s").channel()
    consumer = subscribe_and_put(channel, subscriber(rdy=1, msg_timeout=30.0), messages(b"a"))
    await trio.sleep(25)
    channel.touch(consumer, consumer.received[0].id)
    await trio.sleep(21)  # 46 s after delivery: the touch's 55 s were capped at 45 s
    channel.process_timers()
    assert channel.timeout_count == 1


async def test_req_without_delay_goes_to_the_tail(make_host, subscriber, messages):
    channel = make_host().channel()
    consumer = subscribe_and_put(channel, subscriber(rdy=1), messages(b"a", b"b"))
    channel.requeue(consumer, consumer.received[0].id, 0)
    assert (channel.requeue_count, consumer.requeue_count, consumer.in_flight_count) == (1, 1, 0)
    channel.dispatch()
    channel.finish_many(consumer, [consumer.received[-1].id])
    channel.dispatch()
    assert consumer.deliveries == [(b"a", 1), (b"b", 1), (b"a", 2)]


async def test_req_with_delay_is_released_at_its_due_time(make_host, subscriber, messages, autojump_clock):
    channel = make_host().channel()
    consumer = subscribe_and_put(channel, subscriber(rdy=5), messages(b"later"))
    channel.requeue(consumer, consumer.received[0].id, 10_000)
    assert len(channel.deferred) == 1 and not channel.in_flight
    await trio.sleep(9.9)
    channel.process_timers()
    assert len(consumer.received) == 1
    await trio.sleep(0.2)
    channel.process_timers()
    assert consumer.deliveries == [(b"later", 1), (b"later", 2)]
    assert not channel.deferred


async def test_req_of_a_message_not_in_flight_fails(make_host, subscriber):
    channel = make_host().channel()
    consumer = subscriber()
    channel.add_client(consumer)
    try:
        channel.requeue(consumer, b"1" * 16, 0)
    except ProtocolError as err:
        assert err.payload == b"E_REQ_FAILED REQ " + b"1" * 16 + b" failed ID not in flight"
    else:
        raise AssertionError("REQ of an unknown id succeeded")


async def test_deferred_publish_waits_in_the_channel_until_due(make_host, subscriber, messages, autojump_clock):
    channel = make_host().channel()
    consumer = subscriber()
    channel.add_client(consumer)
    (msg,) = messages(b"dpub", due_ns=now_ns() + 5_000_000_000)
    channel.put_deferred(msg)
    assert (channel.depth, len(channel.deferred), consumer.received) == (0, 1, [])
    await trio.sleep(5.1)
    channel.process_timers()
    assert consumer.bodies() == [b"dpub"]
    assert consumer.received[0].due_ns == 0


async def test_paused_channel_holds_messages_until_unpaused(make_host, subscriber, messages):
    channel = make_host().channel()
    consumer = subscriber()
    channel.add_client(consumer)
    channel.pause()
    channel.put_many(messages(b"held"))
    assert consumer.received == [] and channel.depth == 1
    channel.unpause()
    assert consumer.bodies() == [b"held"]


async def test_subscribers_share_messages_round_robin(make_host, subscriber, messages):
    channel = make_host().channel()
    one, two = subscriber(rdy=10), subscriber(rdy=10)
    channel.add_client(one)
    channel.add_client(two)
    channel.put_many(messages(*[b"%d" % i for i in range(6)]))
    assert len(one.received) == len(two.received) == 3
    assert sorted(one.bodies() + two.bodies()) == [b"%d" % i for i in range(6)]


async def test_consumers_with_wide_windows_take_runs_in_turn_and_narrow_ones_an_even_split(
        make_host, subscriber, messages):
    from broker.core.delivery import MAX_RUN

    channel = make_host().channel()
    wide = [subscriber(rdy=1000) for _ in range(8)]
    for consumer in wide:
        channel.add_client(consumer)
    channel.put_many(messages(*[b"a%03d" % i for i in range(200)]))
    # 200 for 8: runs of 64 to the first three, the rest to the fourth (not 25 writes of 8)
    assert [len(c.received) for c in wide] == [MAX_RUN] * 3 + [200 - 3 * MAX_RUN] + [0] * 4
    for i in range(7):  # the next consumer's turn comes after the last one served
        channel.put_many(messages(*[b"b%d-%03d" % (i, j) for j in range(4 * MAX_RUN)]))
    counts = [len(c.received) for c in wide]
    assert sum(counts) == 200 + 7 * 4 * MAX_RUN and max(counts) - min(counts) <= MAX_RUN

    channel = make_host().channel("narrow")
    narrow = [subscriber(rdy=4) for _ in range(8)]
    for consumer in narrow:
        channel.add_client(consumer)
    channel.put_many(messages(*[b"n%02d" % i for i in range(16)]))
    assert [len(c.received) for c in narrow] == [2] * 8  # slow work spread as widely as it goes


async def test_max_channel_consumers(make_host, subscriber):
    channel = make_host("--max-channel-consumers=1").channel()
    channel.add_client(subscriber())
    try:
        channel.add_client(subscriber())
    except ProtocolError as err:
        assert err.payload == b"E_SUB_FAILED SUB failed consumers for t:c exceeds limit of 1"
    else:
        raise AssertionError("a second consumer was accepted")


async def test_ephemeral_channel_reports_empty_when_its_last_subscriber_leaves(make_host, subscriber):
    host = make_host()
    channel = host.channel("e#ephemeral")
    one, two = subscriber(), subscriber()
    channel.add_client(one)
    channel.add_client(two)
    channel.remove_client(one)
    assert host.emptied == []
    channel.remove_client(two)
    assert host.emptied == ["e#ephemeral"]
    assert host.queues.opened == {}  # an ephemeral channel has no files


async def test_ephemeral_channel_drops_past_the_memory_limit(make_host, subscriber, messages):
    channel = make_host("--mem-queue-size=2").channel("e#ephemeral")
    channel.put_many(messages(b"a", b"b", b"c"))
    assert channel.depth == 2
    consumer = subscriber()
    channel.add_client(consumer)
    channel.dispatch()
    assert consumer.bodies() == [b"a", b"b"]


async def test_message_is_buried_after_max_attempts_and_kicked_back(make_host, subscriber, messages,
                                                                   autojump_clock):
    host = make_host("--max-attempts=2")
    channel = host.channel()
    consumer = subscribe_and_put(channel, subscriber(rdy=1), messages(b"poison"))
    for _ in range(2):
        channel.requeue(consumer, consumer.received[-1].id, 0)
        channel.dispatch()
    assert len(consumer.received) == 2  # the third delivery buried it instead
    assert (len(channel.buried), channel.depth, len(channel.in_flight)) == (1, 0, 0)
    assert [m.body for m in channel.peek_buried(5)] == [b"poison"]
    assert channel.kick(n=5) == 1
    assert consumer.deliveries[-1] == (b"poison", 1)
    assert len(channel.buried) == 0


async def test_buried_messages_survive_a_restart_and_can_be_deleted(make_host, subscriber, messages):
    host = make_host("--max-attempts=1")
    channel = host.channel()
    consumer = subscribe_and_put(channel, subscriber(rdy=1), messages(b"poison"))
    channel.requeue(consumer, consumer.received[0].id, 0)
    channel.dispatch()
    assert len(channel.buried) == 1
    await channel.close_queues()
    again = make_host("--max-attempts=1").channel()
    assert [m.body for m in again.peek_buried(5)] == [b"poison"]
    assert again.delete_buried(n=5) == 1
    assert len(again.buried) == 0


async def test_a_channel_is_timed_only_while_it_has_in_flight_or_deferred_messages(make_host, subscriber, messages):
    host = make_host()
    idle, busy = host.channel("idle"), host.channel("busy")
    assert host.core.timed == set()  # the broker's scanner visits neither
    consumer = subscriber(rdy=1)
    busy.add_client(consumer)
    busy.put_many(messages(b"a"))
    assert host.core.timed == {busy}
    idle.put_many(messages(b"b"))  # ready, not in flight: nothing to time
    assert host.core.timed == {busy}
