"""The same requests to nsq 1.3.0's nsqd and to pynsqd get the same answers, byte for byte.

Both brokers start with the same flags on ports 0; each request of a list (HTTP: method,
target, body; TCP: the chunks of one conversation) goes to nsqd, then to pynsqd, in the
same order, so both hold the same topics and channels at every step. Compared: the HTTP
status, ``Content-Type`` and body; every byte a TCP conversation gets back, and whether
it ends. Normalized first: each broker's own ports, start time and uptime, the ``memory``
block of ``/stats`` (Go's heap against CPython's), the runtime in ``/stats``' first line,
and the id and timestamp of message frames.

The same goes for the data directory (``nsqd.dat`` byte for byte, every file's mode) and for
a start refused: the line nsqd prints for a bad flag, an option its ``New()`` refuses or a
listen address it cannot bind is pynsqd's too.

Known differences on purpose are in README's "Differences from nsqd on purpose" and are
left out here; so is ``PUT /config/nsqlookupd_tcp_addresses`` with ``null`` (nsqd then shows
``null``, pynsqd ``[]``).
"""

from __future__ import annotations

import http.client
import os
import re
import socket
import struct
import subprocess
import sys
import time

import pytest

from tests.support.nsq_programs import nsq_bin, nsq_bin_missing
from tests.support.paths import REPO
from tests.support.processes import BrokerProcess

pytestmark = pytest.mark.skipif(nsq_bin_missing() is not None, reason=nsq_bin_missing() or "")

BIG = b"y" * (1 << 20)  # --max-msg-size, nsqd's default

#: (method, target, body); targets starting "V1:" send nsqd's v1 Accept header.
HTTP_CASES: list[tuple[str, str, bytes | None]] = [
    ("GET", "/ping", None), ("HEAD", "/ping", None), ("GET", "/ping?x=1", None), ("GET", "/ping/", None),
    ("GET", "/info", None), ("GET", "/stats?format=json", None), ("GET", "/stats", None),
    ("POST", "/pub", None), ("POST", "/pub?topic=", None), ("POST", "/pub?topic=bad!name", b"x"),
    ("POST", "/pub?topic=t1", None), ("POST", "/pub?topic=t1", b"hello"),
    ("POST", "/pub?topic=t1&defer=-1", b"x"), ("POST", "/pub?topic=t1&defer=abc", b"x"),
    ("POST", "/pub?topic=t1&defer=3600001", b"x"), ("POST", "/pub?topic=t1&defer=1000", b"x"),
    ("POST", "/pub?topic=t1&defer=", b"x"), ("POST", "/pub?topic=t1&defer=1.5", b"x"),
    ("GET", "/pub?topic=t1", None), ("PUT", "/pub?topic=t1", b"x"), ("OPTIONS", "/pub?topic=t1", None),
    ("POST", "/pub?topic=t9", BIG), ("POST", "/pub?topic=t9", BIG + b"y"),
    ("POST", "/pub?topic=" + "a" * 64, b"x"), ("POST", "/pub?topic=" + "a" * 65, b"x"),
    ("POST", "/pub?topic=t9%23ephemeral", b"x"), ("POST", "/pub?topic=t%209", b"x"),
    ("POST", "/pub?topic=t9&topic=t8", b"x"),
    ("POST", "/mpub?topic=t1", b"a\nb\nc"), ("POST", "/mpub?topic=t1", b""), ("POST", "/mpub?topic=t1", b"\n\n"),
    ("POST", "/mpub?topic=t1&binary=true", b"abc"),
    ("POST", "/mpub?topic=t1&binary=true", b"\x00\x00\x00\x01\x00\x00\x00\x01x"),
    ("POST", "/mpub?topic=t1&binary=1", b"\x00\x00\x00\x01\x00\x00\x00\x01x"),
    ("POST", "/mpub?topic=t9&binary=true", b"\x00\x00\x00\x00"),
    ("POST", "/mpub?topic=t9&binary=true", b"\x00\x00\x00\x02\x00\x00\x00\x01x"),
    ("POST", "/mpub?topic=t9&binary=true", b"\xff\xff\xff\xff"),
    ("POST", "/mpub?topic=t9&binary=true", b"\x00\x00\x00\x01\x00\x00\x00\x00"),
    ("POST", "/mpub?topic=t9&binary=true", b"\x00\x00\x00\x01\xff\xff\xff\xffx"),
    ("POST", "/mpub?topic=t9", (b"z" * 1000 + b"\n") * 1100),
    ("POST", "/topic/create?topic=t2", None), ("POST", "/topic/create?topic=t2", None),
    ("POST", "/topic/create", None), ("POST", "/topic/create?topic=a%20b", None),
    ("GET", "/topic/create?topic=t3", None),
    ("POST", "/channel/create?topic=t2&channel=c1", None), ("POST", "/channel/create?topic=t2", None),
    ("POST", "/channel/create?topic=nope&channel=c1", None), ("POST", "/channel/create?topic=t2&channel=bad!", None),
    ("POST", "/channel/create?topic=t9&channel=c%23ephemeral", None),
    ("POST", "/channel/create?topic=t9&channel=" + "c" * 65, None),
    ("POST", "/channel/pause?topic=t2&channel=c1", None), ("POST", "/channel/unpause?topic=t2&channel=c1", None),
    ("POST", "/channel/pause?topic=t2&channel=zz", None),
    ("POST", "/channel/empty?topic=t2&channel=c1", None), ("POST", "/channel/empty?topic=t2&channel=zz", None),
    ("POST", "/topic/pause?topic=t2", None), ("POST", "/pub?topic=t2", b"paused"),
    ("POST", "/topic/unpause?topic=t2", None), ("POST", "/topic/pause?topic=zz", None),
    ("POST", "/topic/empty?topic=zz", None),
    ("GET", "/stats?format=json&topic=t2", None), ("GET", "/stats?format=json&topic=t2&channel=c1", None),
    ("GET", "/stats?format=json&topic=zz", None), ("GET", "/stats?format=json&include_clients=false", None),
    ("GET", "/stats?format=json&channel=c", None), ("GET", "/stats?format=json&topic=t9&channel=nope", None),
    ("GET", "/stats?format=text&topic=t2", None), ("GET", "/stats?format=bogus", None),
    ("POST", "/topic/empty?topic=t2", None),
    ("POST", "/channel/delete?topic=t2&channel=c1", None), ("POST", "/channel/delete?topic=t2&channel=c1", None),
    ("POST", "/topic/delete?topic=t2", None), ("POST", "/topic/delete?topic=t2", None),
    ("POST", "/topic/delete?topic=t9%23ephemeral", None), ("DELETE", "/topic/delete?topic=t1", None),
    ("GET", "/nope", None), ("POST", "/nope", None), ("GET", "//ping", None),
    ("POST", "/debug/freememory", None), ("GET", "/debug/freememory", None),
    ("GET", "/config", None), ("GET", "/config/", None), ("GET", "/config/nope", None),
    ("GET", "/config/id", None), ("GET", "/config/node_id", None),
    ("GET", "/config/broadcast_tcp_port", None), ("GET", "/config/broadcast_http_port", None),
    ("GET", "/config/https_address", None), ("GET", "/config/tls_min_version", None),
    ("GET", "/config/e2e_processing_latency_percentiles", None), ("GET", "/config/max_req_timeout", None),
    ("GET", "/config/lookupd_tcp_address", None), ("GET", "/config/nsqlookupd_tcp_addresses", None),
    ("PUT", "/config/log_level", b"debug"), ("PUT", "/config/log_level", b"bogus"), ("PUT", "/config/log_level", b""),
    ("PUT", "/config/log_level", b"WARN"), ("GET", "/config/log_level", None), ("POST", "/config/log_level", b"info"),
    ("PUT", "/config/log_level", b"info"), ("PUT", "/config/mem_queue_size", b"5"),
    ("PUT", "/config/nsqlookupd_tcp_addresses", b'["127.0.0.1:1"]'),
    ("PUT", "/config/nsqlookupd_tcp_addresses", b"garbage"), ("PUT", "/config/nsqlookupd_tcp_addresses", b"[1,2]"),
    ("PUT", "/config/nsqlookupd_tcp_addresses", b"[]"),
    ("GET", "V1:/ping", None), ("POST", "V1:/pub?topic=t1", b"x"), ("POST", "V1:/pub?topic=bad!", b"x"),
    ("GET", "V1:/stats?format=json&topic=zz", None), ("GET", "V1:/info", None),
    ("POST", "V1:/topic/create?topic=t4", None), ("POST", "V1:/topic/create?topic=bad!", None), ("GET", "V1:/nope", None),
]


def _body(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


def _mpub(*bodies: bytes) -> bytes:
    return _body(struct.pack(">i", len(bodies)) + b"".join(_body(b) for b in bodies))


def _identify(doc: bytes) -> bytes:
    return b"IDENTIFY\n" + _body(doc)


V2 = b"  V2"
#: One connection each: the chunks sent (a short pause between them), then all it gets back.
TCP_CASES: dict[str, list[bytes]] = {
    "bad magic": [b"  V1"],
    "NOP": [V2, b"NOP\n"], "unknown command": [V2, b"FOO\n"], "empty line": [V2, b"\n"],
    "lower case": [V2, b"pub t\n"], "PUB without topic": [V2, b"PUB\n"],
    "PUB bad topic": [V2, b"PUB bad!\n" + _body(b"x")], "PUB": [V2, b"PUB tt\n" + _body(b"x")],
    "PUB size 0": [V2, b"PUB tt\n" + struct.pack(">i", 0)], "PUB size -1": [V2, b"PUB tt\n" + struct.pack(">i", -1)],
    "PUB too big": [V2, b"PUB tt\n" + struct.pack(">i", (1 << 20) + 1)],
    "PUB extra argument": [V2, b"PUB tt x\n" + _body(b"x")],
    "PUB in pieces": [V2, b"PUB tt\n", struct.pack(">i", 3), b"abc"],
    "MPUB": [V2, b"MPUB tt\n" + _mpub(b"a", b"b")], "MPUB of 0": [V2, b"MPUB tt\n" + _body(struct.pack(">i", 0))],
    "MPUB short": [V2, b"MPUB tt\n" + _body(struct.pack(">i", 2) + _body(b"a"))],
    "MPUB empty message": [V2, b"MPUB tt\n" + _body(struct.pack(">i", 1) + struct.pack(">i", 0))],
    "DPUB -1": [V2, b"DPUB tt -1\n" + _body(b"x")], "DPUB too long": [V2, b"DPUB tt 3600001\n" + _body(b"x")],
    "DPUB not a number": [V2, b"DPUB tt abc\n" + _body(b"x")], "DPUB": [V2, b"DPUB tt 1000\n" + _body(b"x")],
    "RDY before SUB": [V2, b"RDY 1\n"], "FIN before SUB": [V2, b"FIN 0123456789abcdef\n"],
    "REQ before SUB": [V2, b"REQ 0123456789abcdef 0\n"], "TOUCH before SUB": [V2, b"TOUCH 0123456789abcdef\n"],
    "CLS before SUB": [V2, b"CLS\n"], "SUB without channel": [V2, b"SUB tt\n"],
    "SUB bad channel": [V2, b"SUB tt bad!\n"], "RDY not a number": [V2, b"SUB tt c\n", b"RDY abc\n"],
    "RDY too big": [V2, b"SUB tt c\n", b"RDY 2501\n"], "SUB twice": [V2, b"SUB tt c\n", b"SUB tt c\n"],
    "PUB after SUB": [V2, b"SUB tt c2\n", b"PUB tt\n" + _body(b"x")],
    "a message, then FIN of another": [V2, b"SUB tsub c\n", b"RDY 1\n", b"FIN 0000000000000000\n"],
    "RDY 0 then CLS": [V2, b"SUB tsub2 c\n", b"RDY 0\n", b"CLS\n"],
    "IDENTIFY bad JSON": [V2, _identify(b"{bad")], "IDENTIFY {}": [V2, _identify(b"{}")],
    "IDENTIFY negotiating": [V2, _identify(b'{"feature_negotiation":true,"client_id":"x","hostname":"h",'
                                          b'"user_agent":"u/1"}')],
    "IDENTIFY twice": [V2, _identify(b"{}"), _identify(b"{}")],
    "heartbeat too short": [V2, _identify(b'{"feature_negotiation":true,"heartbeat_interval":999}')],
    "heartbeat off": [V2, _identify(b'{"feature_negotiation":true,"heartbeat_interval":-1}')],
    "output buffer": [V2, _identify(b'{"feature_negotiation":true,"output_buffer_size":63,'
                                    b'"output_buffer_timeout":-1}')],
    "sample rate 101": [V2, _identify(b'{"feature_negotiation":true,"sample_rate":101}')],
    "msg_timeout too short": [V2, _identify(b'{"feature_negotiation":true,"msg_timeout":999}')],
    "TLS without a certificate": [V2, _identify(b'{"feature_negotiation":true,"tls_v1":true}')],
    "deflate and snappy": [V2, _identify(b'{"feature_negotiation":true,"deflate":true,"snappy":true}')],
    "a string for a number": [V2, _identify(b'{"heartbeat_interval":"x"}')],
    "AUTH when not required": [V2, b"AUTH\n" + _body(b"secret")],
    "a long line": [V2, b"PUB " + b"a" * 5000 + b"\n"], "every byte": [V2, bytes(range(256))],
}


def _normalize(data: bytes, ports: tuple[int, ...]) -> bytes:
    data = re.sub(rb'"start_time":\d+', b'"start_time":N', data)
    data = re.sub(rb'"health":"[^"]*"', b'"health":"H"', data)
    data = re.sub(rb'"memory":\{[^}]*\}', b'"memory":M', data)
    data = re.sub(rb"Memory:\n(   .*\n)*", b"Memory:M\n", data)
    data = re.sub(rb"nsqd v1\.3\.0 \(built w/[^)]*\)", b"nsqd v1.3.0", data)
    data = re.sub(rb"(start_time|uptime) \S+", rb"\1 T", data)
    for port in ports:
        data = re.sub(rb"\b%d\b" % port, b"PORT", data)
    return data


def _http(address: tuple[str, int], method: str, target: str, body: bytes | None) -> tuple[int, str, bytes]:
    """One request with the standard library's client, which (unlike h11's helper in
    ``tests.support.http_client``) still reads an answer the server sends before taking the
    whole body, as both do for a body over ``--max-msg-size``."""
    headers = {}
    if target.startswith("V1:"):
        target = target[3:]
        headers["Accept"] = "application/vnd.nsq; version=1.0"
    conn = http.client.HTTPConnection(*address, timeout=10)
    try:
        conn.request(method, target, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type") or "", response.read()
    finally:
        conn.close()


def _converse(address: tuple[str, int], chunks: list[bytes], expect: bytes | None = None) -> bytes:
    """What the broker sends back to ``chunks``, ending ``<EOF>`` if it closes.

    Without ``expect`` (nsqd's side), until it is quiet for half a second; with it, until as
    many bytes as ``expect`` came (or the end), then quiet for a moment: a busy machine
    makes the second broker slower, never shorter.
    """
    with socket.create_connection(address, timeout=10) as sock:
        for chunk in chunks:
            sock.sendall(chunk)
            time.sleep(0.02)  # separate writes, as a client sends them
        received = b""
        deadline = time.monotonic() + 10
        while True:
            waiting = expect is not None and len(received) < len(expect) and time.monotonic() < deadline
            sock.settimeout(1.0 if waiting else 0.5 if expect is None else 0.2)
            try:
                data = sock.recv(65536)
            except TimeoutError:
                if waiting:
                    continue
                return received
            except ConnectionResetError:
                return received + b"<EOF>"
            if not data:
                return received + b"<EOF>"
            received += data


def _frames(data: bytes) -> bytes:
    """``data`` with each message frame's timestamp and id replaced (they differ by nature)."""
    out, i = b"", 0
    while i + 8 <= len(data) and not data.startswith(b"<EOF>", i):
        size, frame_type = struct.unpack(">ii", data[i:i + 8])
        payload = data[i + 8:i + 4 + size]
        if frame_type == 2:
            payload = b"TS" + payload[8:10] + b"ID" + payload[26:]
        out += struct.pack(">i", frame_type) + payload
        i += 4 + size
    return out + data[i:]


@pytest.fixture
def pair(tmp_path):
    nsqd = BrokerProcess(tmp_path / "nsqd", program=[str(nsq_bin() / "nsqd")]).start()
    pynsqd = BrokerProcess(tmp_path / "pynsqd").start()
    yield nsqd, pynsqd
    for proc in (nsqd, pynsqd):
        proc.kill()


def _ports(proc: BrokerProcess) -> tuple[int, ...]:
    return (proc.tcp[1], proc.http[1])


def test_http_answers_are_nsqds(pair):
    nsqd, pynsqd = pair
    differ = []
    for method, target, body in HTTP_CASES:
        theirs = _http(nsqd.http, method, target, body)
        ours = _http(pynsqd.http, method, target, body)
        theirs = (theirs[0], theirs[1], _normalize(theirs[2], _ports(nsqd)))
        ours = (ours[0], ours[1], _normalize(ours[2], _ports(pynsqd)))
        if theirs != ours:
            differ.append(f"{method} {target[:80]}: nsqd {theirs!r:.300} pynsqd {ours!r:.300}")
    assert not differ, "\n".join(differ)


def test_tcp_conversations_are_nsqds(pair):
    nsqd, pynsqd = pair
    differ = []
    for name, chunks in TCP_CASES.items():
        theirs_raw = _converse(nsqd.tcp, chunks)
        theirs = _frames(theirs_raw)
        ours = _frames(_converse(pynsqd.tcp, chunks, expect=theirs_raw.removesuffix(b"<EOF>")))
        if theirs != ours:
            differ.append(f"{name}: nsqd {theirs!r:.300} pynsqd {ours!r:.300}")
    assert not differ, "\n".join(differ)


def _metadata(data_path) -> bytes:
    try:
        return (data_path / "nsqd.dat").read_bytes()
    except FileNotFoundError:
        return b""


def _same_metadata(brokers, steps, expected: bytes) -> None:
    """Apply ``steps`` (HTTP requests) to each broker, then expect ``expected`` as its nsqd.dat."""
    for proc in brokers:
        for method, target, body in steps:
            assert _http(proc.http, method, target, body)[0] == 200
    for proc in brokers:
        deadline = time.monotonic() + 10
        while _metadata(proc.data_path) != expected and time.monotonic() < deadline:
            time.sleep(0.05)  # nsqd rewrites its file after it answers: wait for the file, not a time
        assert _metadata(proc.data_path) == expected, proc.program


def test_the_data_directory_is_nsqds(tmp_path):
    """nsqd.dat, byte for byte, and every file's mode, after the same admin operations."""
    flags = ("--mem-queue-size=0",)  # a publish goes to a queue file at once
    nsqd = BrokerProcess(tmp_path / "nsqd", *flags, program=[str(nsq_bin() / "nsqd")]).start()
    pynsqd = BrokerProcess(tmp_path / "pynsqd", *flags).start()
    brokers = (nsqd, pynsqd)
    try:
        _same_metadata(brokers, [("POST", "/topic/create?topic=solo", None)],
                             b'{"topics":[{"name":"solo","paused":false,"channels":null}],"version":"1.3.0"}')
        _same_metadata(
            brokers,
            [("POST", "/topic/pause?topic=solo", None), ("POST", "/channel/create?topic=solo&channel=c1", None),
             ("POST", "/channel/create?topic=solo&channel=c2%23ephemeral", None),
             ("POST", "/channel/pause?topic=solo&channel=c1", None), ("POST", "/pub?topic=solo", b"on disk")],
            b'{"topics":[{"name":"solo","paused":true,"channels":[{"name":"c1","paused":true}]}],"version":"1.3.0"}')
        for proc in brokers:  # metadata and queue files alike: their owner's only
            modes = {path.name: oct(path.stat().st_mode & 0o777) for path in proc.data_path.iterdir()}
            assert len(modes) > 1 and set(modes.values()) == {"0o600"}, (proc.program, modes)
    finally:
        nsqd.kill()
        pynsqd.kill()


#: Flags both brokers refuse at start, with the same words: nsqd's FATAL line (status 1), or its
#: flag package's line (nsqd: status 2 and its usage; pynsqd: status 1, the line as a FATAL one).
REFUSED_FLAGS = [
    ("--node-id=1024",), ("--max-deflate-level=10",), ("--tls-required=true",), ("--tls-client-auth-policy=require",),
    ("--e2e-processing-latency-percentile=1.5",), ("--tls-cert=missing.pem", "--tls-key=missing.key"),
    ("--tcp-address=127.0.0.1:99999",), ("--http-address=127.0.0.1:-1",), ("--tcp-address=127.0.0.1:nosuchservice",),
    ("--tcp-address=/nonexistent/dir/x.sock",),
    ("--msg-timeout=abc",), ("--msg-timeout=5",), ("--deflate=maybe",), ("--unknown-flag",), ("--mem-queue-size",),
    ("--mem-queue-size=1.5",), ("--tls-required=MAYBE",), ("--log-level=bogus",), ("--tls-min-version=tls9",),
]


def _refusal(program: list[str], data_path, flags: tuple[str, ...]) -> str:
    done = subprocess.run([*program, f"--data-path={data_path}", "--tcp-address=127.0.0.1:0",
                           "--http-address=127.0.0.1:0", *flags], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, cwd=data_path,
                          env={**os.environ, "PYTHONPATH": str(REPO)})  # relative paths are the data path's
    assert done.returncode in (1, 2), (program, flags, done.returncode, done.stderr[-500:])
    lines = done.stderr.splitlines()
    line = next((line for line in lines if " FATAL: " in line), lines[0])  # after the INFO lines of a start
    return re.sub(r"^\[nsqd\] \S+ \S+ FATAL: ", "", line)


@pytest.mark.parametrize("flags", REFUSED_FLAGS, ids=" ".join)
def test_a_refused_start_says_what_nsqd_says(tmp_path, flags):
    (tmp_path / "nsqd").mkdir()
    (tmp_path / "pynsqd").mkdir()
    theirs = _refusal([str(nsq_bin() / "nsqd")], tmp_path / "nsqd", flags)
    ours = _refusal([sys.executable, "-m", "broker"], tmp_path / "pynsqd", flags)
    assert ours == theirs.replace(str(tmp_path / "nsqd"), str(tmp_path / "pynsqd"))
