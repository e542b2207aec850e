"""The daemon's statsd pusher: started by --statsd-address only, and never in the broker's way."""

from __future__ import annotations

import errno
import logging
import os

import trio

from broker.observe.statsd_pusher import _dial, _spread
from tests.support.http_client import request
from tests.support.v2client import publish
from tests.support.waiting import wait_for

#: At most a second: nsqd would spread the packets over the interval less a second, here none.
INTERVAL = "100ms"


async def _udp_socket() -> trio.socket.SocketType:
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    await sock.bind(("127.0.0.1", 0))
    return sock


async def test_no_pusher_without_an_address(start_daemon):
    async with start_daemon() as daemon:
        assert daemon.statsd is None


async def test_pushes_the_topics_with_the_host_prefix(start_daemon):
    with await _udp_socket() as sock:
        port = sock.getsockname()[1]
        async with start_daemon("--broadcast-address=127.0.0.1", f"--statsd-address=127.0.0.1:{port}",
                                f"--statsd-interval={INTERVAL}", "--statsd-mem-stats=false",
                                "--statsd-prefix=stats.%s.nsq") as daemon:
            await publish(daemon, "orders", b"one", b"two")
            prefix = b"stats.127_0_0_1_%d.nsq." % daemon.addresses.http[1]
            with trio.fail_after(10):
                while True:
                    packet = await sock.recv(65536)
                    if packet.startswith(prefix + b"topic.orders.message_count:"):
                        break
            assert packet.splitlines()[:4] == [
                prefix + line for line in (b"topic.orders.message_count:2|c", b"topic.orders.message_bytes:6|c",
                                           b"topic.orders.depth:2|g", b"topic.orders.backend_depth:0|g")
            ]
            assert b"mem." not in packet


async def test_an_absent_receiver_changes_nothing(start_daemon, caplog):
    with await _udp_socket() as sock:
        port = sock.getsockname()[1]
    # nothing listens on the port any more: sends are refused (ICMP), and the broker carries on
    async with start_daemon(f"--statsd-address=127.0.0.1:{port}", f"--statsd-interval={INTERVAL}",
                            "--statsd-udp-packet-size=40") as daemon:
        await publish(daemon, "t", b"x")
        await wait_for(lambda: daemon.statsd.pushes >= 3, timeout=10)
        assert (await request(daemon.addresses.http, "GET", "/ping")).body == b"OK"
        await publish(daemon, "t", b"y")


async def test_a_failed_send_is_logged_and_the_rest_still_sent(caplog):
    with await _udp_socket() as receiver:
        address = "127.0.0.1:%d" % receiver.getsockname()[1]
        sender = await _dial(address)
        assert sender is not None
        with sender:
            # larger than any UDP datagram: EMSGSIZE, logged, and the next packet goes out
            await _spread(sender, [b"x" * 70_000, b"after\n"], 0.0, address)
        with trio.fail_after(5):
            assert await receiver.recv(100) == b"after\n"
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"STATSD: failed to send to {address}: {OSError(errno.EMSGSIZE, os.strerror(errno.EMSGSIZE))}"]


async def test_an_unresolvable_address_is_logged_at_every_push(start_daemon, caplog):
    caplog.set_level(logging.INFO, logger="pynsqd")
    async with start_daemon("--statsd-address=no-such-host.invalid:8125", f"--statsd-interval={INTERVAL}"):
        def failures() -> int:
            return sum("failed to create UDP socket to statsd(no-such-host.invalid:8125)" in r.getMessage()
                       for r in caplog.records)
        await wait_for(lambda: failures() >= 2, timeout=15)


async def test_get_config_shows_the_statsd_options_as_nsqd_does(start_daemon):
    async with start_daemon("--broadcast-address=127.0.0.1", "--statsd-interval=10s",
                            "--statsd-udp-packet-size=1400", "--statsd-exclude-ephemeral") as daemon:
        port = daemon.addresses.http[1]

        async def config(name: str) -> str:
            return (await request(daemon.addresses.http, "GET", f"/config/{name}")).text

        # strings come back as they are, other values as JSON
        assert await config("statsd_prefix") == f"nsq.127_0_0_1_{port}."  # expanded at start, as nsqd's
        assert await config("statsd_interval") == "10000000000"
        assert await config("statsd_udp_packet_size") == "1400"
        assert await config("statsd_exclude_ephemeral") == "true"
        assert await config("statsd_mem_stats") == "true"
        assert await config("statsd_address") == ""
        assert daemon.statsd is None


async def test_a_packet_size_of_0_or_less_means_4096_as_in_nsqd(start_daemon):
    """nsqd hands the size to Go's bufio.NewWriterSize, which takes any size <= 0 as 4096."""
    for size in ("0", "-1"):
        with await _udp_socket() as sock:
            port = sock.getsockname()[1]
            async with start_daemon(f"--statsd-address=127.0.0.1:{port}", f"--statsd-interval={INTERVAL}",
                                    f"--statsd-udp-packet-size={size}") as daemon:
                # about 3 KB of lines a push (the mem.* ones included): one packet at 4096, six at 508
                for n in range(12):
                    await publish(daemon, f"topic_{n:02d}", b"x")
                assert (await request(daemon.addresses.http, "GET", "/config/statsd_udp_packet_size")).text == size
                with trio.fail_after(10):
                    while True:
                        packet = await sock.recv(65536)
                        if b"topic_11." in packet:
                            break
                assert 2048 < len(packet) <= 4096, len(packet)
