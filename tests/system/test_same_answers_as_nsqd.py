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

Known differences on purpose are in deploy/README.md's "Differences from nsqd on purpose" and are
left out here; so is ``PUT /config/nsqlookupd_tcp_addresses`` with ``null`` (nsqd then shows
``null``, pynsqd ``[]``).
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
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
from tests.support.waiting import wait_sync

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


#: A request every framing case ends with: answered only where the framing before it ended
#: where nsqd's did.
_PING = b"GET /ping HTTP/1.1\r\nHost: h\r\n\r\n"
_CHUNKED = b"Transfer-Encoding: chunked\r\n"


def _pub(extra: bytes, version: bytes = b"1.1") -> bytes:
    """A ``/pub`` to the case's own topic (``{t}``) with the headers ``extra`` and what follows them."""
    return b"POST /pub?topic={t} HTTP/" + version + b"\r\nHost: h\r\n" + extra


def _smuggled(framing: bytes) -> bytes:
    """``framing`` (headers and a body), then a second ``/pub`` to ``{t}_2`` that a server
    reading the first body differently would (or would not) take for a request."""
    return _pub(framing) + b"POST /pub?topic={t}_2 HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nxyz" + _PING


#: Raw requests where a server decides where a request ends (the shapes request smuggling
#: feeds on) and what it refuses: each goes to nsqd and to pynsqd on a connection of its own
#: (``{t}`` is the case's own topic; ending ``<EOF>``: the client then closes its side).
FRAMING_CASES: dict[str, bytes] = {
    # Transfer-Encoding
    "HTTP/1.0 chunked": _pub(_CHUNKED + b"\r\n3\r\nabc\r\n0\r\n\r\n", b"1.0"),
    "HTTP/1.0 chunked, keep-alive": _pub(_CHUNKED + b"Connection: keep-alive\r\n\r\n3\r\nabc\r\n0\r\n\r\n", b"1.0")
    + _PING,
    "HTTP/1.0 chunked with a length": _pub(_CHUNKED + b"Connection: keep-alive\r\nContent-Length: 15\r\n\r\n"
                                           b"3\r\nabc\r\n0\r\n\r\n", b"1.0") + _PING,
    "HTTP/1.0 gzip": _pub(b"Transfer-Encoding: gzip\r\nConnection: keep-alive\r\nContent-Length: 3\r\n\r\nabc",
                          b"1.0") + _PING,
    "chunked": _pub(_CHUNKED + b"\r\n3\r\nabc\r\n0\r\n\r\n") + _PING,
    "ChUnKeD": _pub(b"Transfer-Encoding: ChUnKeD\r\n\r\n3\r\nabc\r\n0\r\n\r\n") + _PING,
    "chunked, tabs around": _pub(b"Transfer-Encoding:\tchunked\t\r\n\r\n3\r\nabc\r\n0\r\n\r\n") + _PING,
    "gzip, chunked": _pub(b"Transfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n") + _PING,
    "chunked, identity": _pub(b"Transfer-Encoding: chunked, identity\r\n\r\n3\r\nabc\r\n0\r\n\r\n") + _PING,
    "identity": _pub(b"Transfer-Encoding: identity\r\nContent-Length: 3\r\n\r\nabc") + _PING,
    "empty Transfer-Encoding": _pub(b"Transfer-Encoding: \r\nContent-Length: 3\r\n\r\nabc") + _PING,
    "chunked twice": _pub(_CHUNKED + _CHUNKED + b"\r\n3\r\nabc\r\n0\r\n\r\n") + _PING,
    "chunked then identity": _pub(_CHUNKED + b"Transfer-Encoding: identity\r\n\r\n3\r\nabc\r\n0\r\n\r\n") + _PING,
    # Content-Length and Transfer-Encoding together, duplicates, odd numbers
    "Content-Length then chunked": _smuggled(b"Content-Length: 4\r\n" + _CHUNKED + b"\r\n0\r\n\r\n"),
    "chunked then Content-Length": _smuggled(_CHUNKED + b"Content-Length: 48\r\n\r\n0\r\n\r\n"),
    "Content-Length twice, equal": _pub(b"Content-Length: 3\r\nContent-Length:  3 \r\n\r\nabc") + _PING,
    "Content-Length twice, different": _pub(b"Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd") + _PING,
    "Content-Length list": _pub(b"Content-Length: 3, 3\r\n\r\nabc") + _PING,
    "Content-Length +3": _pub(b"Content-Length: +3\r\n\r\nabc") + _PING,
    "Content-Length -3": _pub(b"Content-Length: -3\r\n\r\nabc") + _PING,
    "Content-Length in spaces": _pub(b"Content-Length:   3   \r\n\r\nabc") + _PING,
    "Content-Length 003": _pub(b"Content-Length: 003\r\n\r\nabc") + _PING,
    "Content-Length 3 3": _pub(b"Content-Length: 3 3\r\n\r\nabc") + _PING,
    "Content-Length 0x3": _pub(b"Content-Length: 0x3\r\n\r\nabc") + _PING,
    "Content-Length empty": _pub(b"Content-Length: \r\n\r\nabc") + _PING,
    "Content-Length past int64": _pub(b"Content-Length: 99999999999999999999\r\n\r\nabc") + _PING,
    "Content-Length 3_0": _pub(b"Content-Length: 3_0\r\n\r\nabc") + _PING,
    "Content-Length in Arabic digits": _pub(b"Content-Length: \xd9\xa3\r\n\r\nabc") + _PING,
    "Content-Length 0, then a request": _smuggled(b"Content-Length: 0\r\n\r\n"),
    "a body holding a request": _pub(b"Content-Length: %d\r\n\r\n" % len(_PING) + _PING) + _PING,
    "a chunk holding a request": _pub(_CHUNKED + b"\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(_PING), _PING)) + _PING,
    "GET with a body": b"GET /ping HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc" + _PING,
    "GET chunked": b"GET /ping HTTP/1.1\r\nHost: h\r\n" + _CHUNKED + b"\r\n3\r\nabc\r\n0\r\n\r\n" + _PING,
    "Trailer: Content-Length, chunked": _pub(b"Trailer: Content-Length\r\n" + _CHUNKED + b"\r\n3\r\nabc\r\n0\r\n\r\n")
    + _PING,
    "Trailer: Content-Length, not chunked": _pub(b"Trailer: Content-Length\r\nContent-Length: 3\r\n\r\nabc") + _PING,
    # header lines
    "a folded header": _pub(b"X-A: a\r\n b\r\nContent-Length: 3\r\n\r\nabc") + _PING,
    "a folded Content-Length": _pub(b"Content-Length:\r\n 3\r\n\r\nabc") + _PING,
    "a folded Transfer-Encoding": _pub(b"Transfer-Encoding:\r\n\tchunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n") + _PING,
    "a fold as the first header": b"POST /pub?topic={t} HTTP/1.1\r\n X: y\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc"
    + _PING,
    "a fold of spaces only": _pub(b"Content-Length: 3\r\n   \r\n\r\nabc") + _PING,
    "space before the colon": _pub(b"Content-Length : 3\r\n\r\nabc") + _PING,
    "tab before the colon": _pub(b"X-A\t: b\r\nContent-Length: 3\r\n\r\nabc") + _PING,
    "no colon": _pub(b"X-A b\r\nContent-Length: 3\r\n\r\nabc") + _PING,
    "an empty name": _pub(b": b\r\nContent-Length: 3\r\n\r\nabc") + _PING,
    "a name with (": _pub(b"X(A: b\r\nContent-Length: 3\r\n\r\nabc") + _PING,
    "a bad name and a bad length": _pub(b"X A: b\r\nContent-Length: x\r\n\r\nabc") + _PING,
    "NUL in a value": b"GET /ping HTTP/1.1\r\nHost: h\r\nX-A: a\x00b\r\n\r\n" + _PING,
    "DEL in a value": b"GET /ping HTTP/1.1\r\nHost: h\r\nX-A: a\x7fb\r\n\r\n" + _PING,
    "UTF-8 in a value": b"GET /ping HTTP/1.1\r\nHost: h\r\nX-A: \xc3\xa9\r\n\r\n" + _PING,
    "a control byte and no Host": b"GET /ping HTTP/1.1\r\nX-A: a\x01\r\n\r\n" + _PING,
    # line endings
    "bare LF everywhere": (_pub(b"Content-Length: 3\r\n\r\nabc") + _PING).replace(b"\r\n", b"\n"),
    "bare LF after the request line": b"POST /pub?topic={t} HTTP/1.1\nHost: h\r\nContent-Length: 3\r\n\r\nabc" + _PING,
    "bare LF after one header": _pub(b"Content-Length: 3\n\r\nabc") + _PING,
    "bare LF blank line": _pub(b"Content-Length: 3\r\n\nabc") + _PING,
    "bare LF in chunking": (_pub(_CHUNKED + b"\r\n3\r\nabc\r\n0\r\n\r\n")).replace(b"\r\n", b"\n") + _PING,
    "bare LF after a chunk size": _pub(_CHUNKED + b"\r\n3\nabc\r\n0\n\r\n") + _PING,
    "bare LF after chunk data": _pub(_CHUNKED + b"\r\n3\r\nabc\n0\r\n\r\n") + _PING,
    "bare LF after the last chunk": _pub(_CHUNKED + b"\r\n3\r\nabc\r\n0\r\n\n") + _PING,
    "bare CR in the request line": b"POST /pub?topic={t} HTTP/1.1\rHost: h\r\nContent-Length: 3\r\n\r\nabc" + _PING,
    "bare CR in a value": _pub(b"X-A: a\rb\r\nContent-Length: 3\r\n\r\nabc") + _PING,
    "bare CR ending a header": _pub(b"X-A: a\rContent-Length: 3\r\n\r\nabc") + _PING,
    "CR CR LF": _pub(b"Content-Length: 3\r\r\n\r\nabc") + _PING,
    "a blank line first": b"\r\n" + _PING + _PING,
    "CR LF after a POST": _pub(b"Content-Length: 3\r\n\r\nabc\r\n") + _PING,
    "four CR LF bytes after a POST": _pub(b"Content-Length: 3\r\n\r\nabc\r\n\r\n") + _PING,
    "five CR LF bytes after a POST": _pub(b"Content-Length: 3\r\n\r\nabc\r\n\r\n\n") + _PING,
    "LF after a POST": _pub(b"Content-Length: 3\r\n\r\nabc\n") + _PING,
    "CR LF after a GET": _PING + b"\r\n" + _PING,
    # chunking
    "a chunk extension": _pub(_CHUNKED + b"\r\n3;a=b\r\nabc\r\n0;x\r\n\r\n") + _PING,
    "a quoted chunk extension": _pub(_CHUNKED + b'\r\n3;a="b\r\n"\r\nabc\r\n0\r\n\r\n') + _PING,
    "space before a chunk extension": _pub(_CHUNKED + b"\r\n3 ;a=b\r\nabc\r\n0\r\n\r\n") + _PING,
    "space before a chunk size": _pub(_CHUNKED + b"\r\n 3\r\nabc\r\n0\r\n\r\n") + _PING,
    "space after a chunk size": _pub(_CHUNKED + b"\r\n3 \r\nabc\r\n0\r\n\r\n") + _PING,
    "tab after a chunk size": _pub(_CHUNKED + b"\r\n3\t\r\nabc\r\n0\r\n\r\n") + _PING,
    "chunk size 0x3": _pub(_CHUNKED + b"\r\n0x3\r\nabc\r\n0\r\n\r\n") + _PING,
    "chunk size +3": _pub(_CHUNKED + b"\r\n+3\r\nabc\r\n0\r\n\r\n") + _PING,
    "chunk size of 16 digits": _pub(_CHUNKED + b"\r\n0000000000000003\r\nabc\r\n0\r\n\r\n") + _PING,
    "chunk size of 17 digits": _pub(_CHUNKED + b"\r\n00000000000000003\r\nabc\r\n0\r\n\r\n") + _PING,
    "chunk size past uint64": _pub(_CHUNKED + b"\r\n10000000000000003\r\nabc\r\n0\r\n\r\n") + _PING,
    "chunk size 2^64-1": _pub(_CHUNKED + b"\r\nffffffffffffffff\r\nabc\r\n0\r\n\r\n") + _PING,
    "no chunk size": _pub(_CHUNKED + b"\r\n\r\nabc\r\n0\r\n\r\n") + _PING,
    "chunk size in capitals": _pub(_CHUNKED + b"\r\nA\r\n0123456789\r\n0\r\n\r\n") + _PING,
    "last chunk 00": _pub(_CHUNKED + b"\r\n3\r\nabc\r\n00\r\n\r\n") + _PING,
    "chunk data too long": _pub(_CHUNKED + b"\r\n3\r\nabcX\r\n0\r\n\r\n") + _PING,
    "a trailer": _pub(_CHUNKED + b"\r\n3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n") + _PING,
    "a bad trailer": _pub(_CHUNKED + b"\r\n3\r\nabc\r\n0\r\nnot a header\r\n\r\n") + _PING,
    "no CR LF after the last chunk": _pub(_CHUNKED + b"\r\n3\r\nabc\r\n0\r\n") + _PING,
    "no CR LF after the last chunk, then EOF": _pub(_CHUNKED + b"\r\n3\r\nabc\r\n0\r\n") + b"<EOF>",
    "a chunk size line of 4095 bytes": _pub(_CHUNKED + b"\r\n3;" + b"x" * 4091 + b"\r\nabc\r\n0\r\n\r\n") + _PING,
    "a chunk size line of 4096 bytes": _pub(_CHUNKED + b"\r\n3;" + b"x" * 4092 + b"\r\nabc\r\n0\r\n\r\n") + _PING,
    "a trailer ending at 4096 bytes": _pub(_CHUNKED + b"\r\n3\r\nabc\r\n0\r\nX-T: " + b"x" * 4087 + b"\r\n\r\n")
    + _PING,
    "a trailer ending at 4097 bytes": _pub(_CHUNKED + b"\r\n3\r\nabc\r\n0\r\nX-T: " + b"x" * 4088 + b"\r\n\r\n")
    + _PING,
    "last chunk, then a request": _smuggled(_CHUNKED + b"Content-Length: 42\r\n\r\n0\r\n\r\n"),
    # heads: size, Host, version, target
    "a header line of 1 MiB + 3000": b"GET /ping HTTP/1.1\r\nHost: h\r\nX-Big: " + b"a" * ((1 << 20) + 3000)
    + b"\r\n\r\n" + _PING,
    "a header line of 1 MiB + 5000": b"GET /ping HTTP/1.1\r\nHost: h\r\nX-Big: " + b"a" * ((1 << 20) + 5000)
    + b"\r\n\r\n" + _PING,
    "a request line of 1 MiB + 5000": b"GET /ping?" + b"a" * ((1 << 20) + 5000) + b" HTTP/1.1\r\nHost: h\r\n\r\n",
    "HTTP/1.1 without Host": b"GET /ping HTTP/1.1\r\n\r\n" + _PING,
    "HTTP/1.0 without Host": b"GET /ping HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" + _PING,
    "an empty Host": b"GET /ping HTTP/1.1\r\nHost:\r\n\r\n" + _PING,
    "two Hosts": b"GET /ping HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n" + _PING,
    "Host a/b": b"GET /ping HTTP/1.1\r\nHost: a/b\r\n\r\n" + _PING,
    "Host a@b": b"GET /ping HTTP/1.1\r\nHost: a@b\r\n\r\n" + _PING,
    "Host in UTF-8": b"GET /ping HTTP/1.1\r\nHost: \xc3\xa9\r\n\r\n" + _PING,
    "absolute form": b"GET http://other/ping HTTP/1.1\r\nHost: h\r\n\r\n" + _PING,
    "absolute form without Host": b"GET http://other/ping HTTP/1.1\r\n\r\n" + _PING,
    "absolute form, port and query": b"GET https://other:1/ping?x=1 HTTP/1.1\r\nHost: h\r\n\r\n" + _PING,
    "absolute form /pub": b"POST http://x/pub?topic={t} HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc" + _PING,
    "absolute form, bad port": b"GET http://h:x/ping HTTP/1.1\r\nHost: h\r\n\r\n" + _PING,
    "a target without /": b"GET ping HTTP/1.1\r\nHost: h\r\n\r\n" + _PING,
    "a target starting with :": b"GET :/ping HTTP/1.1\r\nHost: h\r\n\r\n" + _PING,
    "a bad escape": b"GET /pi%zzng HTTP/1.1\r\nHost: h\r\n\r\n" + _PING,
    "a bad escape in the query": b"GET /ping?%zz HTTP/1.1\r\nHost: h\r\n\r\n" + _PING,
    "UTF-8 in the target": b"GET /ping\xff HTTP/1.1\r\nHost: h\r\n\r\n" + _PING,
    "a control byte in the target": b"GET /pi\x01ng HTTP/1.1\r\nHost: h\r\n\r\n" + _PING,
    "OPTIONS *": b"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n" + _PING,
    "GET *": b"GET * HTTP/1.1\r\nHost: h\r\n\r\n" + _PING,
    "CONNECT": b"CONNECT h:80 HTTP/1.1\r\nHost: h:80\r\n\r\n" + _PING,
    "HTTP/2 preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _PING,
    "PRI * with a Host": b"PRI * HTTP/2.0\r\nHost: h\r\n\r\nSM\r\n\r\n" + _PING,
    "HTTP/0.9": b"GET /ping HTTP/0.9\r\nHost: h\r\n\r\n" + _PING,
    "HTTP/1.2": b"GET /ping HTTP/1.2\r\nHost: h\r\n\r\n" + _PING,
    "HTTP/1.10": b"GET /ping HTTP/1.10\r\nHost: h\r\n\r\n" + _PING,
    "HTTP/3.0": b"GET /ping HTTP/3.0\r\nHost: h\r\n\r\n" + _PING,
    "http/1.1": b"GET /ping http/1.1\r\nHost: h\r\n\r\n" + _PING,
    "two spaces": b"GET  /ping HTTP/1.1\r\nHost: h\r\n\r\n" + _PING,
    "a space in the target": b"GET /ping x HTTP/1.1\r\nHost: h\r\n\r\n" + _PING,
    "tabs for spaces": b"GET\t/ping\tHTTP/1.1\r\nHost: h\r\n\r\n" + _PING,
    "a lower-case method": b"get /ping HTTP/1.1\r\nHost: h\r\n\r\n" + _PING,
    "an unknown method": b"FOO /ping HTTP/1.1\r\nHost: h\r\n\r\n" + _PING,
    "a method with (": b"G(T /ping HTTP/1.1\r\nHost: h\r\n\r\n" + _PING,
    "HEAD with a body": b"HEAD /ping HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc" + _PING,
    "HEAD chunked": b"HEAD /ping HTTP/1.1\r\nHost: h\r\n" + _CHUNKED + b"\r\n0\r\n\r\n" + _PING,
    # Connection, Expect, Upgrade
    "Connection: close": b"GET /ping HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n" + _PING,
    "Connection: keep-alive, close": b"GET /ping HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, close\r\n\r\n" + _PING,
    "a second Connection: CLOSE": b"GET /ping HTTP/1.1\r\nHost: h\r\nConnection: a\r\nConnection: x, CLOSE\r\n\r\n"
    + _PING,
    "HTTP/1.0 close, keep-alive": b"GET /ping HTTP/1.0\r\nConnection: close, keep-alive\r\n\r\n" + _PING,
    "HTTP/1.0 keep-alive second": b"GET /ping HTTP/1.0\r\nConnection: a\r\nConnection: Keep-Alive\r\n\r\n" + _PING,
    "Expect: 100-continue": _pub(b"Expect: 100-continue\r\nContent-Length: 3\r\n\r\nabc") + _PING,
    "Expect: a, 100-Continue": _pub(b"Expect: a, 100-Continue\r\nContent-Length: 3\r\n\r\nabc") + _PING,
    "Expect: (empty)": _pub(b"Expect:\r\nContent-Length: 3\r\n\r\nabc") + _PING,
    "Expect: 100-continue, HTTP/1.0": _pub(b"Expect: 100-continue\r\nConnection: keep-alive\r\nContent-Length: 3"
                                           b"\r\n\r\nabc", b"1.0") + _PING,
    "Upgrade: websocket": b"GET /ping HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n" + _PING,
    "Upgrade: h2c": b"GET /ping HTTP/1.1\r\nHost: h\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
    b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n" + _PING,
    # the end of input
    "EOF in the request line": b"GET /pi<EOF>",
    "EOF after the request line": b"GET /ping HTTP/1.1\r\n<EOF>",
    "EOF in the headers": b"GET /ping HTTP/1.1\r\nHost: h\r\n<EOF>",
    "EOF after a request": _PING + b"<EOF>",
    "EOF after CR LF after a GET": _PING + b"\r\n<EOF>",
    "EOF after CR LF after a POST": _pub(b"Content-Length: 3\r\n\r\nabc\r\n<EOF>"),
    "EOF in a body": _pub(b"Content-Length: 5\r\n\r\nab<EOF>"),
    "EOF in a chunk": _pub(_CHUNKED + b"\r\n3\r\nab<EOF>"),
}


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


def _converse(address: tuple[str, int], chunks: list[bytes], expect: bytes | None = None, *,
              half_close: bool = False) -> bytes:
    """What the broker sends back to ``chunks`` (then the end of input, with
    ``half_close``), ending ``<EOF>`` if it closes.

    Without ``expect`` (nsqd's side), until it is quiet for half a second; with it, until as
    many bytes as ``expect`` came (or the end), then quiet for a moment: a busy machine
    makes the second broker slower, never shorter.
    """
    with socket.create_connection(address, timeout=10) as sock:
        try:
            for chunk in chunks:
                sock.sendall(chunk)
                time.sleep(0.02)  # separate writes, as a client sends them
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before it had all (a head over the limit): its answer is read below
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


_RESPONSE_START = re.compile(rb"HTTP/1\.[01] \d{3} ")
_COMPARED_HEADERS = (b"content-type", b"connection", b"transfer-encoding")


def _answers(raw: bytes) -> list[tuple[bytes, tuple[bytes, ...], bytes]]:
    """The responses in ``raw``, each as (status line, the headers that matter, body); the
    order of headers, ``Date`` and ``Content-Length`` (present or not) are left out."""
    answers = []
    starts = [match.start() for match in _RESPONSE_START.finditer(raw)] + [len(raw)]
    for start, end in zip(starts, starts[1:]):
        head, _, body = raw[start:end].partition(b"\r\n\r\n")
        status, *lines = head.split(b"\r\n")
        headers = tuple(sorted(line.lower() for line in lines if line.partition(b":")[0].lower() in _COMPARED_HEADERS))
        answers.append((status, headers, body))
    return answers


def _topics(address: tuple[str, int], prefix: str) -> dict[str, tuple[int, int]]:
    """(messages, bytes) published to each topic whose name starts with ``prefix``."""
    status, _, body = _http(address, "GET", "/stats?format=json&include_clients=false", None)
    assert status == 200
    return {topic["topic_name"]: (topic["message_count"], topic["message_bytes"])
            for topic in json.loads(body)["topics"] or [] if topic["topic_name"].startswith(prefix)}


def _framing_answers(proc: BrokerProcess, data: bytes, expect: bytes | None) -> bytes:
    return _converse(proc.http, [data.removesuffix(b"<EOF>")], expect, half_close=data.endswith(b"<EOF>"))


def test_requests_end_where_nsqd_ends_them(pair):
    """Each framing case gets the same answers (status line, Content-Type, Connection, body),
    in the same number, with the connection left open or closed alike, and publishes the
    same messages: a request hidden in another's body (or a body taken for a request) for
    one server is so for the other."""
    nsqd, pynsqd = pair

    def one(index: int, name: str) -> str | None:
        data = FRAMING_CASES[name].replace(b"{t}", b"framing%d" % index)
        theirs = _framing_answers(nsqd, data, None)
        ours = _framing_answers(pynsqd, data, theirs.removesuffix(b"<EOF>"))
        compared = [(_answers(raw.removesuffix(b"<EOF>")), raw.endswith(b"<EOF>")) for raw in (theirs, ours)]
        if compared[0] != compared[1]:
            return f"{name}: nsqd {theirs[:400]!r} pynsqd {ours[:400]!r}"
        return None

    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # each case waits for quiet on its own connection
        differ = [found for found in pool.map(one, range(len(FRAMING_CASES)), FRAMING_CASES) if found]
    published = [_topics(proc.http, "framing") for proc in pair]
    assert published[0], "the cases published nothing: the comparison of what they published would be empty"
    if published[0] != published[1]:
        differ.append(f"published: nsqd {published[0]} pynsqd {published[1]}")
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
        # nsqd rewrites its file after it answers: wait for the file, not a time
        wait_sync(lambda proc=proc: _metadata(proc.data_path) == expected, 10, report=lambda proc=proc: str(proc.program))


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
