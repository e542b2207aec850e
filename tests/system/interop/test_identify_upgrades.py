"""The same IDENTIFY exchanges against nsq 1.3.0's nsqd and pynsqd, compared byte for byte.

For each exchange both brokers get the same bytes; the plain-text answer (the feature
negotiation JSON or the error frame) must be identical, and so must the framed ``OK`` that
follows inside TLS and inside the compressed stream (snappy's framing bytes too; deflate
streams are compared decompressed, as Go's and zlib's compressors may choose other blocks).
"""

from __future__ import annotations

import json

import pytest
import trio

from broker.protocol import MAGIC_V2, encode_identify, encode_pub
from tests.support.paths import nsq_bin
from tests.support.processes import BrokerProcess
from tests.support.transports import DeflateStream, make_certificates, read_exactly, upgrade_tls
from tests.support.v2client import V2Client, connect

pytestmark = pytest.mark.skipif(nsq_bin() is None, reason="nsq 1.3.0's nsqd is not here (shared/nsq/bin)")

FN = {"feature_negotiation": True}
EXCHANGES = [
    {},
    {"tls_v1": True},
    FN,
    {**FN, "tls_v1": True},
    {**FN, "snappy": True},
    {**FN, "deflate": True},
    {**FN, "deflate": True, "deflate_level": 1},
    {**FN, "deflate": True, "deflate_level": 9},
    {**FN, "deflate": True, "deflate_level": -1},
    {**FN, "deflate_level": 3},
    {**FN, "snappy": True, "deflate": True},
    {**FN, "tls_v1": True, "snappy": True},
    {**FN, "tls_v1": True, "deflate": True, "deflate_level": 2},
    {**FN, "tls_v1": True, "snappy": True, "deflate": True},
    {**FN, "tls_v1": "yes"},
    {**FN, "snappy": 1},
    {**FN, "deflate": True, "deflate_level": "high"},
    {**FN, "deflate": True, "deflate_level": 1.5},
    {**FN, "tls_v1": None, "snappy": None},
]


@pytest.fixture(scope="module")
def peers(tmp_path_factory):
    """nsqd and pynsqd with the same certificate and ``--max-deflate-level=5``."""
    folder = tmp_path_factory.mktemp("identify")
    certs = make_certificates(folder / "certs")
    flags = certs.broker_flags("--max-deflate-level=5")
    started = []
    try:
        for name, program in (("nsqd", [str(nsq_bin() / "nsqd")]), ("pynsqd", None)):
            started.append(BrokerProcess(folder / name, *flags, program=program,
                                         log_path=folder / f"{name}.log").start())
        yield certs, started
    finally:
        for proc in started:
            proc.kill()


async def exchange(address, certs, params: dict) -> list[bytes]:
    """What a broker answers to ``params``: the plain answer, then each upgrade's OK frame."""
    client = await connect(address)
    await client.send(encode_identify(params))
    with trio.fail_after(5):
        head = await read_exactly(client.stream, 8)
        answer = head + await read_exactly(client.stream, int.from_bytes(head[:4], "big") - 4)
    seen = [answer]
    if head[4:8] != b"\x00\x00\x00\x00" or not answer[8:].startswith(b"{"):
        return seen
    agreed = json.loads(answer[8:])
    if agreed["tls_v1"]:
        await upgrade_tls(client, certs.client_context())
        seen.append(b"TLS OK")
    if agreed["snappy"]:
        with trio.fail_after(5):
            # stream identifier (10 bytes), chunk header and checksum (8), the frame stored (10)
            seen.append(await read_exactly(client.stream, 28))
    if agreed["deflate"]:
        client.stream = DeflateStream(client.stream, agreed["deflate_level"])
        seen.append((await client.read_frame()).data)
        await client.send(encode_pub("t", b"through deflate"))
        seen.append((await client.read_frame()).data)
    await client.aclose()
    return seen


@pytest.mark.parametrize("params", EXCHANGES, ids=[json.dumps(p, separators=(",", ":")) for p in EXCHANGES])
async def test_identify_answers_match_nsqd_byte_for_byte(peers, params):
    certs, (nsqd, pynsqd) = peers
    expected = await exchange(nsqd.tcp, certs, params)
    got = await exchange(pynsqd.tcp, certs, params)
    assert got == expected


async def test_a_client_that_does_not_start_tls_is_refused_the_same_way(peers):
    certs, brokers = peers
    answers = []
    for broker in brokers:
        client = V2Client(await trio.open_tcp_stream(*broker.tcp))
        await client.send(MAGIC_V2 + encode_identify({**FN, "tls_v1": True}))
        with trio.fail_after(5):
            head = await read_exactly(client.stream, 8)
            await read_exactly(client.stream, int.from_bytes(head[:4], "big") - 4)
            # the NOPs are not a TLS ClientHello: both refuse the handshake in plain text (sent
            # only after the answer: nsqd loses bytes that arrive before it starts the handshake)
            await client.send(b"NOP\nNOP\n")
            answers.append(await client.read_frame())
    assert answers[0] == answers[1]
    assert answers[0].data == b"E_IDENTIFY_FAILED IDENTIFY failed tls: first record does not look like a TLS handshake"
