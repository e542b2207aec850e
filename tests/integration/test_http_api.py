"""Integration tests: every nsqd HTTP endpoint against a broker on 127.0.0.1:0.

Status codes, bodies and headers are compared with what nsqd 1.3.0 answers
(``nsqd/http.go``, ``nsqd/http_test.go``).
"""

from __future__ import annotations

import json
import socket
import struct

import pytest
import trio

from broker.config import parse_args
from broker.daemon import Daemon
from tests.support.http_client import HTTPClient, raw_exchange, request
from tests.support.processes import broker_args
from tests.support.v2client import consume
from tests.support.waiting import wait_for

NSQ_HEADER = "nsq; version=1.0"
JSON_TYPE = "application/json; charset=utf-8"
TEXT_TYPE = "text/plain; charset=utf-8"


def http(daemon) -> tuple[str, int]:
    return daemon.addresses.http


async def call(daemon, method, target, body=None, **kw):
    return await request(http(daemon), method, target, body, **kw)


def assert_error(reply, status, message):
    assert reply.status == status, reply
    assert reply.body == json.dumps({"message": message}, separators=(",", ":")).encode()
    assert reply.headers["content-type"] == JSON_TYPE
    assert reply.headers["x-nsq-content-type"] == NSQ_HEADER


def assert_empty_ok(reply):
    assert reply.status == 200, reply
    assert reply.body == b""
    assert reply.headers["x-nsq-content-type"] == NSQ_HEADER
    assert reply.headers["content-length"] == "0"


def mpub_body(bodies):
    return struct.pack(">i", len(bodies)) + b"".join(struct.pack(">i", len(b)) + b for b in bodies)


# --------------------------------------------------------------------------- /ping and /info


async def test_ping_ok_is_plain_text(daemon):
    reply = await call(daemon, "GET", "/ping")
    assert (reply.status, reply.body) == (200, b"OK")
    assert reply.headers["content-type"] == TEXT_TYPE
    assert "x-nsq-content-type" not in reply.headers


async def test_ping_after_failed_disk_write_is_500_nok(daemon):
    daemon.broker.health_error = "failed to write to diskqueue"
    reply = await call(daemon, "GET", "/ping")
    assert (reply.status, reply.body) == (500, b"NOK - failed to write to diskqueue")
    stats = (await call(daemon, "GET", "/stats?format=json")).json()
    assert stats["health"] == "NOK - failed to write to diskqueue"
    daemon.broker.health_error = None
    assert (await call(daemon, "GET", "/ping")).body == b"OK"


async def test_info_fields_in_nsqd_order(daemon):
    reply = await call(daemon, "GET", "/info")
    assert reply.status == 200
    assert reply.headers["content-type"] == JSON_TYPE
    assert reply.headers["x-nsq-content-type"] == NSQ_HEADER
    info = reply.json()
    assert list(info) == ["version", "broadcast_address", "hostname", "http_port", "tcp_port", "start_time",
                          "max_heartbeat_interval", "max_output_buffer_size", "max_output_buffer_timeout",
                          "max_deflate_level"]
    assert info["version"] == "1.3.0"
    assert info["hostname"] == socket.gethostname()
    assert info["http_port"] == daemon.addresses.http[1]
    assert info["tcp_port"] == daemon.addresses.tcp[1]
    assert info["start_time"] == daemon.broker.start_time
    assert info["max_heartbeat_interval"] == 60_000_000_000
    assert info["max_output_buffer_size"] == 65536
    assert info["max_output_buffer_timeout"] == 30_000_000_000
    assert info["max_deflate_level"] == 6


# --------------------------------------------------------------------------- /pub


async def test_pub_queues_one_message_that_a_consumer_receives(daemon):
    reply = await call(daemon, "POST", "/pub?topic=t", b"test message")
    assert (reply.status, reply.body) == (200, b"OK")
    assert reply.headers["x-nsq-content-type"] == NSQ_HEADER
    assert reply.headers["content-type"] == TEXT_TYPE
    topic = daemon.broker.topics["t"]
    assert topic.depth == 1
    assert topic.message_count == 1 and topic.message_bytes == len(b"test message")
    assert await consume(daemon, "t", "c", 1) == [b"test message"]


@pytest.mark.parametrize(
    "target, body, status, message",
    [
        ("/pub?topic=t", b"", 400, "MSG_EMPTY"),
        ("/pub", b"", 400, "MSG_EMPTY"),  # the body is checked before the topic
        ("/pub", b"x", 400, "MISSING_ARG_TOPIC"),
        ("/pub?topic=", b"x", 400, "INVALID_TOPIC"),
        ("/pub?topic=bad$name", b"x", 400, "INVALID_TOPIC"),
        ("/pub?topic=" + "a" * 65, b"x", 400, "INVALID_TOPIC"),
        ("/pub?topic=t;x", b"x", 400, "INVALID_REQUEST"),
        ("/pub?topic=%zz", b"x", 400, "INVALID_REQUEST"),
        ("/pub?topic=t&defer=abc", b"x", 400, "INVALID_DEFER"),
        ("/pub?topic=t&defer=-1", b"x", 400, "INVALID_DEFER"),
        ("/pub?topic=t&defer=3600001", b"x", 400, "INVALID_DEFER"),
        ("/pub?topic=t&defer=1.5", b"x", 400, "INVALID_DEFER"),
        ("/pub?topic=t&defer=", b"x", 400, "INVALID_DEFER"),
    ],
)
async def test_pub_bad_input(daemon, target, body, status, message):
    assert_error(await call(daemon, "POST", target, body), status, message)


async def test_pub_rejects_a_message_over_max_msg_size(start_daemon):
    async with start_daemon("--max-msg-size=10") as d:
        assert (await call(d, "POST", "/pub?topic=t", b"x" * 10)).status == 200
        assert_error(await call(d, "POST", "/pub?topic=t", b"x" * 11), 413, "MSG_TOO_BIG")
        # chunked: no Content-Length, the limit applies while reading
        assert_error(await call(d, "POST", "/pub?topic=t", b"x" * 11, chunked=True), 413, "MSG_TOO_BIG")
        assert d.broker.topics["t"].message_count == 1


async def test_pub_refuses_a_huge_content_length_without_reading_the_body(daemon):
    head = (b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000000\r\n\r\n")
    answer = await raw_exchange(http(daemon), head)
    assert answer.startswith(b"HTTP/1.1 413 Request Entity Too Large\r\n")
    assert b"\r\nConnection: close\r\n" in answer
    assert answer.endswith(b'{"message":"MSG_TOO_BIG"}')
    assert "t" not in daemon.broker.topics  # refused before the topic was looked at


async def test_pub_defer_puts_the_message_in_the_deferred_set(daemon):
    await call(daemon, "POST", "/topic/create?topic=t")
    await call(daemon, "POST", "/channel/create?topic=t&channel=c")
    reply = await call(daemon, "POST", "/pub?topic=t&defer=1000", b"later")
    assert (reply.status, reply.body) == (200, b"OK")
    channel = daemon.broker.topics["t"].channels["c"]
    await wait_for(lambda: len(channel.deferred) == 1)
    assert channel.depth == 0
    assert (await call(daemon, "POST", "/pub?topic=t&defer=0", b"now")).status == 200
    assert (await call(daemon, "POST", "/pub?topic=t&defer=3600000", b"max")).status == 200


async def test_pub_while_exiting_is_503(daemon):
    daemon.broker.exiting = True
    try:
        assert_error(await call(daemon, "POST", "/pub?topic=t", b"x"), 503, "EXITING")
        assert_error(await call(daemon, "POST", "/mpub?topic=t", b"x\ny"), 503, "EXITING")
    finally:
        daemon.broker.exiting = False
    assert daemon.broker.topics["t"].message_count == 0


# --------------------------------------------------------------------------- /mpub


async def test_mpub_text_skips_empty_lines(daemon):
    reply = await call(daemon, "POST", "/mpub?topic=t", b"one\ntwo\n\nthree\r\nfour\n")
    assert (reply.status, reply.body) == (200, b"OK")
    assert daemon.broker.topics["t"].message_count == 4
    assert await consume(daemon, "t", "c", 4) == [b"one", b"two", b"three\r", b"four"]


async def test_mpub_empty_body_is_ok_and_publishes_nothing(daemon):
    reply = await call(daemon, "POST", "/mpub?topic=t", b"")
    assert (reply.status, reply.body) == (200, b"OK")
    assert daemon.broker.topics["t"].message_count == 0


@pytest.mark.parametrize("flag", ["true", "1", "yes", "non_normalized_binary_param"])
async def test_mpub_binary(daemon, flag):
    bodies = [b"\x00" * 100, b"a\nb", b"c" * 5]
    reply = await call(daemon, "POST", f"/mpub?topic=t&binary={flag}", mpub_body(bodies))
    assert (reply.status, reply.body) == (200, b"OK")
    assert await consume(daemon, "t", "c", 3) == bodies


@pytest.mark.parametrize("flag", ["false", "0"])
async def test_mpub_binary_false_means_text(daemon, flag):
    reply = await call(daemon, "POST", f"/mpub?topic=t&binary={flag}", b"a\nb")
    assert reply.status == 200
    assert daemon.broker.topics["t"].message_count == 2


@pytest.mark.parametrize(
    "body, message",
    [
        (b"", "BAD_BODY"),
        (b"\x00\x00", "BAD_BODY"),
        (struct.pack(">i", 0), "BAD_BODY"),
        (struct.pack(">i", -1), "BAD_BODY"),
        (struct.pack(">i", 2_000_000), "BAD_BODY"),
        (struct.pack(">i", 1), "BAD_MESSAGE"),
        (struct.pack(">ii", 1, 0), "BAD_MESSAGE"),
        (struct.pack(">ii", 1, -5), "BAD_MESSAGE"),
        (struct.pack(">ii", 1, 2_000_000), "BAD_MESSAGE"),
        (struct.pack(">ii", 1, 10) + b"short", "BAD_MESSAGE"),
        (struct.pack(">ii", 2, 1) + b"x", "BAD_MESSAGE"),
    ],
)
async def test_mpub_binary_bad_bodies(daemon, body, message):
    assert_error(await call(daemon, "POST", "/mpub?topic=t&binary=true", body), 413, message)
    # the topic was created before the body was read, as nsqd does
    assert daemon.broker.topics["t"].message_count == 0


@pytest.mark.parametrize(
    "target, status, message",
    [
        ("/mpub", 400, "MISSING_ARG_TOPIC"),
        ("/mpub?topic=a:b", 400, "INVALID_TOPIC"),
        ("/mpub?topic=t&x=%", 400, "INVALID_REQUEST"),
    ],
)
async def test_mpub_bad_topic(daemon, target, status, message):
    assert_error(await call(daemon, "POST", target, b"a\nb"), status, message)


async def test_mpub_size_limits(start_daemon):
    async with start_daemon("--max-msg-size=5", "--max-body-size=20") as d:
        assert (await call(d, "POST", "/mpub?topic=t", b"12345\n12345\n12345")).status == 200
        assert_error(await call(d, "POST", "/mpub?topic=t", b"123456\nab"), 413, "MSG_TOO_BIG")
        assert_error(await call(d, "POST", "/mpub?topic=t", b"a\n" * 11), 413, "BODY_TOO_BIG")
        assert_error(await call(d, "POST", "/mpub?topic=t", b"a\n" * 11, chunked=True), 413, "BODY_TOO_BIG")
        # line by line: a long line before the end is MSG_TOO_BIG even when the body is too big
        assert_error(await call(d, "POST", "/mpub?topic=t", b"1234567\n" + b"a\n" * 10, chunked=True),
                     413, "MSG_TOO_BIG")
        assert_error(await call(d, "POST", "/mpub?topic=t&binary=true", mpub_body([b"123456"])),
                     413, "BAD_MESSAGE")
        # (20 - 4) // 5 = 3 messages at most fit in a 20-byte body
        assert_error(await call(d, "POST", "/mpub?topic=t&binary=true", struct.pack(">i", 4)), 413, "BAD_BODY")
        assert_error(await call(d, "POST", "/mpub?topic=t&binary=true", mpub_body([b"1"] * 4)), 413, "BODY_TOO_BIG")
        assert (await call(d, "POST", "/mpub?topic=t&binary=true", mpub_body([b"1"] * 3))).status == 200
        assert d.broker.topics["t"].message_count == 6


async def test_mpub_text_keeps_every_message_of_a_large_body(daemon):
    lines = [b"m%05d" % i for i in range(5000)]
    reply = await call(daemon, "POST", "/mpub?topic=t", b"\n".join(lines), chunked=True)
    assert reply.status == 200
    assert daemon.broker.topics["t"].message_count == 5000


# --------------------------------------------------------------------------- topics


async def test_topic_lifecycle(daemon, tmp_path):
    assert_empty_ok(await call(daemon, "POST", "/topic/create?topic=t"))
    assert "t" in daemon.broker.topics
    assert_empty_ok(await call(daemon, "POST", "/topic/pause?topic=t"))
    assert daemon.broker.topics["t"].paused
    nsqd_dat = json.loads((tmp_path / "data" / "nsqd.dat").read_text())
    assert nsqd_dat["topics"] == [{"name": "t", "paused": True, "channels": None}]  # nsqd: a nil slice
    assert_empty_ok(await call(daemon, "POST", "/topic/unpause?topic=t"))
    assert not daemon.broker.topics["t"].paused
    assert json.loads((tmp_path / "data" / "nsqd.dat").read_text())["topics"][0]["paused"] is False
    await call(daemon, "POST", "/pub?topic=t", b"x")
    assert_empty_ok(await call(daemon, "POST", "/topic/empty?topic=t"))
    assert daemon.broker.topics["t"].depth == 0
    assert_empty_ok(await call(daemon, "POST", "/topic/delete?topic=t"))
    assert "t" not in daemon.broker.topics


@pytest.mark.parametrize(
    "target, status, message",
    [
        ("/topic/create", 400, "MISSING_ARG_TOPIC"),
        ("/topic/create?topic=a$", 400, "INVALID_TOPIC"),
        ("/topic/create?topic=a;", 400, "INVALID_REQUEST"),
        ("/topic/delete", 400, "MISSING_ARG_TOPIC"),
        ("/topic/delete?topic=missing", 404, "TOPIC_NOT_FOUND"),
        ("/topic/delete?topic=a$", 404, "TOPIC_NOT_FOUND"),  # delete does not validate the name
        ("/topic/empty", 400, "MISSING_ARG_TOPIC"),
        ("/topic/empty?topic=a$", 400, "INVALID_TOPIC"),
        ("/topic/empty?topic=missing", 404, "TOPIC_NOT_FOUND"),
        ("/topic/pause", 400, "MISSING_ARG_TOPIC"),
        ("/topic/pause?topic=missing", 404, "TOPIC_NOT_FOUND"),
        ("/topic/unpause?topic=missing", 404, "TOPIC_NOT_FOUND"),
        ("/topic/unpause?topic=%", 400, "INVALID_REQUEST"),
    ],
)
async def test_topic_errors(daemon, target, status, message):
    assert_error(await call(daemon, "POST", target), status, message)


# --------------------------------------------------------------------------- channels


async def test_channel_lifecycle(daemon, tmp_path):
    await call(daemon, "POST", "/topic/create?topic=t")
    assert_empty_ok(await call(daemon, "POST", "/channel/create?topic=t&channel=c"))
    channel = daemon.broker.topics["t"].channels["c"]
    assert_empty_ok(await call(daemon, "POST", "/channel/pause?topic=t&channel=c"))
    assert channel.paused
    nsqd_dat = json.loads((tmp_path / "data" / "nsqd.dat").read_text())
    assert nsqd_dat["topics"][0]["channels"][0]["paused"] is True
    assert_empty_ok(await call(daemon, "POST", "/channel/unpause?topic=t&channel=c"))
    assert not channel.paused
    await call(daemon, "POST", "/mpub?topic=t", b"a\nb\nc")
    await wait_for(lambda: channel.depth == 3)
    assert_empty_ok(await call(daemon, "POST", "/channel/empty?topic=t&channel=c"))
    assert channel.depth == 0
    assert_empty_ok(await call(daemon, "POST", "/channel/delete?topic=t&channel=c"))
    assert "c" not in daemon.broker.topics["t"].channels


@pytest.mark.parametrize("action", ["create", "delete", "empty", "pause", "unpause"])
@pytest.mark.parametrize(
    "query, status, message",
    [
        ("", 400, "MISSING_ARG_TOPIC"),
        ("?topic=a$", 400, "INVALID_ARG_TOPIC"),
        ("?topic=t", 400, "MISSING_ARG_CHANNEL"),
        ("?topic=t&channel=", 400, "INVALID_ARG_CHANNEL"),
        ("?topic=t&channel=c:d", 400, "INVALID_ARG_CHANNEL"),
        ("?topic=missing&channel=c", 404, "TOPIC_NOT_FOUND"),
        ("?topic=t&channel=c&bad=%x", 400, "INVALID_REQUEST"),
    ],
)
async def test_channel_errors(daemon, action, query, status, message):
    await call(daemon, "POST", "/topic/create?topic=t")
    assert_error(await call(daemon, "POST", f"/channel/{action}{query}"), status, message)


@pytest.mark.parametrize("action", ["delete", "empty", "pause", "unpause"])
async def test_channel_not_found(daemon, action):
    await call(daemon, "POST", "/topic/create?topic=t")
    assert_error(await call(daemon, "POST", f"/channel/{action}?topic=t&channel=nope"), 404, "CHANNEL_NOT_FOUND")


async def test_channel_create_accepts_ephemeral_names(daemon):
    await call(daemon, "POST", "/topic/create?topic=t")
    assert_empty_ok(await call(daemon, "POST", "/channel/create?topic=t&channel=c%23ephemeral"))
    assert "c#ephemeral" in daemon.broker.topics["t"].channels


# --------------------------------------------------------------------------- /config


async def test_config_get(start_daemon, tmp_path):
    async with start_daemon("--e2e-processing-latency-percentile=1.0,0.99", "--mem-queue-size=77") as d:
        reply = await call(d, "GET", "/config/nsqlookupd_tcp_addresses")
        assert (reply.status, reply.body) == (200, b"[]")
        assert reply.headers["content-type"] == JSON_TYPE
        assert (await call(d, "GET", "/config/mem_queue_size")).body == b"77"
        assert (await call(d, "GET", "/config/e2e_processing_latency_percentiles")).body == b"[1,0.99]"
        assert (await call(d, "GET", "/config/msg_timeout")).body == b"60000000000"
        assert (await call(d, "GET", "/config/log_level")).body == b"2"
        assert (await call(d, "GET", "/config/snappy")).body == b"true"
        # a string value is written raw, not as JSON (nsqd's V1 responder)
        reply = await call(d, "GET", "/config/data_path")
        assert reply.body == str(tmp_path / "data").encode()
        assert reply.headers["content-type"] == TEXT_TYPE
        assert_error(await call(d, "GET", "/config/no_such_option"), 400, "INVALID_OPTION")
        assert_error(await call(d, "GET", "/config/mem-queue-size"), 400, "INVALID_OPTION")


async def test_config_put(daemon):
    addrs = b'["127.0.0.1:4160","127.0.0.1:4162"]'
    reply = await call(daemon, "PUT", "/config/nsqlookupd_tcp_addresses", addrs)
    assert (reply.status, reply.body) == (200, addrs)
    assert daemon.broker.options.nsqlookupd_tcp_addresses == ("127.0.0.1:4160", "127.0.0.1:4162")
    assert (await call(daemon, "GET", "/config/nsqlookupd_tcp_addresses")).body == addrs

    reply = await call(daemon, "PUT", "/config/log_level", b"FATAL")
    assert (reply.status, reply.body) == (200, b"5")
    assert daemon.broker.options.log_level == "fatal"
    assert (await call(daemon, "PUT", "/config/log_level", b"info")).body == b"2"

    assert_error(await call(daemon, "PUT", "/config/log_level", b"bad"), 400, "INVALID_VALUE")
    assert_error(await call(daemon, "PUT", "/config/log_level", b""), 413, "INVALID_VALUE")
    assert_error(await call(daemon, "PUT", "/config/nsqlookupd_tcp_addresses", b"not json"), 400, "INVALID_VALUE")
    assert_error(await call(daemon, "PUT", "/config/nsqlookupd_tcp_addresses", b'["a", 1]'), 400, "INVALID_VALUE")
    assert_error(await call(daemon, "PUT", "/config/mem_queue_size", b"5"), 400, "INVALID_OPTION")
    assert_error(await call(daemon, "PUT", "/config/mem_queue_size", b""), 413, "INVALID_VALUE")
    assert_error(await call(daemon, "POST", "/config/log_level", b"x"), 405, "METHOD_NOT_ALLOWED")


async def test_config_put_body_over_max_msg_size(start_daemon):
    async with start_daemon("--max-msg-size=8") as d:
        assert_error(await call(d, "PUT", "/config/log_level", b"x" * 9), 413, "INVALID_VALUE")
        assert (await call(d, "PUT", "/config/log_level", b"warn")).body == b"3"


# --------------------------------------------------------------------------- routing


async def test_unknown_path_is_404(daemon):
    assert_error(await call(daemon, "GET", "/not_found"), 404, "NOT_FOUND")
    assert_error(await call(daemon, "DELETE", "/not_found"), 404, "NOT_FOUND")
    assert_error(await call(daemon, "GET", "/config/"), 404, "NOT_FOUND")
    assert_error(await call(daemon, "GET", "/debug/pprof/"), 404, "NOT_FOUND")


@pytest.mark.parametrize(
    "method, path, allow",
    [
        ("POST", "/stats", "GET, OPTIONS"),
        ("GET", "/pub", "OPTIONS, POST"),
        ("PUT", "/mpub", "OPTIONS, POST"),
        ("DELETE", "/topic/create", "OPTIONS, POST"),
        ("HEAD", "/ping", "GET, OPTIONS"),
        ("POST", "/config/log_level", "GET, OPTIONS, PUT"),
    ],
)
async def test_wrong_method_is_405_with_allow(daemon, method, path, allow):
    reply = await call(daemon, method, path)
    assert reply.status == 405
    assert reply.headers["allow"] == allow
    if method != "HEAD":
        assert_error(reply, 405, "METHOD_NOT_ALLOWED")


async def test_options_lists_allowed_methods(daemon):
    reply = await call(daemon, "OPTIONS", "/pub")
    assert (reply.status, reply.body, reply.headers["allow"]) == (200, b"", "OPTIONS, POST")
    assert_error(await call(daemon, "OPTIONS", "/nothing"), 404, "NOT_FOUND")


async def test_trailing_slash_and_case_are_redirected(daemon):
    reply = await call(daemon, "GET", "/ping/")
    assert (reply.status, reply.headers["location"]) == (301, "/ping")
    assert reply.body == b'<a href="/ping">Moved Permanently</a>.\n\n'
    reply = await call(daemon, "GET", "/STATS?format=json")
    assert (reply.status, reply.headers["location"]) == (301, "/stats?format=json")
    reply = await call(daemon, "POST", "/pub/?topic=t", b"x")
    assert (reply.status, reply.headers["location"], reply.body) == (307, "/pub?topic=t", b"")
    reply = await call(daemon, "GET", "/Config/a%20b")
    assert (reply.status, reply.headers["location"]) == (301, "/config/a%20b")
    assert "t" not in daemon.broker.topics


async def test_freememory_answers_like_nsqd(daemon):
    # nsqd 1.3.0 frees the memory, then fails to render its empty plain-text result.
    assert_error(await call(daemon, "POST", "/debug/freememory"), 500, "INTERNAL_ERROR")


async def test_unusable_tls_files_are_refused_before_anything_listens(tmp_path):
    # a certificate that is not one stops the broker before it creates or locks anything
    cert = tmp_path / "cert.pem"
    cert.write_text("unused")
    options = parse_args(broker_args(tmp_path / "data", "--tls-required=true", f"--tls-cert={cert}",
                                     f"--tls-key={cert}", "--https-address=127.0.0.1:4999"))
    with pytest.raises(ValueError, match="^failed to build TLS config - "):
        Daemon(options)
    assert not (tmp_path / "data").exists()


# --------------------------------------------------------------------------- the connection


async def test_keep_alive_serves_many_requests_on_one_connection(daemon):
    async with HTTPClient(http(daemon)) as client:
        for i in range(200):
            reply = await client.post("/pub?topic=t", b"m%d" % i)
            assert (reply.status, reply.body, reply.closed) == (200, b"OK", False)
        assert (await client.get("/ping")).body == b"OK"
    assert daemon.broker.topics["t"].message_count == 200


async def test_errors_keep_the_connection_open(daemon):
    async with HTTPClient(http(daemon)) as client:
        assert (await client.post("/pub?topic=t", b"")).status == 400
        assert (await client.get("/nope")).status == 404
        assert (await client.post("/stats")).status == 405
        reply = await client.post("/pub?topic=t", b"x")
        assert (reply.status, reply.closed) == (200, False)


async def test_pipelined_requests_are_answered_in_order(daemon):
    data = b"".join(
        b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nm%d" % i for i in range(5)
    ) + b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    answer = await raw_exchange(http(daemon), data)
    assert answer.count(b"HTTP/1.1 200 OK\r\n") == 6
    assert answer.endswith(b"\r\n\r\nOK")
    assert daemon.broker.topics["t"].message_count == 5


async def test_expect_100_continue(daemon):
    async with HTTPClient(http(daemon)) as client:
        reply = await client.post("/pub?topic=t", b"body", expect_continue=True)
        assert (reply.status, reply.body) == (200, b"OK")


async def test_oversize_headers_are_431(daemon):
    head = b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (2 << 20) + b"\r\n\r\n"
    answer = await raw_exchange(http(daemon), head)
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert answer.endswith(b"431 Request Header Fields Too Large")


async def test_malformed_request_is_400(daemon):
    answer = await raw_exchange(http(daemon), b"this is not http\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert answer.endswith(b"400 Bad Request")


async def test_http_1_0_request_is_answered_and_closed(daemon):
    answer = await raw_exchange(http(daemon), b"GET /ping HTTP/1.0\r\n\r\n")
    assert b" 200 OK\r\n" in answer and answer.endswith(b"OK")


async def test_graceful_shutdown_finishes_and_closes_connections(start_daemon):
    async with start_daemon() as d:
        client = await HTTPClient(d.addresses.http).connect()
        assert (await client.post("/pub?topic=t", b"x")).status == 200
        d.request_shutdown()
        with trio.fail_after(5):
            assert await client.stream.receive_some(100) == b""
        await client.aclose()
