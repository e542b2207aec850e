"""Interop: the HTTP helpers of real NSQ client libraries against pynsqd.

gnsq (``NsqdHTTPClient``, urllib3) and ansq (``NSQDHTTPWriter``, aiohttp) ship nsqd
HTTP clients; pynsq has none for nsqd (it only polls nsqlookupd over HTTP).
Blocking and asyncio clients run in a worker thread while the broker serves on Trio.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import trio

gnsq = pytest.importorskip("gnsq")
ansq_http = pytest.importorskip("ansq.http")


def run_gnsq(address, script):
    client = gnsq.NsqdHTTPClient(host=address[0], port=address[1])
    return script(client)


async def in_thread(fn, *args):
    with trio.fail_after(30):
        return await trio.to_thread.run_sync(fn, *args)


async def test_gnsq_http_client(daemon):
    def script(client):
        results = {}
        results["ping"] = client.ping()
        results["info"] = client.info()
        results["pub"] = client.publish("orders", b"one")
        results["defer"] = client.publish("orders", b"later", defer=5000)
        results["mpub"] = client.multipublish("orders", [b"two", b"three"])
        results["mpub_binary"] = client.multipublish("orders", [b"with\nnewline", b"\x00\x01"], binary=True)
        results["create_topic"] = client.create_topic("audit")
        results["create_channel"] = client.create_channel("orders", "billing")
        results["pause_topic"] = client.pause_topic("audit")
        results["unpause_topic"] = client.unpause_topic("audit")
        results["pause_channel"] = client.pause_channel("orders", "billing")
        results["stats"] = client.stats()
        results["stats_topic"] = client.stats(topic="orders", channel="billing")
        results["stats_text"] = client.stats(text=True)
        results["unpause_channel"] = client.unpause_channel("orders", "billing")
        results["empty_channel"] = client.empty_channel("orders", "billing")
        results["empty_topic"] = client.empty_topic("orders")
        results["delete_channel"] = client.delete_channel("orders", "billing")
        results["delete_topic"] = client.delete_topic("audit")
        try:
            client.delete_topic("audit")
        except gnsq.errors.NSQHttpError as exc:
            results["error"] = str(exc)
        return results

    results = await in_thread(run_gnsq, daemon.addresses.http, script)
    assert results["ping"] == b"OK"
    assert results["info"]["version"] == "1.3.0"
    assert results["pub"] == results["defer"] == results["mpub"] == results["mpub_binary"] == b"OK"
    for key in ("create_topic", "create_channel", "pause_topic", "unpause_topic", "pause_channel",
                "unpause_channel", "empty_channel", "empty_topic", "delete_channel", "delete_topic"):
        assert results[key] == b"", key
    topics = {t["topic_name"]: t for t in results["stats"]["topics"]}
    assert topics["orders"]["message_count"] == 6
    assert topics["audit"]["paused"] is False
    (billing,) = topics["orders"]["channels"]
    assert billing["paused"] is True
    assert [t["topic_name"] for t in results["stats_topic"]["topics"]] == ["orders"]
    assert results["stats_text"].startswith(b"nsqd v1.3.0")
    assert "404" in results["error"]
    assert "audit" not in daemon.broker.topics


async def test_ansq_http_writer(daemon):
    host, port = daemon.addresses.http

    def script():
        async def main():
            writer = ansq_http.NSQDHTTPWriter(host, port)
            try:
                results = {
                    "ping": await writer.ping(),
                    "info": await writer.info(),
                    "pub": await writer.pub("orders", "one"),
                    "mpub": await writer.mpub("orders", "two", "three"),
                    "create_topic": await writer.create_topic("audit"),
                    "create_channel": await writer.create_channel("audit", "archive"),
                    "stats": await writer.stats(),
                    "lookupd_addresses": await writer.nsqlookupd_tcp_addresses(),
                }
                try:
                    await writer.delete_channel("audit", "missing")
                except ansq_http.http_exceptions.NSQHTTPException as exc:
                    results["error"] = exc
                results["delete_topic"] = await writer.delete_topic("audit")
                return results
            finally:
                await writer.close()

        return asyncio.run(main())

    results = await in_thread(script)
    assert results["ping"] == "OK"
    assert results["info"]["version"] == "1.3.0"
    assert results["pub"] == results["mpub"] == "OK"
    assert results["create_topic"] == results["create_channel"] == results["delete_topic"] == ""
    assert results["lookupd_addresses"] == []
    assert {t["topic_name"] for t in results["stats"]["topics"]} == {"audit", "orders"}
    error = results["error"]
    assert error.status_code == 404
    assert json.loads(error.error) == {"message": "CHANNEL_NOT_FOUND"}
    assert daemon.broker.topics["orders"].message_count == 3
