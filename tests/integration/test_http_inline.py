"""``POST /pub`` answered in the read poller's task (see :mod:`broker.http.server`): the
answers, their order and what is stored are those of the connection's own task, whatever
the request's neighbours on the connection, however its bytes arrive, and whether the
publish is answered at once or must be awaited (``--durable``, in
``tests/system/test_durable_http_pub.py``)."""

from __future__ import annotations

import json
import re
import socket

import trio

from tests.support.v2client import consume

TIMEOUT = 30


def pub(topic: str, body: bytes, *, version: bytes = b"1.1", extra: bytes = b"") -> bytes:
    return (b"POST /pub?topic=%s HTTP/%s\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n%s"
            % (topic.encode(), version, extra, len(body), body))


CLOSE = b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


def answers(data: bytes) -> list[tuple[int, bytes]]:
    """(status, body) of every response in ``data``, in order (bodies sized by Content-Length)."""
    found = []
    at = 0
    while at < len(data):
        head_end = data.index(b"\r\n\r\n", at)
        head = data[at:head_end]
        status = int(head.split(b" ", 2)[1])
        length = int(re.search(rb"Content-Length: (\d+)", head).group(1))
        found.append((status, data[head_end + 4:head_end + 4 + length]))
        at = head_end + 4 + length
    return found


async def exchange(address: tuple[str, int], data: bytes, *, read_size: int = 65536) -> bytes:
    """Send ``data`` on a connection whose first request, creating topic ``t``, was answered
    already (so that its task waits on the poller, which then answers what arrives, the
    topic's first publish included), reading the answers while sending, ``read_size`` bytes
    at a time, until the server closes; the first answer is left out."""
    stream = await trio.open_tcp_stream(*address)
    if read_size < 65536:  # a small receive buffer, so that the server's writes come up short
        stream.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
    received = bytearray()
    first = b"POST /topic/create?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"

    async def read() -> None:
        while chunk := await stream.receive_some(read_size):
            received.extend(chunk)

    with trio.fail_after(TIMEOUT):
        await stream.send_all(first)
        while len(answers_complete(received)) < 1:
            received.extend(await stream.receive_some(65536))
        del received[:]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await stream.send_all(data)
    await stream.aclose()
    return bytes(received)


def answers_complete(data: bytes | bytearray) -> list[int]:
    """The end offsets of the complete responses at the start of ``data``."""
    ends = []
    at = 0
    while (head_end := data.find(b"\r\n\r\n", at)) != -1:
        match = re.search(rb"Content-Length: (\d+)", data[at:head_end])
        end = head_end + 4 + (int(match.group(1)) if match else 0)
        if end > len(data):
            break
        ends.append(end)
        at = end
    return ends


def error(message: str) -> bytes:
    return json.dumps({"message": message}, separators=(",", ":")).encode()


async def test_pipelined_publishes_and_errors_are_answered_in_order(daemon):
    data = b"".join([
        pub("t", b"m0"),
        pub("t", b""),                      # nsqd: 400 MSG_EMPTY
        pub("bad!", b"x"),                  # 400 INVALID_TOPIC
        pub("t", b"m1"),
        b"GET /stats?format=json&topic=t HTTP/1.1\r\nHost: x\r\n\r\n",   # answered by the task
        pub("t", b"m2"),
        b"POST /pub?topic=t&defer=-1 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx",  # 400 INVALID_DEFER
        pub("t", b"m3"),
        CLOSE,
    ])
    got = answers(await exchange(daemon.addresses.http, data))
    assert [status for status, _ in got] == [200, 400, 400, 200, 200, 200, 400, 200, 200]
    assert got[1][1] == error("MSG_EMPTY")
    assert got[2][1] == error("INVALID_TOPIC")
    assert got[6][1] == error("INVALID_DEFER")
    stats = json.loads(got[4][1])
    assert stats["topics"][0]["message_count"] == 2  # the two publishes before it, no more
    assert await consume(daemon, "t", "c", 4) == [b"m0", b"m1", b"m2", b"m3"]


async def test_a_publish_arriving_a_byte_at_a_time_is_stored_once(daemon):
    data = pub("t", b"one") + pub("t", b"two") + CLOSE
    stream = await trio.open_tcp_stream(*daemon.addresses.http)
    with trio.fail_after(TIMEOUT):
        for i in range(len(data)):
            await stream.send_all(data[i:i + 1])
        received = b""
        while chunk := await stream.receive_some(65536):
            received += chunk
    await stream.aclose()
    assert [status for status, _ in answers(received)] == [200, 200, 200]
    assert daemon.broker.topics["t"].message_count == 2
    assert await consume(daemon, "t", "c", 2) == [b"one", b"two"]


async def test_http_1_0_keep_alive_and_closing_publishes(daemon):
    data = (pub("t", b"a", version=b"1.0", extra=b"Connection: keep-alive\r\n")
            + pub("t", b"b", extra=b"Connection: close\r\n")
            + pub("t", b"never"))
    received = await exchange(daemon.addresses.http, data)
    first, _, second = received.partition(b"HTTP/1.1 200 OK\r\n")
    assert first.startswith(b"HTTP/1.0 200 OK\r\n") and b"Connection: keep-alive\r\n" in first
    assert b"Connection: close\r\n" in second
    assert daemon.broker.topics["t"].message_count == 2  # nothing after the close is read


async def test_a_client_that_reads_its_answers_slowly_loses_none(daemon):
    """20,000 pipelined publishes, their answers read 1 KiB at a time into a 16 KiB socket
    buffer while the rest are sent: the answers fill the socket, the rest wait in the connection, and every one
    arrives, in order."""
    count = 20_000
    data = b"".join(pub("t", b"%d" % i) for i in range(count)) + CLOSE
    got = answers(await exchange(daemon.addresses.http, data, read_size=1024))
    assert len(got) == count + 1
    assert all(answer == (200, b"OK") for answer in got)
    assert daemon.broker.topics["t"].message_count == count
    assert await consume(daemon, "t", "c", count) == [b"%d" % i for i in range(count)]
