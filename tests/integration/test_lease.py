"""The lease extension on the wire: IDENTIFY ``lease``, RDY as a credit, ``LEASE`` commands."""

from __future__ import annotations

import pytest

from broker.protocol import encode_auth, encode_cls, encode_fin, encode_lease, encode_rdy, encode_sub
from tests.support.auth_server import AuthServer
from tests.support.http_client import request
from tests.support.v2client import connect, publish_batch, subscriber
from tests.support.waiting import wait_for


def _channel(daemon, topic="t", channel="c"):
    return daemon.broker.topics[topic].channels[channel]


async def _lease(daemon, client, op, token="", timeout_ms=None) -> bytes:
    await client.send(encode_lease(op, token, timeout_ms))
    frame = await client.read_frame()
    return frame.data


async def test_identify_echoes_the_lease_only_to_a_client_that_asks(daemon):
    plain = await connect(daemon.addresses.tcp)
    assert "lease" not in await plain.identify(feature_negotiation=True)
    leasing = await connect(daemon.addresses.tcp)
    answer = await leasing.identify(feature_negotiation=True, lease="q1.7.0")
    assert answer["lease"] == "q1.7.0"


async def test_leased_messages_outlive_their_connection_and_are_finished_by_token(daemon):
    await publish_batch(daemon, "t", *[b"m%d" % i for i in range(5)])
    reader = await subscriber(daemon, rdy=5, feature_negotiation=True, lease="q1.1.0")
    got = await reader.read_messages(5)
    assert [m.body for m in got] == [b"m%d" % i for i in range(5)]
    await reader.aclose()
    await wait_for(lambda: not _channel(daemon).clients)
    assert len(_channel(daemon).in_flight) == 5

    committer = await subscriber(daemon, feature_negotiation=True, lease="q1.driver")
    assert await _lease(daemon, committer, "FIN", "q1.1.0") == b"5"
    assert await _lease(daemon, committer, "FIN", "q1.1.0") == b"0"
    assert (len(_channel(daemon).in_flight), _channel(daemon).depth) == (0, 0)
    await committer.expect_quiet()


async def test_rdy_on_a_leasing_connection_adds_credit_and_cls_ends_it(daemon):
    await publish_batch(daemon, "t", *[b"m%d" % i for i in range(10)])
    reader = await subscriber(daemon, feature_negotiation=True, lease="q1.2.0")
    await reader.send(encode_rdy(2) + encode_rdy(1))
    assert len(await reader.read_messages(3)) == 3
    await reader.expect_quiet()
    await reader.send(encode_rdy(4))
    assert [m.body for m in await reader.read_messages(4)] == [b"m3", b"m4", b"m5", b"m6"]
    await reader.expect_quiet()
    assert await _lease(daemon, reader, "AVAILABLE") == b"3"
    await reader.send(encode_cls() + encode_rdy(2))
    await reader.expect_response(b"CLOSE_WAIT")
    await reader.expect_quiet()
    assert await _lease(daemon, reader, "FIN", "q1.2.0") == b"7"


async def test_credit_is_capped_at_max_rdy_count(start_daemon):
    async with start_daemon("--max-rdy-count=4") as daemon:
        reader = await subscriber(daemon, feature_negotiation=True, lease="q1.8.0")
        await reader.send(encode_rdy(3) + encode_rdy(3))
        await reader.expect_quiet()
        await publish_batch(daemon, "t", *[b"m%d" % i for i in range(10)])
        assert len(await reader.read_messages(4)) == 4
        await reader.expect_quiet()


async def test_lease_req_redelivers_to_any_consumer(daemon):
    await publish_batch(daemon, "t", b"a", b"b")
    reader = await subscriber(daemon, rdy=2, feature_negotiation=True, lease="q1.3.0")
    await reader.read_messages(2)
    assert await _lease(daemon, reader, "REQ", "q1.3.0", 0) == b"2"
    plain = await subscriber(daemon, rdy=2)
    again = await plain.read_messages(2)
    assert sorted((m.body, m.attempts) for m in again) == [(b"a", 2), (b"b", 2)]


async def test_a_plain_fin_of_a_leased_message_fails_and_leaves_it_leased(daemon):
    await publish_batch(daemon, "t", b"a")
    reader = await subscriber(daemon, rdy=1, feature_negotiation=True, lease="q1.4.0")
    msg = await reader.read_message()
    await reader.send(encode_fin(msg.id))
    await reader.expect_error(b"E_FIN_FAILED FIN " + msg.id + b" failed client does not own message",
                              closed=False)
    assert await _lease(daemon, reader, "FIN", "q1.4.0") == b"1"


async def test_lease_touch_restarts_the_timeouts(daemon):
    await publish_batch(daemon, "t", b"a", b"b")
    reader = await subscriber(daemon, rdy=2, feature_negotiation=True, lease="q1.5.0", msg_timeout=5000)
    await reader.read_messages(2)
    before = sorted(m.deadline for m in _channel(daemon).in_flight.values())
    assert await _lease(daemon, reader, "TOUCH", "q1.5.0") == b"2"
    after = sorted(m.deadline for m in _channel(daemon).in_flight.values())
    assert all(b > a for a, b in zip(before, after))


async def test_an_expired_lease_is_redelivered_and_settles_nothing(daemon):
    await publish_batch(daemon, "t", b"a")
    reader = await subscriber(daemon, rdy=1, feature_negotiation=True, lease="q1.6.0", msg_timeout=1000)
    await reader.read_message()
    plain = await subscriber(daemon, rdy=1)
    again = await plain.read_message()
    assert (again.body, again.attempts) == (b"a", 2)
    assert await _lease(daemon, reader, "FIN", "q1.6.0") == b"0"
    assert len(_channel(daemon).in_flight) == 1


@pytest.mark.parametrize(("identify", "command", "error"), [
    ({}, encode_lease("FIN", "q1"), b"E_INVALID cannot LEASE without a lease in IDENTIFY"),
    ({"lease": "q"}, b"LEASE NOPE q1\n", b'E_INVALID LEASE invalid operation "NOPE"'),
    ({"lease": "q"}, b"LEASE\n", b'E_INVALID LEASE invalid operation ""'),
    ({"lease": "q"}, b"LEASE FIN\n", b"E_INVALID LEASE FIN insufficient number of params"),
    ({"lease": "q"}, b"LEASE REQ q1\n", b"E_INVALID LEASE REQ insufficient number of params"),
    ({"lease": "q"}, b"LEASE FIN bad/token\n", b'E_INVALID LEASE FIN invalid token "bad/token"'),
    ({"lease": "q"}, b"LEASE REQ q1 soon\n", b"E_INVALID LEASE REQ could not parse timeout soon"),
])
async def test_bad_lease_commands_get_a_fatal_error(daemon, identify, command, error):
    client = await subscriber(daemon, **identify)
    await client.send(command)
    await client.expect_error(error)


async def test_lease_before_sub_and_a_bad_token_in_identify_are_fatal(daemon):
    early = await connect(daemon.addresses.tcp)
    await early.identify(lease="q1")
    await early.send(encode_lease("AVAILABLE"))
    await early.expect_error(b"E_INVALID cannot LEASE in current state")
    bad = await connect(daemon.addresses.tcp)
    await bad.send(b"IDENTIFY\n" + len(b'{"lease":"a b"}').to_bytes(4, "big") + b'{"lease":"a b"}')
    await bad.expect_error(b'E_BAD_BODY IDENTIFY lease ("a b") is invalid')
    await bad.aclose()
    late = await connect(daemon.addresses.tcp)
    await late.identify(lease="q1")
    await late.send(encode_sub("t", "c"))
    await late.expect_response(b"OK")


async def test_available_counts_what_the_topic_has_yet_to_fan_out(daemon):
    await publish_batch(daemon, "t", b"a", b"b", b"c")
    daemon.broker.topics["t"].pause()  # the topic keeps them: nothing reaches the channel
    reader = await subscriber(daemon, feature_negotiation=True, lease="q1.9.0")
    assert _channel(daemon).depth == 0
    assert await _lease(daemon, reader, "AVAILABLE") == b"3"


@pytest.mark.parametrize("finish", [True, False], ids=["finished", "left-leased"])
async def test_durable_leases_finished_by_token_stay_finished_across_a_restart(start_daemon, finish):
    async with start_daemon("--durable") as daemon:
        await publish_batch(daemon, "t", b"a", b"b", b"c")
        reader = await subscriber(daemon, rdy=3, feature_negotiation=True, lease="q1.10.0")
        await reader.read_messages(3)
        await reader.aclose()
        committer = await subscriber(daemon, feature_negotiation=True, lease="q1.driver")
        if finish:
            assert await _lease(daemon, committer, "FIN", "q1.10.0") == b"3"
        await committer.aclose()
    async with start_daemon("--durable") as daemon:
        plain = await subscriber(daemon, rdy=3)
        again = [] if finish else await plain.read_messages(3)
        await plain.expect_quiet()
    assert sorted(m.body for m in again) == ([] if finish else [b"a", b"b", b"c"])


# Two identities granted the same channel, a second secret of the first identity, and two
# secrets the auth server names no identity for.
_GRANT = [{"topic": "^t$", "channels": [".*"], "permissions": ["subscribe", "publish"]}]
_LEASERS = {
    "a": {"identity": "reader-a", "ttl": 3600, "authorizations": _GRANT},
    "a-again": {"identity": "reader-a", "ttl": 3600, "authorizations": _GRANT},
    "a2": {"identity": "reader-a2", "ttl": 3600, "authorizations": _GRANT},
    "anon-1": {"ttl": 3600, "authorizations": _GRANT},
    "anon-2": {"ttl": 3600, "authorizations": _GRANT},
}


@pytest.fixture
async def authed_daemon(start_daemon):
    authd = AuthServer(_LEASERS).start()
    try:
        async with start_daemon(f"--auth-http-address={authd.address}") as daemon:
            yield daemon
    finally:
        authd.stop()


async def _authed_subscriber(daemon, secret, token, channel="c", rdy=None):
    client = await connect(daemon.addresses.tcp)
    await client.identify(feature_negotiation=True, lease=token)
    await client.send(encode_auth(secret.encode()))
    await client.read_frame()  # the AUTH answer
    await client.send(encode_sub("t", channel))
    await client.expect_response(b"OK")
    if rdy is not None:
        await client.send(encode_rdy(rdy))
    return client


async def _publish_over_http(daemon, *bodies) -> None:
    """The HTTP API asks no auth server, as nsqd's does not."""
    reply = await request(daemon.addresses.http, "POST", "/mpub?topic=t", b"\n".join(bodies))
    assert reply.status == 200, reply


async def _channel_stats(daemon, channel="c") -> dict:
    stats = (await request(daemon.addresses.http, "GET", "/stats?format=json&topic=t")).json()
    (topic,) = stats["topics"]
    return next(c for c in topic["channels"] if c["channel_name"] == channel)


async def test_another_identity_cannot_settle_a_lease_by_its_token(authed_daemon):
    daemon = authed_daemon
    token = "spark-q1-b7-p0"
    await _publish_over_http(daemon, *[b"m%d" % i for i in range(10)])
    reader = await _authed_subscriber(daemon, "a", token, rdy=10)
    assert len(await reader.read_messages(10)) == 10
    await reader.aclose()

    thief = await _authed_subscriber(daemon, "a2", "a2.own")
    for op, code, timeout_ms in [("REQ", b"E_REQ_FAILED", 3_600_000), ("FIN", b"E_FIN_FAILED", None),
                                 ("TOUCH", b"E_TOUCH_FAILED", None)]:
        await thief.send(encode_lease(op, token, timeout_ms))
        await thief.expect_error(code + b" LEASE " + op.encode() + b" " + token.encode()
                                 + b" failed lease belongs to another identity", closed=False)
    assert await _lease(daemon, thief, "AVAILABLE") == b"0"  # the refusals did not close it
    stats = await _channel_stats(daemon)
    assert (stats["in_flight_count"], stats["deferred_count"], stats["depth"], stats["requeue_count"]) == (10, 0, 0, 0)
    # the lease is per channel: on another channel the token names nothing
    elsewhere = await _authed_subscriber(daemon, "a2", "a2.own", channel="other")
    assert await _lease(daemon, elsewhere, "FIN", token) == b"0"

    # any connection of the owning identity settles it, whatever its own token and secret
    owner = await _authed_subscriber(daemon, "a-again", "a.driver")
    assert await _lease(daemon, owner, "FIN", token) == b"10"
    stats = await _channel_stats(daemon)
    assert (stats["in_flight_count"], stats["deferred_count"], stats["depth"]) == (0, 0, 0)


async def test_the_same_token_taken_by_two_identities_names_two_leases(authed_daemon):
    daemon = authed_daemon
    await _publish_over_http(daemon, *[b"m%d" % i for i in range(5)])
    first = await _authed_subscriber(daemon, "a", "shared", rdy=3)
    assert len(await first.read_messages(3)) == 3
    second = await _authed_subscriber(daemon, "a2", "shared", rdy=2)
    assert len(await second.read_messages(2)) == 2
    assert await _lease(daemon, second, "FIN", "shared") == b"2"
    # its own lease settled, the token names only the other identity's
    await second.send(encode_lease("REQ", "shared", 0))
    await second.expect_error(b"E_REQ_FAILED LEASE REQ shared failed lease belongs to another identity",
                              closed=False)
    assert (await _channel_stats(daemon))["in_flight_count"] == 3
    assert await _lease(daemon, first, "FIN", "shared") == b"3"


async def test_without_an_identity_the_auth_secret_owns_the_lease(authed_daemon):
    daemon = authed_daemon
    await _publish_over_http(daemon, b"a", b"b")
    reader = await _authed_subscriber(daemon, "anon-1", "anon.1", rdy=2)
    await reader.read_messages(2)
    other = await _authed_subscriber(daemon, "anon-2", "anon.2")
    await other.send(encode_lease("FIN", "anon.1"))
    await other.expect_error(b"E_FIN_FAILED LEASE FIN anon.1 failed lease belongs to another identity", closed=False)
    same = await _authed_subscriber(daemon, "anon-1", "anon.3")
    assert await _lease(daemon, same, "FIN", "anon.1") == b"2"
