"""The registration client's timing against a recording stand-in for nsqlookupd.

nsqd pings every 15 s; the interval is shortened here so that a test sees several pings and
the reconnection a ping triggers after the lookupd went away.
"""

from __future__ import annotations

import logging

import pytest
import trio

import broker.lookup.client as lookup_client
from tests.support.fake_lookupd import start_fake_lookupd
from tests.support.http_client import request
from tests.support.waiting import wait_for

PING = b"PING\n"


async def serve_fake(conversations: list[list], port: int, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """A fake lookupd until its cancel scope (reported with its address) is cancelled."""
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            address = await start_fake_lookupd(nursery, conversations, port)
            task_status.started((address, scope))


@pytest.fixture
def short_pings(monkeypatch):
    monkeypatch.setattr(lookup_client, "PING_INTERVAL", 0.2)


async def test_pings_and_a_lookupd_back_from_a_restart_gets_everything_again(start_daemon, nursery, short_pings):
    conversations: list[list] = []
    address, fake = await nursery.start(serve_fake, conversations, 0)
    async with start_daemon(f"--lookupd-tcp-address={address}", "--broadcast-address=127.0.0.1") as daemon:
        http = daemon.addresses.http
        assert (await request(http, "POST", "/topic/create?topic=kept")).status == 200
        assert (await request(http, "POST", "/channel/create?topic=kept&channel=c")).status == 200
        assert (await request(http, "POST", "/topic/create?topic=bare")).status == 200
        await wait_for(lambda: conversations[0].count(PING) >= 2 and b"REGISTER bare\n" in conversations[0], timeout=5)
        # a change made while the connection is being set up may be registered twice (as by nsqd)
        registered = {line for line in conversations[0][2:] if line != PING}
        assert registered == {b"REGISTER kept\n", b"REGISTER kept c\n", b"REGISTER bare\n"}

        fake.cancel()  # lookupd goes away; the next ping finds the connection broken
        port = int(address.rpartition(":")[2])
        await nursery.start(serve_fake, conversations, port)
        await wait_for(lambda: len(conversations) == 2 and PING in conversations[1], timeout=5)
        again = conversations[1]
        assert again[0] == b"  V1" and again[1][0] == "IDENTIFY"
        # everything is registered again (a topic with channels by its channels), then the ping
        assert again[2:5] == [b"REGISTER bare\n", b"REGISTER kept c\n", PING]


async def test_a_lookupd_added_by_put_config_is_told_everything(start_daemon, nursery):
    conversations: list[list] = []
    address, _ = await nursery.start(serve_fake, conversations, 0)
    async with start_daemon() as daemon:
        http = daemon.addresses.http
        assert (await request(http, "POST", "/topic/create?topic=before")).status == 200
        assert conversations == []
        body = f'["{address}"]'.encode()
        reply = await request(http, "PUT", "/config/nsqlookupd_tcp_addresses", body)
        assert (reply.status, reply.body) == (200, body)
        await wait_for(lambda: conversations and len(conversations[0]) >= 3, timeout=5)
        assert conversations[0][2] == b"REGISTER before\n"
        identity = conversations[0][1][1]
        assert (identity["tcp_port"], identity["http_port"]) == (daemon.addresses.tcp[1], http[1])
        assert identity["broadcast_address"] == daemon.broker.options.broadcast_address
        assert identity["version"] == "1.3.0"


#: nsqd 1.3.0's log line at its first PING for each unusable --lookupd-tcp-address (measured:
#: nsqd takes them at start, as pynsqd does, and says why at every PING)
UNUSABLE_LOOKUPD = {
    "127.0.0.1:99999": "dial tcp: address 99999: invalid port",
    "127.0.0.1:-1": "dial tcp: address -1: invalid port",
    "127.0.0.1": "dial tcp: address 127.0.0.1: missing port in address",
    "127.0.0.1:abc": "dial tcp: address tcp/abc: unknown port",
}


async def test_an_unusable_lookupd_address_is_logged_at_each_ping_in_nsqds_words(start_daemon, short_pings, caplog):
    caplog.set_level(logging.INFO, logger="pynsqd")
    flags = [f"--lookupd-tcp-address={address}" for address in UNUSABLE_LOOKUPD]
    expected = {f"LOOKUPD({address}): PING - {why}" for address, why in UNUSABLE_LOOKUPD.items()}

    def errors() -> set[str]:
        return {r.getMessage() for r in caplog.records if r.levelno == logging.ERROR}

    async with start_daemon(*flags) as daemon:
        await wait_for(lambda: expected <= errors(), timeout=10)
        assert (await request(daemon.addresses.http, "GET", "/ping")).body == b"OK"
    assert errors() == expected
