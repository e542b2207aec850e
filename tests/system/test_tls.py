"""TLS on the V2 port (IDENTIFY tls_v1), --tls-required, client certificates and the HTTPS listener."""

from __future__ import annotations

import json
import ssl

import httpx
import pytest
import trio

from broker.protocol import FRAME_TYPE_ERROR, encode_pub, encode_rdy, encode_sub
from tests.support.http_client import request
from tests.support.transports import make_certificates, negotiate, upgrade_tls
from tests.support.v2client import connect


@pytest.fixture
def certs(tmp_path):
    return make_certificates(tmp_path / "certs")


async def tls_client(daemon, certs, **identify):
    client = await connect(daemon.addresses.tcp)
    _, answer = await negotiate(client, tls_v1=True, **identify)
    assert answer["tls_v1"] is True
    await upgrade_tls(client, certs.client_context())
    return client


async def test_tls_upgrade_carries_publish_and_delivery(start_daemon, certs):
    async with start_daemon(*certs.broker_flags()) as daemon:
        publisher = await tls_client(daemon, certs)
        consumer = await tls_client(daemon, certs, client_id="tls-consumer")
        await consumer.send(encode_sub("t", "c") + encode_rdy(10))
        await consumer.expect_response(b"OK")
        await publisher.send(encode_pub("t", b"secret body"))
        await publisher.expect_response(b"OK")
        message = await consumer.read_message()
        assert message.body == b"secret body"
        stats = json.loads((await request(daemon.addresses.http, "GET", "/stats?format=json")).body)
        client = stats["topics"][0]["channels"][0]["clients"][0]
        assert client["client_id"] == "tls-consumer"
        assert (client["tls"], client["snappy"], client["deflate"]) == (True, False, False)
        assert client["tls_version"] == "TLS1.3"
        assert client["tls_cipher_suite"].startswith("TLS_")
        assert client["tls_negotiated_protocol_is_mutual"] is True
        metrics = (await request(daemon.addresses.http, "GET", "/metrics")).body.decode()
        assert 'nsq_server_clients{compression="none",tls="true"} 2.0' in metrics


async def test_tls_v1_is_false_without_a_certificate_and_the_connection_stays_plain(daemon):
    client = await connect(daemon.addresses.tcp)
    _, answer = await negotiate(client, tls_v1=True)
    assert answer["tls_v1"] is False
    await client.send(encode_pub("t", b"plain"))
    await client.expect_response(b"OK")


async def test_a_failed_handshake_is_refused_in_plain_text_and_others_carry_on(start_daemon, certs):
    async with start_daemon(*certs.broker_flags()) as daemon:
        bystander = await tls_client(daemon, certs)
        client = await connect(daemon.addresses.tcp)
        await negotiate(client, tls_v1=True)
        await client.send(b"this is not a TLS ClientHello at all\n" * 4)
        frame = await client.read_frame()
        assert frame.frame_type == FRAME_TYPE_ERROR
        assert frame.data.startswith(b"E_IDENTIFY_FAILED IDENTIFY failed tls: ")
        await client.expect_closed()
        await bystander.send(encode_pub("t", b"still fine"))
        await bystander.expect_response(b"OK")


async def test_a_client_that_does_not_trust_the_broker_gets_nowhere(start_daemon, certs, tmp_path):
    other = make_certificates(tmp_path / "other")
    async with start_daemon(*certs.broker_flags()) as daemon:
        client = await connect(daemon.addresses.tcp)
        await negotiate(client, tls_v1=True)
        with pytest.raises(trio.BrokenResourceError):
            await upgrade_tls(client, other.client_context())
        healthy = await tls_client(daemon, certs)
        await healthy.send(encode_pub("t", b"x"))
        await healthy.expect_response(b"OK")


async def test_tls_required_refuses_every_command_but_identify_until_upgraded(start_daemon, certs):
    async with start_daemon(*certs.broker_flags("--tls-required=true")) as daemon:
        plain = await connect(daemon.addresses.tcp)
        await plain.send(encode_pub("t", b"x"))
        await plain.expect_error(b"E_INVALID cannot PUB in current state (TLS required)")
        upgraded = await tls_client(daemon, certs)
        await upgraded.send(encode_pub("t", b"x"))
        await upgraded.expect_response(b"OK")


async def test_https_serves_the_api_and_plain_http_answers_tls_required(start_daemon, certs):
    async with start_daemon(*certs.broker_flags("--tls-required=true", "--https-address=127.0.0.1:0")) as daemon:
        https_host, https_port = daemon.addresses.https
        plain = await request(daemon.addresses.http, "GET", "/ping")
        assert plain.status == 403
        assert plain.body == b'{"message": "TLS_REQUIRED", "https_port": %d}' % https_port
        async with httpx.AsyncClient(verify=certs.client_context()) as client:
            pub = await client.post(f"https://{https_host}:{https_port}/pub?topic=secure", content=b"hi")
            stats = await client.get(f"https://{https_host}:{https_port}/stats?format=json&topic=secure")
        assert (pub.status_code, pub.text) == (200, "OK")
        assert stats.json()["topics"][0]["message_count"] == 1


async def test_tcp_https_requires_tls_on_tcp_only(start_daemon, certs):
    async with start_daemon(*certs.broker_flags("--tls-required=tcp-https")) as daemon:
        assert (await request(daemon.addresses.http, "GET", "/ping")).body == b"OK"
        plain = await connect(daemon.addresses.tcp)
        await plain.send(encode_sub("t", "c"))
        await plain.expect_error(b"E_INVALID cannot SUB in current state (TLS required)")


async def test_require_verify_wants_a_certificate_the_ca_signed(start_daemon, certs):
    flags = certs.broker_flags("--tls-client-auth-policy=require-verify", f"--tls-root-ca-file={certs.ca_file}")
    async with start_daemon(*flags) as daemon:
        anonymous = await connect(daemon.addresses.tcp)
        await negotiate(anonymous, tls_v1=True)
        with pytest.raises(trio.BrokenResourceError):
            # TLS 1.3 finishes the client's side first: the refusal shows on the first read
            await upgrade_tls(anonymous, certs.client_context())
        known = await connect(daemon.addresses.tcp)
        await negotiate(known, tls_v1=True)
        await upgrade_tls(known, certs.client_context(with_certificate=True))
        await known.send(encode_pub("t", b"x"))
        await known.expect_response(b"OK")


async def test_tls_min_version_refuses_older_clients(start_daemon, certs):
    async with start_daemon(*certs.broker_flags("--tls-min-version=tls1.3")) as daemon:
        client = await connect(daemon.addresses.tcp)
        await negotiate(client, tls_v1=True)
        old = certs.client_context()
        old.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises(trio.BrokenResourceError):
            await upgrade_tls(client, old)


async def test_plain_http_on_the_https_port_is_dropped_and_https_carries_on(start_daemon, certs):
    async with start_daemon(*certs.broker_flags()) as daemon:
        stream = await trio.open_tcp_stream(*daemon.addresses.https)
        with trio.fail_after(5):
            await stream.send_all(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
            received = b""
            while chunk := await stream.receive_some(1024):  # at most a TLS alert, then the close
                received += chunk
        await stream.aclose()
        assert b"HTTP/1.1" not in received
        async with httpx.AsyncClient(verify=certs.client_context()) as client:
            reply = await client.get(f"https://127.0.0.1:{daemon.addresses.https[1]}/ping")
        assert (reply.status_code, reply.text) == (200, "OK")
