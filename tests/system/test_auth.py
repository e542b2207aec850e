"""AUTH against --auth-http-address servers: nsqd's request, answers, errors and re-query after ttl."""

from __future__ import annotations

import json
import logging
import socket

import pytest
import trio

from broker.protocol import encode_auth, encode_dpub, encode_mpub, encode_pub, encode_sub
from tests.support.auth_server import AuthServer
from tests.support.http_client import request
from tests.support.transports import make_certificates, negotiate, upgrade_tls
from tests.support.v2client import connect
from tests.support.waiting import wait_for

# As in nsqd, a grant's channel patterns apply to publishing too (with channel ""): a publish
# grant needs a pattern that matches the empty name.
ORDERS = {"topic": "^orders", "channels": ["^billing$", "audit"], "permissions": ["subscribe", "publish"]}
PUBLISH_ANY = {"topic": ".*", "channels": [".*"], "permissions": ["publish"]}
PUBLISH_ORDERS = {"topic": "^orders$", "channels": [".*"], "permissions": ["publish"]}
PUBLISH_NO_CHANNELS = {"topic": ".*", "channels": [], "permissions": ["publish"]}
SECRETS = {
    "good": {"identity": "billing-service", "identity_url": "https://example.com/billing", "ttl": 3600,
             "authorizations": [ORDERS, PUBLISH_ANY]},
    "nothing": {"identity": "nobody", "ttl": 3600, "authorizations": []},
    "short": {"identity": "brief", "ttl": 1, "authorizations": [PUBLISH_ORDERS]},
    "no-channels": {"identity": "odd", "ttl": 60, "authorizations": [PUBLISH_NO_CHANNELS]},
    "slow": {"identity": "late", "ttl": 60, "authorizations": [ORDERS], "delay": 3},
    "garbage": {"raw": "<html>this is not JSON</html>"},
    "bad-permission": {"ttl": 60, "authorizations": [{"topic": ".*", "channels": [], "permissions": ["admin"]}]},
    "bad-ttl": {"ttl": 0, "authorizations": [ORDERS]},
    "bad-pattern": {"ttl": 60, "authorizations": [{**ORDERS, "channels": ["(?<=a)b"]}]},
    # past the 1 MiB an answer may have (a real one is a few KB): nsqd reads any size
    "huge": {"raw": json.dumps({"ttl": 60, "identity": "x" * (1 << 20), "authorizations": [PUBLISH_ANY]})},
    # just under it: 9,000 grants, decoded off the event loop; only the last allows "orders"
    "many": {"identity": "many", "ttl": 60, "authorizations": [
        *({"topic": f"^t{i}$", "channels": [".*"], "permissions": ["publish"]} for i in range(9000)),
        PUBLISH_ORDERS]},
}


@pytest.fixture
def authd():
    server = AuthServer(SECRETS).start()
    yield server
    server.stop()


@pytest.fixture
async def broker(start_daemon, authd):
    async with start_daemon(f"--auth-http-address={authd.address}", "--http-client-request-timeout=1s") as daemon:
        yield daemon


async def authed(daemon, secret="good"):
    client = await connect(daemon.addresses.tcp)
    await client.send(encode_auth(secret.encode()))
    return client


async def test_identify_says_auth_is_required(broker):
    client = await connect(broker.addresses.tcp)
    _, answer = await negotiate(client)
    assert answer["auth_required"] is True


@pytest.mark.parametrize(("command", "verb"), [
    (encode_pub("orders", b"x"), "PUB"),
    (encode_mpub("orders", [b"x"]), "MPUB"),
    (encode_dpub("orders", 10, b"x"), "DPUB"),
    (encode_sub("orders", "billing"), "SUB"),
])
async def test_commands_before_auth_are_refused(broker, command, verb):
    client = await connect(broker.addresses.tcp)
    await client.send(command)
    await client.expect_error(b"E_AUTH_FIRST AUTH required before " + verb.encode())


async def test_auth_answers_identity_and_the_server_gets_nsqds_query(broker, authd):
    client = await authed(broker)
    await client.expect_response(b'{"identity":"billing-service","identity_url":"https://example.com/billing",'
                                 b'"permission_count":2}')
    assert authd.queries == [{"common_name": "", "remote_ip": "127.0.0.1", "secret": "good", "tls": "false"}]
    await client.send(encode_pub("orders", b"paid"))
    await client.expect_response(b"OK")
    await client.send(encode_pub("anything", b"also allowed"))
    await client.expect_response(b"OK")
    consumer = await authed(broker)
    await consumer.read_frame()
    await consumer.send(encode_sub("orders", "billing"))
    await consumer.expect_response(b"OK")
    stats = json.loads((await request(broker.addresses.http, "GET", "/stats?format=json&topic=orders")).body)
    client_stats = stats["topics"][0]["channels"][0]["clients"][0]
    assert (client_stats["authed"], client_stats["auth_identity"], client_stats["auth_identity_url"]) == (
        True, "billing-service", "https://example.com/billing")


@pytest.mark.parametrize(("command", "error"), [
    (encode_sub("orders", "shipping"), b'E_UNAUTHORIZED AUTH failed for SUB on "orders" "shipping"'),
    (encode_sub("invoices", "billing"), b'E_UNAUTHORIZED AUTH failed for SUB on "invoices" "billing"'),
])
async def test_what_the_authorizations_do_not_grant_is_refused(broker, command, error):
    client = await authed(broker)
    await client.read_frame()
    await client.send(command)
    await client.expect_error(error)


@pytest.mark.parametrize(("secret", "command", "error"), [
    ("short", encode_pub("invoices", b"x"), b'E_UNAUTHORIZED AUTH failed for PUB on "invoices" ""'),
    ("short", encode_sub("orders", "billing"), b'E_UNAUTHORIZED AUTH failed for SUB on "orders" "billing"'),
    ("no-channels", encode_pub("orders", b"x"), b'E_UNAUTHORIZED AUTH failed for PUB on "orders" ""'),
])
async def test_a_publish_grant_allows_only_its_topics(broker, secret, command, error):
    client = await authed(broker, secret)
    await client.read_frame()
    await client.send(command)
    await client.expect_error(error)


async def test_auth_twice_is_invalid(broker):
    client = await authed(broker)
    await client.read_frame()
    await client.send(encode_auth(b"good"))
    await client.expect_error(b"E_INVALID AUTH already set")


async def test_no_authorizations_is_unauthorized(broker):
    client = await authed(broker, "nothing")
    await client.expect_error(b"E_UNAUTHORIZED AUTH no authorizations found")


@pytest.mark.parametrize(("secret", "logged"), [
    ("unknown", 'got response 403 Forbidden "{\\"message\\":\\"NOT_AUTHORIZED\\"}"'),
    ("garbage", "invalid JSON"),
    ("bad-permission", "unknown permission admin"),
    ("bad-ttl", "invalid TTL 0 (must be >0)"),
    ("bad-pattern", 'unable to compile channel "(?<=a)b" error parsing regexp: invalid or unsupported Perl syntax: `(?<`'),
    ("slow", "request timed out"),
    ("huge", "answer too large (over 1048576 bytes)"),
    # nsqd sends the 200 KB URL and fails on the server's answer; it was a traceback and a close
    ("x" * 200_000, "InvalidURL: URL too long"),
    ("\u00e9" * 20_000, "InvalidURL: URL too long"),  # 120,000 characters once percent-encoded
], ids=lambda value: value if len(value) < 100 else f"{len(value)} characters")
async def test_a_bad_answer_fails_auth_without_telling_the_client_why(broker, authd, caplog, secret, logged):
    caplog.set_level(logging.INFO, "pynsqd")
    bystander = await authed(broker)
    await bystander.read_frame()
    client = await authed(broker, secret)
    await client.expect_error(b"E_AUTH_FAILED AUTH failed")
    assert f"AUTH failed failed to auth against {authd.address} - {logged}" in caplog.text
    await bystander.send(encode_pub("orders", b"unaffected"))
    await bystander.expect_response(b"OK")


async def test_an_answer_of_thousands_of_grants_is_read_whole(broker):
    client = await authed(broker, "many")
    assert json.loads((await client.read_frame()).data)["permission_count"] == 9001
    for _ in range(3):
        await client.send(encode_pub("orders", b"granted by the last"))
        await client.expect_response(b"OK")
    await client.send(encode_pub("t8999x", b"no grant matches"))
    await client.expect_error(b'E_UNAUTHORIZED AUTH failed for PUB on "t8999x" ""')


async def test_an_auth_server_that_is_down_fails_auth(start_daemon, caplog):
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        down = f"127.0.0.1:{unused.getsockname()[1]}"
    caplog.set_level(logging.INFO, "pynsqd")
    async with start_daemon(f"--auth-http-address={down}") as daemon:
        client = await authed(daemon)
        await client.expect_error(b"E_AUTH_FAILED AUTH failed")
    assert f"failed to auth against {down} - ConnectError" in caplog.text


async def test_the_next_server_is_asked_when_one_is_down(start_daemon, authd):
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        down = f"127.0.0.1:{unused.getsockname()[1]}"
    async with start_daemon(f"--auth-http-address={down}", f"--auth-http-address={authd.address}") as daemon:
        for _ in range(4):  # whichever server is tried first
            client = await authed(daemon)
            await client.expect_response(b'{"identity":"billing-service","identity_url":'
                                         b'"https://example.com/billing","permission_count":2}')


async def test_authorizations_are_asked_again_after_their_ttl(broker, authd):
    client = await authed(broker, "short")
    await client.read_frame()
    await client.send(encode_pub("orders", b"one"))
    await client.expect_response(b"OK")
    assert len(authd.queries) == 1
    (state,) = [c.auth_state for c in broker.broker.clients]
    await wait_for(state.expired, timeout=3)
    SECRETS["short"]["authorizations"] = []  # revoked meanwhile: the new answer grants nothing
    try:
        await client.send(encode_pub("orders", b"two"))
        await client.expect_error(b'E_UNAUTHORIZED AUTH failed for PUB on "orders" ""')
    finally:
        SECRETS["short"]["authorizations"] = [PUBLISH_ORDERS]
    assert len(authd.queries) == 2


async def test_tls_clients_send_tls_and_their_certificate_name(start_daemon, authd, tmp_path):
    certs = make_certificates(tmp_path / "certs")
    flags = certs.broker_flags(f"--auth-http-address={authd.address}", f"--tls-root-ca-file={certs.ca_file}",
                               "--tls-client-auth-policy=require-verify")
    async with start_daemon(*flags) as daemon:
        client = await connect(daemon.addresses.tcp)
        await negotiate(client, tls_v1=True)
        await upgrade_tls(client, certs.client_context(with_certificate=True))
        await client.send(encode_auth(b"good"))
        await client.read_frame()
    assert authd.queries[-1] == {"common_name": "client-one", "remote_ip": "127.0.0.1", "secret": "good",
                                 "tls": "true"}


async def test_auth_is_disabled_without_an_auth_server(daemon):
    client = await connect(daemon.addresses.tcp)
    await client.send(encode_auth(b"good"))
    await client.expect_error(b"E_AUTH_DISABLED AUTH disabled")
    with trio.fail_after(5):
        plain = await connect(daemon.addresses.tcp)
        await plain.send(encode_pub("t", b"x"))
        await plain.expect_response(b"OK")
