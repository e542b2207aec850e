"""Snappy and deflate streams negotiated in IDENTIFY, alone and inside TLS, checked with
python-snappy and zlib on the client side."""

from __future__ import annotations

import json
import logging

import pytest
import snappy

from broker.protocol import FRAME_TYPE_ERROR, encode_identify, encode_mpub, encode_pub, encode_rdy, encode_sub
from tests.support.http_client import request
from tests.support.transports import (
    DeflateStream,
    SnappyStream,
    compress_with,
    make_certificates,
    negotiate,
    upgrade_tls,
)
from tests.support.v2client import connect

BODIES = [b"a compressible body " * 50, bytes(range(256)) * 300, b"x"]


async def client_with(daemon, codec, **identify):
    client = await connect(daemon.addresses.tcp)
    _, answer = await negotiate(client, **{codec: True}, **identify)
    assert answer[codec] is True
    await compress_with(client, SnappyStream if codec == "snappy" else DeflateStream)
    return client


@pytest.mark.parametrize("codec", ["snappy", "deflate"])
async def test_publish_and_consume_through_a_compressed_stream(daemon, codec):
    consumer = await client_with(daemon, codec, client_id="squeezed")
    await consumer.send(encode_sub("t", "c") + encode_rdy(100))
    await consumer.expect_response(b"OK")
    publisher = await client_with(daemon, codec)
    await publisher.send(encode_mpub("t", BODIES) + encode_pub("t", b"last"))
    await publisher.expect_response(b"OK")
    await publisher.expect_response(b"OK")
    assert [m.body for m in await consumer.read_messages(4)] == [*BODIES, b"last"]
    stats = json.loads((await request(daemon.addresses.http, "GET", "/stats?format=json")).body)
    client = stats["topics"][0]["channels"][0]["clients"][0]
    assert (client["client_id"], client[codec], client["tls"]) == ("squeezed", True, False)
    metrics = (await request(daemon.addresses.http, "GET", "/metrics")).body.decode()
    assert f'nsq_server_clients{{compression="{codec}",tls="false"}} 2.0' in metrics


@pytest.mark.parametrize("codec", ["snappy", "deflate"])
async def test_compression_inside_tls(start_daemon, tmp_path, codec):
    certs = make_certificates(tmp_path / "certs")
    async with start_daemon(*certs.broker_flags()) as daemon:
        client = await connect(daemon.addresses.tcp)
        _, answer = await negotiate(client, tls_v1=True, **{codec: True})
        assert (answer["tls_v1"], answer[codec]) == (True, True)
        await upgrade_tls(client, certs.client_context())
        await compress_with(client, SnappyStream if codec == "snappy" else DeflateStream)
        await client.send(encode_pub("t", BODIES[0]))
        await client.expect_response(b"OK")
        assert (await request(daemon.addresses.http, "GET", "/stats?format=json")).status == 200


@pytest.mark.parametrize(("flags", "asked", "level"), [
    ((), {}, 6),
    ((), {"deflate_level": 3}, 3),
    ((), {"deflate_level": 9}, 6),
    (("--max-deflate-level=9",), {"deflate_level": 9}, 9),
    (("--max-deflate-level=2",), {}, 2),
])
async def test_deflate_level_is_capped_as_nsqd_caps_it(start_daemon, flags, asked, level, caplog):
    caplog.set_level(logging.INFO, "pynsqd")
    async with start_daemon(*flags) as daemon:
        client = await connect(daemon.addresses.tcp)
        _, answer = await negotiate(client, deflate=True, **asked)
        assert (answer["deflate"], answer["deflate_level"]) == (True, level)
        await compress_with(client, DeflateStream, level=level)
    assert f"upgrading connection to deflate (level {level})" in caplog.text


async def test_both_compressions_are_refused(daemon):
    client = await connect(daemon.addresses.tcp)
    raw, answer = await negotiate(client, snappy=True, deflate=True)
    assert answer is None
    assert raw[8:] == b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression"
    await client.expect_closed()


async def test_disabled_compression_is_answered_false(start_daemon):
    async with start_daemon("--snappy=false", "--deflate=false") as daemon:
        for codec in ("snappy", "deflate"):
            client = await connect(daemon.addresses.tcp)
            _, answer = await negotiate(client, **{codec: True})
            assert answer[codec] is False
            await client.send(encode_pub("t", b"plain"))
            await client.expect_response(b"OK")


async def test_a_bad_snappy_checksum_closes_only_that_client(daemon, caplog):
    caplog.set_level(logging.INFO, "pynsqd")
    bystander = await client_with(daemon, "snappy")
    client = await client_with(daemon, "snappy")
    chunk = bytearray(snappy.StreamCompressor().add_chunk(encode_pub("t", b"tampered")))
    chunk[14] ^= 0xFF  # the data chunk's checksum: after the 10-byte stream identifier and its 4-byte header
    await client.stream.send_raw(bytes(chunk))
    await client.expect_closed()
    assert "failed to read command - snappy: corrupt input - bad checksum" in caplog.text
    await bystander.send(encode_pub("t", b"fine"))
    await bystander.expect_response(b"OK")
    stats = json.loads((await request(daemon.addresses.http, "GET", "/stats?format=json&topic=t")).body)
    assert stats["topics"][0]["message_count"] == 1


async def test_garbage_in_a_deflate_stream_closes_the_client(daemon, caplog):
    caplog.set_level(logging.INFO, "pynsqd")
    client = await client_with(daemon, "deflate")
    await client.stream.send_raw(b"\xff\xfe\xfd garbage that is not deflate")
    await client.expect_closed()
    assert "failed to read command - flate: corrupt input" in caplog.text


async def test_a_body_cut_off_by_corrupt_snappy_gets_nsqds_read_error(daemon):
    client = await client_with(daemon, "snappy")
    pub = encode_pub("t", b"0123456789")
    await client.send(pub[:-4])  # the body is not complete yet
    await client.stream.send_raw(b"\x02\x00\x00\x00")  # a reserved, unskippable chunk type
    frame = await client.read_frame()
    assert (frame.frame_type, frame.data) == (FRAME_TYPE_ERROR, b"E_BAD_MESSAGE PUB failed to read message body")
    await client.expect_closed()


async def test_a_second_compressing_identify_is_answered_through_the_stream_it_replaces(daemon):
    # nsqd sends the answer through the current stream, then starts a fresh one (its OK first);
    # snappy's framing lets one decompressor read both streams (deflate's takes the same path)
    client = await client_with(daemon, "snappy")
    await client.send(encode_identify({"feature_negotiation": True, "snappy": True}))
    assert json.loads((await client.read_frame()).data)["snappy"] is True
    await client.expect_response(b"OK")
    client.stream._out = snappy.StreamCompressor()  # the client's side of the fresh stream
    await client.send(encode_pub("t", b"after"))
    await client.expect_response(b"OK")
