"""What an nsqlookupd says is checked as a client's input is.

Channel names it gives for a new topic pass the rule a client's names pass.

nsqd creates whatever ``GET /channels?topic=`` lists; a name that cannot be a file (``x/y``,
300 characters) then fails only that channel's writes. pynsqd refuses such a name as it
refuses it from a client: logged and skipped, the topic and its good channels unharmed, and
every acknowledged message kept across a restart. Its IDENTIFY answer is read as nsqd's Go
decoder reads it: a port that is not an int64 integer is a parsing error, not an exception.
"""

from __future__ import annotations

import errno
import logging

import pytest
import trio

from broker.protocol import encode_pub
from tests.support.diskfaults import FaultyDisk
from tests.support.fake_lookupd import start_fake_lookupd
from tests.support.http_client import request
from tests.support.logs import no_traceback_logged
from tests.support.v2client import connect, publish, subscriber
from tests.support.waiting import wait_for

BAD_NAMES = ["x/y", "a" * 300, "", "has space", "a" * 65, "caf\u00e9", "x\ny", "a#ephemeral#ephemeral", "../x"]
GOOD = ["ok_chan", "b" * 64, ".."]  # ".." is a name nsqd's rule allows: its files are "newtopic:...diskqueue..."


async def channel_depths(daemon, topic: str) -> dict[str, int]:
    stats = (await request(daemon.addresses.http, "GET", f"/stats?format=json&topic={topic}")).json()
    return {ch["channel_name"]: ch["depth"] for t in stats["topics"] for ch in t["channels"]}


@pytest.mark.parametrize("mode", [[], ["--durable"]], ids=["memory", "durable"])
async def test_bad_channel_names_from_lookupd_are_skipped_and_nothing_acknowledged_is_lost(
        start_daemon, nursery, tmp_path, caplog: pytest.LogCaptureFixture, mode: list[str]) -> None:
    conversations: list[list] = []
    # names that are not strings are ignored as before; a #ephemeral one waits for its consumer
    answer = [*GOOD[:1], *BAD_NAMES, 7, None, *GOOD[1:], "eph#ephemeral"]
    address = await start_fake_lookupd(nursery, conversations, channels=answer)
    flags = [f"--lookupd-tcp-address={address}", "--broadcast-address=127.0.0.1", *mode]
    with trio.fail_after(30):
        async with start_daemon(*flags) as daemon:
            # a first topic's REGISTER follows the lookupd's IDENTIFY answer: it is known from then on
            assert (await request(daemon.addresses.http, "POST", "/topic/create?topic=first")).status == 200
            await wait_for(lambda: conversations and b"REGISTER first\n" in conversations[0], timeout=10)

            await publish(daemon, "newtopic", *[b"m%d" % i for i in range(6)])
            assert await channel_depths(daemon, "newtopic") == {name: 6 for name in GOOD}
            assert (await request(daemon.addresses.http, "GET", "/ping")).body == b"OK"

        skipped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("TOPIC(newtopic): skipping invalid channel name")]
        assert len(skipped) == len(BAD_NAMES), skipped
        assert any(line.endswith(' "x/y" from nsqlookupd') for line in skipped), skipped
        assert any(line.endswith('... (300 characters) from nsqlookupd') for line in skipped), skipped
        no_traceback_logged(caplog)

        async with start_daemon(*mode) as daemon:  # what was acknowledged is all there after a restart
            assert await channel_depths(daemon, "newtopic") == {name: 6 for name in GOOD}
            client = await subscriber(daemon, "newtopic", "ok_chan", rdy=10)
            assert [m.body for m in await client.read_messages(6)] == [b"m%d" % i for i in range(6)]
            await client.aclose()
    channel_files = {p.name for p in (tmp_path / "data").iterdir() if p.name.startswith("newtopic:")}
    assert channel_files and all(name.startswith(tuple(f"newtopic:{good}." for good in GOOD))
                                 for name in channel_files), channel_files
    assert not (tmp_path / "data" / "newtopic:x").exists()


async def test_a_channel_the_disk_refuses_does_not_stop_the_topic(start_daemon, nursery, tmp_path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """A channel the disk will not let open costs that channel only.

    Its damaged checkpoint must be set aside (renamed ``.bad``) on a disk that refuses every change.
    """
    conversations: list[list] = []
    address = await start_fake_lookupd(nursery, conversations, channels=["blocked", "ok_chan"])
    (tmp_path / "data").mkdir()  # the damaged checkpoint is there when the broker starts
    (tmp_path / "data" / "newtopic:blocked.diskqueue.meta.dat").write_bytes(b"\xff" * 40)
    disk = FaultyDisk(matches=lambda name: name.startswith("newtopic:blocked"))
    disk.fail(errno.EROFS)
    with trio.fail_after(30), disk.installed():
        async with start_daemon(f"--lookupd-tcp-address={address}", "--broadcast-address=127.0.0.1",
                                "--durable") as daemon:
            assert (await request(daemon.addresses.http, "POST", "/topic/create?topic=first")).status == 200
            await wait_for(lambda: conversations and b"REGISTER first\n" in conversations[0], timeout=10)
            await publish(daemon, "newtopic", b"one", b"two")
            assert await channel_depths(daemon, "newtopic") == {"ok_chan": 2}
            assert (await request(daemon.addresses.http, "GET", "/ping")).body == b"OK"
    assert disk.refused
    assert any(r.getMessage().startswith("TOPIC(newtopic): failed to create channel blocked named by nsqlookupd")
               for r in caplog.records)


@pytest.mark.parametrize("answer", [
    b'{"tcp_port": 4160, "http_port": 1e400, "broadcast_address": "127.0.0.1"}',
    b'{"tcp_port": 4160, "http_port": 1%s, "broadcast_address": "127.0.0.1"}' % (b"0" * 400),
    b'{"tcp_port": 4160, "http_port": 99999999, "broadcast_address": "127.0.0.1"}',
    b'{"tcp_port": [4160], "http_port": 4161, "broadcast_address": "127.0.0.1"}',
    b'{"tcp_port": 4160, "http_port": 4161, "broadcast_address": ["127.0.0.1"]}',
], ids=["infinite", "400-digits", "past-65535", "array", "address-array"])
async def test_a_hostile_identify_answer_from_lookupd_costs_nothing(start_daemon, nursery, answer: bytes,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    conversations: list[list] = []
    address = await start_fake_lookupd(nursery, conversations, identify_answer=answer)
    caplog.set_level(logging.INFO, logger="pynsqd.lookup")
    with trio.fail_after(30):
        async with start_daemon(f"--lookupd-tcp-address={address}", "--broadcast-address=127.0.0.1") as daemon:
            assert (await request(daemon.addresses.http, "POST", "/topic/create?topic=first")).status == 200
            # the answer was read: refused as nsqd refuses it, or taken
            await wait_for(lambda: "parsing response" in caplog.text or "peer info" in caplog.text, timeout=10)
            for n in range(3):  # each new topic asks the lookupd for its channels
                await publish(daemon, f"new{n}", b"one", b"two")
                assert await channel_depths(daemon, f"new{n}") == {}
            assert (await request(daemon.addresses.http, "GET", "/ping")).body == b"OK"
    if b"99999999" in answer:  # nsqd's query fails in Go's dial: the same words
        assert ('Get "http://127.0.0.1:99999999/channels?topic=new0": dial tcp: address 99999999: invalid port'
                in caplog.text)
    no_traceback_logged(caplog)


#: Channels a lookupd lists for a new topic: made in one go, they held every connection
#: for about 2 s (0.1 ms each), where nsqd makes them on the publisher's goroutine alone.
MANY_CHANNELS = 20_000
#: The worst PUB round trip allowed on another connection meanwhile, as a share of the time
#: the channels took to make (both stretch alike on a busy machine; held, it was all of it).
MAX_HELD_SHARE = 0.5


async def test_a_lookupd_listing_many_channels_does_not_hold_the_other_connections(broker_process, nursery) -> None:
    conversations: list[list] = []
    names = [f"c{n}" for n in range(MANY_CHANNELS)]
    address = await start_fake_lookupd(nursery, conversations, channels={"newtopic": names})
    with trio.fail_after(120):
        proc = broker_process(f"--lookupd-tcp-address={address}", "--broadcast-address=127.0.0.1")
        assert (await request(proc.http, "POST", "/topic/create?topic=first")).status == 200
        await wait_for(lambda: conversations and b"REGISTER first\n" in conversations[0], timeout=10)
        prober = await connect(proc.tcp)
        await prober.send(encode_pub("probe", b"first"))
        await prober.expect_response(b"OK")
        round_trips: list[float] = []
        published = trio.Event()
        took: list[float] = []

        async def probe() -> None:
            while not published.is_set():
                round_trips.append(await prober.timed_pub("probe", b"x"))

        async def publish_new_topic() -> None:
            publisher = await connect(proc.tcp, timeout=60)  # answered once the channels are made
            took.append(await publisher.timed_pub("newtopic", b"one"))
            published.set()

        async with trio.open_nursery() as probing:
            probing.start_soon(probe)
            probing.start_soon(publish_new_topic)
        print(f"{len(round_trips)} round trips, worst {max(round_trips) * 1000:.1f} ms; "
              f"the channels took {took[0]:.2f} s")
        stats = (await request(proc.http, "GET", "/stats?format=json&topic=newtopic")).json()
        assert sum(ch["depth"] for t in stats["topics"] for ch in t["channels"]) == MANY_CHANNELS
        assert max(round_trips) < MAX_HELD_SHARE * took[0], (
            f"a PUB waited {max(round_trips):.2f} s of the {took[0]:.2f} s the channels took")
        assert "Traceback" not in proc.log_text()


async def test_a_lookupd_answer_that_never_ends_times_out_with_a_reason(start_daemon, nursery,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    conversations: list[list] = []
    endless = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"cha\r\n"
    address = await start_fake_lookupd(nursery, conversations, channels={"newtopic": endless})
    with trio.fail_after(30):
        async with start_daemon(f"--lookupd-tcp-address={address}", "--broadcast-address=127.0.0.1",
                                "--http-client-request-timeout=200ms") as daemon:
            assert (await request(daemon.addresses.http, "POST", "/topic/create?topic=first")).status == 200
            await wait_for(lambda: conversations and b"REGISTER first\n" in conversations[0], timeout=10)
            await publish(daemon, "newtopic", b"one")  # answered once the lookupd is given up
            assert await channel_depths(daemon, "newtopic") == {}
    warnings = [r.getMessage() for r in caplog.records if "pre-create for topic newtopic" in r.getMessage()]
    # nsqd: "... context deadline exceeded (Client.Timeout or context cancellation while reading body)"
    assert len(warnings) == 1 and warnings[0].endswith("/channels?topic=newtopic\": i/o timeout"), warnings
    no_traceback_logged(caplog)


@pytest.mark.parametrize("address", ["127.0.0.1\x00.example", "127.0.0.1\x00\r\nX-Injected: 1"], ids=["nul", "nul-crlf"])
async def test_a_broadcast_address_with_control_characters_is_refused(start_daemon, nursery, address: str,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """nsqd refuses the URL (``net/url: invalid control character in URL``); the name resolver
    stopped at the NUL and asked 127.0.0.1, sending the rest as part of the ``Host`` header."""
    conversations: list[list] = []
    lookupd = await start_fake_lookupd(nursery, conversations, channels=["ok_chan"],
                                       identify_answer={"broadcast_address": address})
    with trio.fail_after(30):
        async with start_daemon(f"--lookupd-tcp-address={lookupd}", "--broadcast-address=127.0.0.1") as daemon:
            assert (await request(daemon.addresses.http, "POST", "/topic/create?topic=first")).status == 200
            await wait_for(lambda: conversations and b"REGISTER first\n" in conversations[0], timeout=10)
            await publish(daemon, "newtopic", b"one")
            assert await channel_depths(daemon, "newtopic") == {}
    warnings = [r.getMessage() for r in caplog.records if "pre-create for topic newtopic" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].endswith("net/url: invalid control character in URL"), warnings
    assert '127.0.0.1\\x00' in warnings[0], warnings
    no_traceback_logged(caplog)
