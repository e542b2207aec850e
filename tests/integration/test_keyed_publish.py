"""Keyed publishes on the wire: IDENTIFY ``publish_keys``, keyed PUB/MPUB/DPUB, duplicates dropped."""

from __future__ import annotations

import errno
import logging
import re

import pytest
import trio

from broker.protocol import encode_dpub, encode_identify, encode_mpub, encode_pub
from broker.protocol.keys import duplicates_in_answer, prefix_key
from tests.support.diskfaults import FaultyDisk
from tests.support.http_client import HTTPClient, request
from tests.support.v2client import connect, consume
from tests.support.waiting import wait_for


async def keyed_client(daemon):
    client = await connect(daemon.addresses.tcp)
    answer = await client.identify(feature_negotiation=True, publish_keys=True)
    assert answer is not None and answer["publish_keys"] is True
    return client


async def answer_of(client, payload: bytes) -> bytes:
    await client.send(payload)
    return (await client.read_frame()).data


def topic_count(daemon, topic="t") -> int:
    return daemon.broker.topics[topic].message_count


async def test_identify_offers_keys_only_to_a_client_that_asks(daemon):
    plain = await connect(daemon.addresses.tcp)
    answer = await plain.identify(feature_negotiation=True)
    assert "publish_keys" not in answer and "dedup_window" not in answer
    keyed = await connect(daemon.addresses.tcp)
    answer = await keyed.identify(feature_negotiation=True, publish_keys=True)
    assert (answer["publish_keys"], answer["dedup_window"]) == (True, 600_000)
    # false asks for nothing: nsqd's answer
    off = await connect(daemon.addresses.tcp)
    assert "publish_keys" not in await off.identify(feature_negotiation=True, publish_keys=False)


async def test_a_repeated_key_is_answered_as_a_duplicate_and_stored_once(daemon):
    client = await keyed_client(daemon)
    assert await answer_of(client, encode_pub("t", prefix_key(b"order-1", b"first"))) == b"OK"
    assert await answer_of(client, encode_pub("t", prefix_key(b"order-1", b"retry"))) == b"DUPLICATE"
    assert await answer_of(client, encode_dpub("t", 0, prefix_key(b"order-1", b"late"))) == b"DUPLICATE"
    assert await answer_of(client, encode_pub("t", prefix_key(b"order-2", b"second"))) == b"OK"
    # unkeyed messages on a keyed connection are stored every time
    assert await answer_of(client, encode_pub("t", prefix_key(None, b"plain"))) == b"OK"
    assert await answer_of(client, encode_pub("t", prefix_key(None, b"plain"))) == b"OK"
    assert await consume(daemon, "t", "check", 4, quiet=True) == [b"first", b"second", b"plain", b"plain"]


async def test_mpub_counts_duplicates_within_and_across_batches(daemon):
    client = await keyed_client(daemon)
    first = [prefix_key(b"k%d" % i, b"m%d" % i) for i in range(5)] + [prefix_key(b"k0", b"again")]
    answer = await answer_of(client, encode_mpub("t", first))
    assert answer == b"DUPLICATE 1" and duplicates_in_answer(answer) == 1
    second = [prefix_key(b"k%d" % i, b"n%d" % i) for i in range(3, 8)]
    assert await answer_of(client, encode_mpub("t", second)) == b"DUPLICATE 2"
    assert await answer_of(client, encode_mpub("t", [prefix_key(b"k9", b"x")])) == b"OK"
    assert await answer_of(client, encode_mpub("t", [prefix_key(b"k9", b"x")] * 3)) == b"DUPLICATE 3"
    assert await consume(daemon, "t", "check", 9, quiet=True) == [b"m0", b"m1", b"m2", b"m3", b"m4", b"n5", b"n6", b"n7", b"x"]


async def test_keys_are_per_topic_and_a_plain_connection_is_untouched(daemon):
    client = await keyed_client(daemon)
    assert await answer_of(client, encode_pub("a", prefix_key(b"same", b"to a"))) == b"OK"
    assert await answer_of(client, encode_pub("b", prefix_key(b"same", b"to b"))) == b"OK"
    plain = await connect(daemon.addresses.tcp)
    # on a plain connection the bytes are the body, whatever they look like
    assert await answer_of(plain, encode_pub("a", prefix_key(b"same", b"to a"))) == b"OK"
    assert (topic_count(daemon, "a"), topic_count(daemon, "b")) == (2, 1)
    assert await consume(daemon, "a", "check", 2, quiet=True) == [b"to a", b"\x04sameto a"]


async def test_bad_keyed_messages_get_nsqds_kind_of_error(daemon):
    cases = [
        (encode_pub("t", b"\xc8" + b"k" * 300), b"E_BAD_MESSAGE PUB invalid key length 200"),
        (encode_pub("t", b"\x81" + b"k" * 200), b"E_BAD_MESSAGE PUB invalid key length 129"),
        (encode_pub("t", b"\x05abc"), b"E_BAD_MESSAGE PUB invalid key length 5"),
        (encode_pub("t", b"\x03abc"), b"E_BAD_MESSAGE PUB invalid message body size 0"),
        (encode_pub("t", b"\x00"), b"E_BAD_MESSAGE PUB invalid message body size 0"),
        (encode_dpub("t", 10, b"\x09"), b"E_BAD_MESSAGE DPUB invalid key length 9"),
        (encode_mpub("t", [prefix_key(b"a", b"ok"), b"\x01a"]), b"E_BAD_MESSAGE MPUB invalid message(1) body size 0"),
    ]
    for payload, error in cases:
        client = await keyed_client(daemon)
        await client.send(payload)
        await client.expect_error(error)
    assert "t" not in daemon.broker.topics or topic_count(daemon) == 0  # an MPUB is refused whole


async def test_max_msg_size_bounds_the_body_not_the_key(start_daemon):
    async with start_daemon("--max-msg-size=100") as daemon:
        client = await keyed_client(daemon)
        key = b"k" * 128
        assert await answer_of(client, encode_pub("t", prefix_key(key, b"b" * 100))) == b"OK"
        await client.send(encode_pub("t", prefix_key(b"k", b"b" * 101)))
        await client.expect_error(b"E_BAD_MESSAGE PUB message too big 101 > 100")


async def test_a_key_is_stored_again_once_the_window_has_passed(start_daemon):
    async with start_daemon("--dedup-window=300ms") as daemon:
        client = await keyed_client(daemon)
        assert await answer_of(client, encode_pub("t", prefix_key(b"k", b"one"))) == b"OK"
        assert await answer_of(client, encode_pub("t", prefix_key(b"k", b"dup"))) == b"DUPLICATE"
        await trio.sleep(0.35)  # the window is a duration: only its passing is tested here
        assert await answer_of(client, encode_pub("t", prefix_key(b"k", b"two"))) == b"OK"
        await wait_for(lambda: daemon.broker.keys.held == 1 or daemon.broker.keys.held == 2)
        assert await consume(daemon, "t", "check", 2, quiet=True) == [b"one", b"two"]


async def test_max_keys_forgets_the_oldest_and_counts_them(start_daemon):
    async with start_daemon("--dedup-max-keys=3") as daemon:
        client = await keyed_client(daemon)
        batch = [prefix_key(b"k%d" % i, b"m%d" % i) for i in range(5)]
        assert await answer_of(client, encode_mpub("t", batch)) == b"OK"
        assert (daemon.broker.keys.held, daemon.broker.keys.evicted) == (3, 2)
        # k0 and k1 were forgotten early: stored again; k2..k4 are still duplicates
        again = [prefix_key(b"k%d" % i, b"again") for i in range(5)]
        assert await answer_of(client, encode_mpub("t", again)) == b"DUPLICATE 3"
        assert topic_count(daemon) == 7


async def test_dedup_window_zero_remembers_nothing(start_daemon):
    async with start_daemon("--dedup-window=0") as daemon:
        client = await keyed_client(daemon)
        assert await answer_of(client, encode_pub("t", prefix_key(b"k", b"a"))) == b"OK"
        assert await answer_of(client, encode_pub("t", prefix_key(b"k", b"b"))) == b"OK"
        assert topic_count(daemon) == 2 and daemon.broker.keys.held == 0


async def test_keys_survive_a_graceful_restart(start_daemon):
    async with start_daemon() as daemon:
        client = await keyed_client(daemon)
        assert await answer_of(client, encode_mpub("t", [prefix_key(b"k%d" % i, b"m") for i in range(100)])) == b"OK"
        await client.aclose()
    async with start_daemon() as daemon:
        assert daemon.broker.keys.held == 100
        client = await keyed_client(daemon)
        assert await answer_of(client, encode_mpub("t", [prefix_key(b"k%d" % i, b"m") for i in range(99, 102)])) \
            == b"DUPLICATE 1"
        assert topic_count(daemon) == 2
        await client.aclose()
    # and a second restart still has them, with the two new ones
    async with start_daemon() as daemon:
        assert daemon.broker.keys.held == 102


async def test_a_deleted_topic_forgets_its_keys(daemon):
    client = await keyed_client(daemon)
    assert await answer_of(client, encode_pub("t", prefix_key(b"k", b"a"))) == b"OK"
    assert (await request(daemon.addresses.http, "POST", "/topic/delete?topic=t")).status == 200
    assert await answer_of(client, encode_pub("t", prefix_key(b"k", b"b"))) == b"OK"
    assert topic_count(daemon) == 1


@pytest.mark.parametrize("mode", [[], ["--durable"], ["--durable", "--mem-queue-size=0"]],
                         ids=["default", "durable", "durable-no-memory"])
async def test_keyed_publishes_racing_a_topic_delete_land_before_it_or_get_nsqds_exiting(start_daemon, caplog, mode):
    """nsqd answers a put to a topic being deleted with ``exiting`` (``E_PUB_FAILED PUB failed
    exiting``, ``503 EXITING``) and logs no error; a keyed publish must do the same, whichever of
    its steps (keys, journal, messages, sync) the delete comes between."""
    caplog.set_level(logging.INFO, logger="pynsqd")
    tcp_answers: list[bytes] = []
    http_answers: list[tuple[int, bytes]] = []
    tcp_allowed = {b"OK", b"E_PUB_FAILED PUB failed exiting", b"E_MPUB_FAILED MPUB failed exiting"}
    async with start_daemon(*mode) as daemon:
        async def tcp_publisher(n: int) -> None:
            client = await keyed_client(daemon)
            for i in range(120):
                if i % 3:
                    payload = encode_pub("kd", prefix_key(b"t%d-%d" % (n, i), b"x"))
                else:  # now and then more than one piece (2048 messages)
                    size = 2500 if i % 30 == 0 else 4
                    payload = encode_mpub("kd", [prefix_key(b"t%d-%d-%d" % (n, i, j), b"y") for j in range(size)])
                await client.send(payload)
                answer = (await client.read_frame()).data
                tcp_answers.append(answer)
                if answer != b"OK":  # nsqd's failed put is fatal: the connection is closed
                    await client.expect_closed()
                    client = await keyed_client(daemon)
            await client.aclose()

        async def http_publisher(n: int) -> None:
            async with HTTPClient(daemon.addresses.http) as http:
                for i in range(80):
                    if i % 2:
                        reply = await http.post(f"/pub?topic=kd&key=h{n}-{i}", b"x")
                    else:
                        reply = await http.post("/mpub?topic=kd&keyed=true", b"".join(
                            b"h%d-%d-%d x\n" % (n, i, j) for j in range(4)))
                    http_answers.append((reply.status, reply.body))

        async def deleter() -> None:
            async with HTTPClient(daemon.addresses.http) as http:
                for _ in range(150):
                    assert (await http.post("/topic/delete?topic=kd")).status in (200, 404)
                    await trio.sleep(0)

        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                for n in range(3):
                    nursery.start_soon(tcp_publisher, n)
                for n in range(2):
                    nursery.start_soon(http_publisher, n)
                nursery.start_soon(deleter)
        assert (await request(daemon.addresses.http, "GET", "/ping")).body == b"OK"
        # the last delete leaves no file of the topic behind, its keys' journal included
        if "kd" in daemon.broker.topics:
            assert (await request(daemon.addresses.http, "POST", "/topic/delete?topic=kd")).status == 200
        assert sorted(p.name for p in daemon.broker._storage.path.iterdir() if p.name.startswith("kd")) == []
    assert len(tcp_answers) == 3 * 120 and set(tcp_answers) <= tcp_allowed, set(tcp_answers) - tcp_allowed
    assert len(http_answers) == 2 * 80 and set(http_answers) <= {(200, b"OK"), (503, b'{"message":"EXITING"}')}, \
        set(http_answers)
    assert b"OK" in tcp_answers and (200, b"OK") in http_answers
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []


async def test_an_http_mpub_whose_topic_is_deleted_while_its_body_comes_gets_503_exiting(daemon, caplog):
    """nsqd takes the topic before reading an ``/mpub`` body and answers ``503 EXITING`` when the
    topic was deleted meanwhile; nothing is stored, no file of the deleted topic is made again."""
    caplog.set_level(logging.INFO, logger="pynsqd")
    # 100 KB: more than is read before the endpoint runs; 1,000 messages: queued in one piece
    body = b"".join(b"k%d %s\n" % (i, b"m" * 95) for i in range(1000))
    stream = await trio.open_tcp_stream(*daemon.addresses.http)
    async with stream:
        await stream.send_all(b"POST /mpub?topic=kd&keyed=true HTTP/1.1\r\nHost: x\r\n"
                              b"Content-Length: %d\r\n\r\n" % len(body) + body[:5])
        await wait_for(lambda: "kd" in daemon.broker.topics)  # the endpoint took the topic
        assert (await request(daemon.addresses.http, "POST", "/topic/delete?topic=kd")).status == 200
        await stream.send_all(body[5:])
        with trio.fail_after(10):
            answer = b""
            while not re.search(rb"(?is)content-length: (\d+)\r\n.*\r\n\r\n", answer) or \
                    len(answer.partition(b"\r\n\r\n")[2]) < int(re.search(rb"(?i)content-length: (\d+)", answer)[1]):
                data = await stream.receive_some(4096)
                assert data, answer
                answer += data
    assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), answer
    assert answer.endswith(b'\r\n\r\n{"message":"EXITING"}'), answer
    assert "kd" not in daemon.broker.topics
    assert sorted(p.name for p in daemon.broker._storage.path.iterdir() if p.name.startswith("kd")) == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_identify_publish_keys_must_be_a_boolean(daemon):
    client = await connect(daemon.addresses.tcp)
    await client.send(encode_identify({"feature_negotiation": True, "publish_keys": "yes"}))
    await client.expect_error(b"E_BAD_BODY IDENTIFY failed to decode JSON body")


# -- HTTP -----------------------------------------------------------------------------------------


async def http(daemon, method: str, target: str, body: bytes | None = None):
    return await request(daemon.addresses.http, method, target, body)


async def test_http_pub_with_a_key_answers_ok_and_counts_duplicates_in_a_header(daemon):
    first = await http(daemon, "POST", "/pub?topic=h&key=order%2F1", b"one")
    assert (first.status, first.body, first.headers["x-duplicates"]) == (200, b"OK", "0")
    again = await http(daemon, "POST", "/pub?topic=h&key=order%2F1&defer=10", b"two")
    assert (again.status, again.body, again.headers["x-duplicates"]) == (200, b"OK", "1")
    plain = await http(daemon, "POST", "/pub?topic=h", b"three")
    assert plain.body == b"OK" and "x-duplicates" not in plain.headers
    # the same key over TCP: the topic's keys, whoever publishes
    client = await keyed_client(daemon)
    assert await answer_of(client, encode_pub("h", prefix_key(b"order/1", b"tcp"))) == b"DUPLICATE"
    assert await consume(daemon, "h", "check", 2, quiet=True) == [b"one", b"three"]


async def test_http_bad_keys_are_refused(daemon):
    for target in ("/pub?topic=h&key=", "/pub?topic=h&key=" + "k" * 129):
        reply = await http(daemon, "POST", target, b"x")
        assert (reply.status, reply.body) == (400, b'{"message":"INVALID_KEY"}')
    reply = await http(daemon, "POST", "/mpub?topic=h&keyed=true", b"k1 ok\nno-space-here\n")
    assert (reply.status, reply.body) == (400, b'{"message":"INVALID_KEY"}')
    reply = await http(daemon, "POST", "/mpub?topic=h&keyed=true", b"k1 \n")
    assert (reply.status, reply.body) == (400, b'{"message":"MSG_EMPTY"}')
    assert "h" not in daemon.broker.topics or topic_count(daemon, "h") == 0


async def test_http_keyed_mpub_text_and_binary(daemon):
    reply = await http(daemon, "POST", "/mpub?topic=h&keyed=true", b"a first\nb second one\n\na dup\n")
    assert (reply.status, reply.headers["x-duplicates"]) == (200, "1")
    binary = encode_mpub("h", [prefix_key(b"b", b"dup"), prefix_key(b"c\nc", b"third"), prefix_key(None, b"plain")])
    reply = await http(daemon, "POST", "/mpub?topic=h&keyed=true&binary=true", binary[binary.index(b"\n") + 5:])
    assert (reply.status, reply.headers["x-duplicates"]) == (200, "1")
    assert await consume(daemon, "h", "check", 4, quiet=True) == [b"first", b"second one", b"third", b"plain"]


async def test_http_keyed_body_may_fill_max_msg_size_besides_its_key(start_daemon):
    async with start_daemon("--max-msg-size=10") as daemon:
        reply = await http(daemon, "POST", "/mpub?topic=h&keyed=true", b"k" * 128 + b" " + b"b" * 10)
        assert reply.status == 200
        reply = await http(daemon, "POST", "/mpub?topic=h&keyed=true", b"k " + b"b" * 11)
        assert (reply.status, reply.body) == (413, b'{"message":"MSG_TOO_BIG"}')


# -- /stats and /metrics --------------------------------------------------------------------------


async def test_stats_and_metrics_count_keyed_publishes_only_for_topics_that_had_them(start_daemon):
    async with start_daemon("--dedup-max-keys=4") as daemon:
        await http(daemon, "POST", "/pub?topic=plain", b"x")
        client = await keyed_client(daemon)
        batch = [prefix_key(b"k%d" % i, b"m") for i in range(5)] + [prefix_key(b"k4", b"m"), prefix_key(None, b"u")]
        assert await answer_of(client, encode_mpub("keyed", batch)) == b"DUPLICATE 1"
        doc = (await http(daemon, "GET", "/stats?format=json")).json()
        topics = {t["topic_name"]: t for t in doc["topics"]}
        assert "keyed_count" not in topics["plain"]  # nsqd's shape where keys were never used
        keyed = topics["keyed"]
        assert list(keyed)[-3:] == ["keyed_count", "duplicate_count", "keys_held"]
        assert (keyed["message_count"], keyed["keyed_count"], keyed["duplicate_count"], keyed["keys_held"]) == (
            6, 6, 1, 4)
        text = (await http(daemon, "GET", "/stats")).body.decode()
        assert "keyed: 6 duplicates: 1 keys: 4\n" in text
        metrics = (await http(daemon, "GET", "/metrics")).body.decode().splitlines()
        for line in ('nsq_topic_keyed_count{topic="keyed"} 6.0', 'nsq_topic_duplicate_count{topic="keyed"} 1.0',
                     'nsq_topic_keys_held{topic="keyed"} 4.0', "nsq_dedup_keys_held 4.0",
                     "nsq_dedup_keys_evicted 1.0"):
            assert line in metrics
        assert not any(line.startswith("nsq_topic_keyed_count{topic=\"plain\"") for line in metrics)


# -- a disk that refuses ---------------------------------------------------------------------------


@pytest.mark.parametrize("refusing", ["the messages' queue", "the keys' journal"])
async def test_a_keyed_publish_the_disk_refused_is_stored_by_its_retry_and_then_only_once(start_daemon, tmp_path,
                                                                                          refusing):
    part = "k.diskqueue" if refusing == "the messages' queue" else "k#keys.diskqueue"
    disk = FaultyDisk(lambda name: name.startswith(part))
    batch = encode_mpub("k", [prefix_key(b"k%d" % i, b"m%d" % i) for i in range(5)])
    with disk.installed():
        async with start_daemon("--durable", "--mem-queue-size=0") as daemon:
            client = await keyed_client(daemon)
            assert await answer_of(client, encode_pub("k", prefix_key(b"first", b"first"))) == b"OK"
            disk.fail(errno.ENOSPC)
            await client.send(batch)
            frame = await client.read_frame()
            assert frame.data.startswith(b"E_MPUB_FAILED MPUB failed"), frame
            disk.fail(None)
            client = await keyed_client(daemon)  # the failed publish closed the connection
            assert await answer_of(client, batch) == b"OK"  # its keys were forgotten: stored now
            assert await answer_of(client, batch) == b"DUPLICATE 5"
            await client.aclose()
        async with start_daemon("--durable", "--mem-queue-size=0") as daemon:
            client = await keyed_client(daemon)  # after a restart the journal agrees
            assert await answer_of(client, batch) == b"DUPLICATE 5"
            assert await consume(daemon, "k", "check", 6, quiet=True) == [b"first"] + [b"m%d" % i for i in range(5)]
