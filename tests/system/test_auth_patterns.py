"""An auth server's topic and channel patterns mean what they mean in nsqd: Go's regexp syntax
(RE2), matched anywhere in the name, a pattern Go cannot compile failing AUTH; and a pattern
that backtracks for ages in Python's ``re`` costs microseconds.

Every row is asked of pynsqd and, where nsq 1.3.0's programs are here, of nsqd itself, each
a process of its own.
"""

from __future__ import annotations

import time

import pytest
import trio

from broker.protocol import FRAME_TYPE_ERROR, encode_auth, encode_pub, encode_sub
from tests.support.auth_server import AuthServer
from tests.support.nsq_programs import nsq_bin, nsq_bin_missing
from tests.support.processes import BrokerProcess
from tests.support.v2client import connect

OK = b"OK"
FAILED = b"E_AUTH_FAILED AUTH failed"
LONG = "a" * 63 + "-"  # a topic name of the greatest length, 64 characters

# (what the pattern grants: "topic" to PUB or "channel" to SUB on topic "t", the pattern,
#  the name, and nsqd 1.3.0's answer to the command after AUTH)
BACKTRACKING = ("topic", "^(a+)+$", LONG, b'E_UNAUTHORIZED AUTH failed for PUB on "' + LONG.encode() + b'" ""')
ORDERS_ANYWHERE = ("topic", "orders", "new_orders_eu", OK)
CASES = [
    BACKTRACKING,
    ("topic", "^(a+)+$", "a" * 64, OK),
    ("topic", "(x+x+)+y", "x" * 64, b'E_UNAUTHORIZED AUTH failed for PUB on "' + b"x" * 64 + b'" ""'),
    ORDERS_ANYWHERE,  # a pattern matches anywhere in the name
    ("topic", "^orders$", "orders2", b'E_UNAUTHORIZED AUTH failed for PUB on "orders2" ""'),
    ("topic", "^orders$", "orders", OK),
    ("topic", "", "anything", OK),
    ("topic", "^[[:digit:]]+$", "2024", OK),
    ("topic", r"^\d+$", "12a", b'E_UNAUTHORIZED AUTH failed for PUB on "12a" ""'),
    ("topic", r"^\pL+$", "abc", OK),
    ("topic", "(?i)^ORDERS$", "orders", OK),
    ("topic", r"\Qa.b\E", "xa.by", OK),
    ("topic", r"\Qa.b\E", "axb", b'E_UNAUTHORIZED AUTH failed for PUB on "axb" ""'),
    ("topic", "^a{2,3}$", "aaaa", b'E_UNAUTHORIZED AUTH failed for PUB on "aaaa" ""'),
    ("topic", "^(?P<name>orders)$", "orders", OK),
    ("topic", "(?P<n>a)(?P<n>b)", "ab", OK),  # Go allows a name twice
    ("topic", r"\x41|\101", "A", OK),
    ("topic", r"\z", "t", OK),
    ("topic", "x{1000}", "t", b'E_UNAUTHORIZED AUTH failed for PUB on "t" ""'),
    ("channel", "^billing$", "billing", OK),
    ("channel", "^billing$", "billing#ephemeral", b'E_UNAUTHORIZED AUTH failed for SUB on "t" "billing#ephemeral"'),
    ("channel", "#ephemeral$", "c#ephemeral", OK),
    # patterns Go's regexp refuses (Python's re takes the first five): AUTH fails
    ("topic", r"(a)\1", "aa", FAILED),
    ("topic", "(?=a)", "a", FAILED),
    ("topic", "(?<=a)b", "ab", FAILED),
    ("topic", "(?<name>a)", "a", FAILED),
    ("topic", r"a\Z", "a", FAILED),
    ("topic", r"\C", "a", FAILED),
    ("topic", "(", "a", FAILED),
    ("topic", "a**", "a", FAILED),
    ("topic", "a{1001}", "a", FAILED),
    ("topic", "(a{100}){100}", "a", FAILED),
    ("topic", "[z-a]", "a", FAILED),
    ("channel", "[[:nope:]]", "c", FAILED),
    # Go's limit on nesting: a literal in 999 captures compiles, in 1,000 it does not
    ("topic", "(" * 999 + "t" + ")" * 999, "t", OK),
    ("topic", "(" * 1000 + "t" + ")" * 1000, "t", FAILED),
    ("topic", "(?:" * 5000 + "t" + ")" * 5000, "t", OK),
]


def _secrets() -> dict:
    secrets = {}
    for i, (grant, pattern, _, _) in enumerate(CASES):
        if grant == "topic":
            authorization = {"topic": pattern, "channels": [".*"], "permissions": ["publish"]}
        else:
            authorization = {"topic": "^t$", "channels": [pattern], "permissions": ["subscribe"]}
        secrets[str(i)] = {"identity": f"case {i}", "ttl": 3600, "authorizations": [authorization]}
    return secrets


@pytest.fixture(scope="module")
def authd():
    server = AuthServer(_secrets()).start()
    yield server
    server.stop()


@pytest.fixture(scope="module", params=["pynsqd", "nsqd"])
def server(request, authd, tmp_path_factory):
    """pynsqd, then nsqd 1.3.0, as processes asking ``authd`` (a stuck broker cannot stall the test)."""
    if request.param == "nsqd" and nsq_bin_missing() is not None:
        pytest.skip(str(nsq_bin_missing()))
    program = [str(nsq_bin() / "nsqd")] if request.param == "nsqd" else None
    folder = tmp_path_factory.mktemp(request.param)
    proc = BrokerProcess(folder / "data", f"--auth-http-address={authd.address}", program=program,
                         log_path=folder / "broker.log").start()
    yield proc
    proc.kill()


async def answer(address: tuple[str, int], secret: str, grant: str, name: str) -> bytes:
    """The error or response that follows ``AUTH secret`` and then a PUB to, or SUB on, ``name``."""
    client = await connect(address)
    try:
        await client.send(encode_auth(secret.encode()))
        frame = await client.read_frame()
        if frame.frame_type == FRAME_TYPE_ERROR:
            return frame.data
        await client.send(encode_pub(name, b"x") if grant == "topic" else encode_sub("t", name))
        return (await client.read_frame()).data
    finally:
        await client.aclose()


@pytest.mark.parametrize(("grant", "pattern", "name", "expected"), CASES,
                         ids=[f"{grant}-{pattern[:24]}-{name[:24]}" for grant, pattern, name, _ in CASES])
async def test_patterns_mean_what_they_mean_in_nsqd(server, grant, pattern, name, expected):
    secret = str(CASES.index((grant, pattern, name, expected)))
    with trio.fail_after(5):
        assert await answer(server.tcp, secret, grant, name) == expected


async def test_a_backtracking_pattern_does_not_stall_the_broker(server):
    # Python's re needs 0.2 s for ^(a+)+$ on 22 characters, and twice as long for each more
    with trio.fail_after(20):
        bystander = await connect(server.tcp)
        await bystander.send(encode_auth(str(CASES.index(ORDERS_ANYWHERE)).encode()))
        await bystander.read_frame()
        clients = [await connect(server.tcp) for _ in range(10)]
        for client in clients:
            await client.send(encode_auth(str(CASES.index(BACKTRACKING)).encode()))
            await client.read_frame()
        started = time.monotonic()
        for client in clients:
            await client.send(encode_pub(LONG, b"x"))
            await bystander.send(encode_pub("new_orders_eu", b"x"))
        for client in clients:
            assert (await client.read_frame()).data == BACKTRACKING[3]
            await bystander.expect_response(OK)
        elapsed = time.monotonic() - started
    assert elapsed < 0.5
