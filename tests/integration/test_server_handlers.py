"""The V2 command handlers (``broker/server/handlers.py``) through a daemon on 127.0.0.1:0:
the dispatch tables, what each publish answers and counts, the errors a handler raises
(fatal or not) and what they leave behind."""

from __future__ import annotations

import errno
import inspect

import pytest
import trio

from broker import protocol as p
from broker.protocol import encode_auth, encode_dpub, encode_fin, encode_mpub, encode_nop, encode_pub, encode_rdy
from broker.protocol.replica import Repl
from broker.server.handlers import ANSWER_HANDLERS, SYNC_HANDLERS
from tests.support.diskfaults import FaultyDisk
from tests.support.http_client import request
from tests.support.v2client import connect, subscriber


def test_every_command_has_one_handler_and_a_publish_costs_no_coroutine_unless_it_waits():
    commands = {p.Identify, p.Auth, p.Sub, p.Pub, p.Mpub, p.Dpub, p.Rdy, p.Fin, p.Req, p.Touch, p.Cls, p.Nop,
                p.Lease, Repl}
    assert set(SYNC_HANDLERS) | set(ANSWER_HANDLERS) == commands
    assert not set(SYNC_HANDLERS) & set(ANSWER_HANDLERS)
    waiting = {kind for kind, handler in ANSWER_HANDLERS.items() if inspect.iscoroutinefunction(handler)}
    assert waiting == {p.Auth, p.Sub}  # a publish returns its OK, or a coroutine only when it must wait


@pytest.mark.parametrize("flags", [(), ("--durable",)], ids=["default", "durable"])
async def test_each_publish_answers_ok_and_is_counted_per_topic(start_daemon, flags):
    async with start_daemon(*flags) as d:
        with trio.fail_after(10):
            producer = await connect(d.addresses.tcp)
            await producer.send(encode_pub("a", b"1"))
            await producer.send(encode_mpub("a", [b"2", b"3"]))
            await producer.send(encode_dpub("b", 60_000, b"4"))
            for _ in range(3):
                await producer.expect_response(b"OK")
            for topic, count in (("a", 3), ("b", 1)):
                # as nsqd, /stats shows one topic's count per producer: the one the filter names
                doc = (await request(d.addresses.http, "GET", f"/stats?format=json&topic={topic}")).json()
                (client,) = doc["producers"]
                assert client["pub_counts"] == [{"topic": topic, "count": count}]
                assert [t["message_count"] for t in doc["topics"]] == [count]
            await producer.aclose()


async def test_a_publish_while_exiting_is_refused_and_closes(daemon):
    with trio.fail_after(10):
        producer = await connect(daemon.addresses.tcp)
        daemon.broker.exiting = True
        await producer.send(encode_mpub("t", [b"x"]))
        await producer.expect_error(b"E_MPUB_FAILED MPUB failed exiting")
        assert "t" not in daemon.broker.topics
        daemon.broker.exiting = False


@pytest.mark.parametrize("flags", [(), ("--durable",)], ids=["default", "durable"])
async def test_a_publish_the_disk_refuses_is_a_fatal_error_naming_the_reason(start_daemon, flags):
    disk = FaultyDisk(lambda name: name.startswith("t."))
    with disk.installed(), trio.fail_after(10):
        async with start_daemon("--mem-queue-size=0", *flags) as d:
            await request(d.addresses.http, "POST", "/topic/create?topic=t")
            producer = await connect(d.addresses.tcp)
            disk.fail(errno.ENOSPC)
            await producer.send(encode_pub("t", b"refused"))
            frame = await producer.read_frame()
            assert frame.frame_type == p.FRAME_TYPE_ERROR
            assert frame.data.startswith(b"E_PUB_FAILED PUB failed ") and frame.data.endswith(b"no space left on device")
            await producer.expect_closed()
            disk.fail(None)
            assert d.broker.topics["t"].depth == 0


async def test_fin_of_an_id_not_in_flight_is_answered_and_the_connection_stays(daemon):
    with trio.fail_after(10):
        consumer = await subscriber(daemon, rdy=1)
        await consumer.send(encode_fin(b"1" * 16))
        await consumer.expect_error(b"E_FIN_FAILED FIN " + b"1" * 16 + b" failed ID not in flight", closed=False)
        await consumer.send(encode_nop())
        await consumer.expect_quiet()  # NOP has no answer; the connection still serves commands


async def test_rdy_zero_stops_delivery_and_a_later_rdy_resumes_it(daemon):
    with trio.fail_after(10):
        consumer = await subscriber(daemon, rdy=0)
        producer = await connect(daemon.addresses.tcp)
        await producer.send(encode_mpub("t", [b"a", b"b"]))
        await producer.expect_response(b"OK")
        await consumer.expect_quiet()
        await consumer.send(encode_rdy(1))
        assert [m.body for m in await consumer.sync()] == [b"a"]


async def test_auth_without_an_auth_server_is_refused(daemon):
    with trio.fail_after(10):
        client = await connect(daemon.addresses.tcp)
        await client.send(encode_auth(b"secret"))
        await client.expect_error(b"E_AUTH_DISABLED AUTH disabled")


async def test_sub_creates_the_topic_and_channel_and_a_durable_one_has_them_on_disk(start_daemon, tmp_path):
    async with start_daemon("--durable") as d:
        with trio.fail_after(10):
            await subscriber(d, topic="new", channel="c")
            assert list(d.broker.topics["new"].channels) == ["c"]
            saved = (tmp_path / "data" / "nsqd.dat").read_text()
            assert '"name":"new"' in saved.replace(" ", "") and '"name":"c"' in saved.replace(" ", "")
