"""ServerConnection: every command's success and every error string, in nsqd 1.3.0's order.

Each case is fed whole, byte by byte and in random splits; all three must
give the same events and the same error payload (h11 style).
"""

from __future__ import annotations

import random
import struct

import pytest

from broker.protocol import (
    LINE_TOO_LONG,
    MAGIC_V2,
    Auth,
    Cls,
    Dpub,
    Fin,
    FinRun,
    Identify,
    Limits,
    Mpub,
    Nop,
    ProtocolError,
    Pub,
    Rdy,
    Req,
    ServerConnection,
    State,
    Sub,
    Touch,
    encode_auth,
    encode_cls,
    encode_dpub,
    encode_fin,
    encode_identify,
    encode_mpub,
    encode_nop,
    encode_pub,
    encode_rdy,
    encode_req,
    encode_sub,
    encode_touch,
    finish_identify,
)
from broker.protocol.identify import DECODE_INLINE_BELOW

INIT, SUBSCRIBED, CLOSING = State.INIT, State.SUBSCRIBED, State.CLOSING
ID = b"0123456789abcdef"
SMALL = Limits(max_msg_size=100, max_body_size=1000, max_rdy_count=2500, max_req_timeout_ms=3600000)


def size(n: int) -> bytes:
    return struct.pack(">i", n)


def sized(body: bytes) -> bytes:
    return size(len(body)) + body


def mpub_body(bodies: list[bytes], declared: int | None = None, count: int | None = None) -> bytes:
    payload = b"".join(sized(b) for b in bodies)
    declared = 4 + len(payload) if declared is None else declared
    return size(declared) + size(len(bodies) if count is None else count) + payload


def drain(conn: ServerConnection, events: list) -> None:
    """next_events into ``events`` until it returns nothing (it pauses after IDENTIFY)."""
    while True:
        batch = conn.next_events()
        if not batch:
            return
        events += batch


def splits(data: bytes, mode: str, seed: int = 0) -> list[bytes]:
    if mode == "whole":
        return [data]
    if mode == "bytes":
        return [data[i:i + 1] for i in range(len(data))]
    rng = random.Random(seed)
    chunks, i = [], 0
    while i < len(data):
        n = rng.randint(1, 9)
        chunks.append(data[i:i + n])
        i += n
    return chunks


def feed(data: bytes, mode: str = "whole", *, state: State = INIT, limits: Limits = SMALL, eof: bool = False,
         heartbeats: bool = True, tls: bool = False, magic: bool = True, seed: int = 0, keyed: bool = False,
         prioritised: bool = False):
    """Run ``data`` (after the magic) through a fresh connection; returns (events, error, conn).
    ``keyed``, ``prioritised``: as the server sets a connection up once IDENTIFY asked for keyed
    publishes, for priorities."""
    conn = ServerConnection(limits)
    conn.keyed = keyed
    conn.prioritised = prioritised
    conn.state = state
    conn.heartbeats_enabled = heartbeats
    conn.tls_required = tls
    events: list = []
    stream = (MAGIC_V2 if magic else b"") + data
    try:
        for chunk in splits(stream, mode, seed):
            conn.receive_data(chunk)
            drain(conn, events)
        if eof:
            conn.receive_data(b"")
            drain(conn, events)
    except ProtocolError as exc:
        return events, exc, conn
    return events, None, conn


def check(data: bytes, expected_events: list, expected_error: bytes | None, **kw) -> ServerConnection:
    results = []
    for mode, seed in (("whole", 0), ("bytes", 0), ("random", 1), ("random", 2)):
        events, error, conn = feed(data, mode, seed=seed, **kw)
        results.append((events, None if error is None else error.payload))
        assert error is None or error.fatal
    whole = results[0]
    for other in results[1:]:
        assert other == whole
    assert whole == (expected_events, expected_error)
    return conn


# (id, state, input after the magic, expected events, expected error payload, options)
CASES = [
    # ---------------------------------------------------------------- IDENTIFY
    ("identify", INIT, b"IDENTIFY\n" + sized(b'{"client_id":"a","heartbeat_interval":1000}'),
     [Identify({"client_id": "a", "heartbeat_interval": 1000})], None, {}),
    ("identify-extra-params", INIT, b"IDENTIFY x y\n" + sized(b"{}"), [Identify({})], None, {}),
    ("identify-twice", INIT, b"IDENTIFY\n" + sized(b"{}") + b"IDENTIFY\n" + sized(b"null"),
     [Identify({}), Identify({})], None, {}),
    ("identify-subscribed", SUBSCRIBED, b"IDENTIFY\n" + sized(b"{}"), [], b"E_INVALID cannot IDENTIFY in current state", {}),
    ("identify-closing", CLOSING, b"IDENTIFY\n", [], b"E_INVALID cannot IDENTIFY in current state", {}),
    ("identify-size-0", INIT, b"IDENTIFY\n" + size(0), [], b"E_BAD_BODY IDENTIFY invalid body size 0", {}),
    ("identify-size-negative", INIT, b"IDENTIFY\n\xff\xff\xff\xff", [], b"E_BAD_BODY IDENTIFY invalid body size -1", {}),
    ("identify-too-big", INIT, b"IDENTIFY\n" + size(1001), [], b"E_BAD_BODY IDENTIFY body too big 1001 > 1000", {}),
    ("identify-max-body", INIT, b"IDENTIFY\n" + sized(b"{}" + b" " * 998), [Identify({})], None, {}),
    ("identify-bad-json", INIT, b"IDENTIFY\n" + sized(b"{nope"), [], b"E_BAD_BODY IDENTIFY failed to decode JSON body", {}),
    ("identify-wrong-type", INIT, b"IDENTIFY\n" + sized(b'{"heartbeat_interval":"1"}'), [],
     b"E_BAD_BODY IDENTIFY failed to decode JSON body", {}),
    ("identify-eof-size", INIT, b"IDENTIFY\n", [], b"E_BAD_BODY IDENTIFY failed to read body size", {"eof": True}),
    ("identify-eof-partial-size", INIT, b"IDENTIFY\n\x00\x00", [], b"E_BAD_BODY IDENTIFY failed to read body size",
     {"eof": True}),
    ("identify-eof-body", INIT, b"IDENTIFY\n" + size(10) + b"{}", [], b"E_BAD_BODY IDENTIFY failed to read body",
     {"eof": True}),
    ("identify-tls-required", INIT, b"IDENTIFY\n" + sized(b"{}"), [Identify({})], None, {"tls": True}),
    # ---------------------------------------------------------------- AUTH
    ("auth", INIT, b"AUTH\n" + sized(b"s3cret"), [Auth(b"s3cret")], None, {}),
    ("auth-subscribed", SUBSCRIBED, b"AUTH\n" + sized(b"x"), [], b"E_INVALID cannot AUTH in current state", {}),
    ("auth-params", INIT, b"AUTH x\n" + sized(b"x"), [], b"E_INVALID AUTH invalid number of parameters", {}),
    ("auth-empty-param", INIT, b"AUTH \n", [], b"E_INVALID AUTH invalid number of parameters", {}),
    ("auth-size-0", INIT, b"AUTH\n" + size(0), [], b"E_BAD_BODY AUTH invalid body size 0", {}),
    ("auth-too-big", INIT, b"AUTH\n" + size(1001), [], b"E_BAD_BODY AUTH body too big 1001 > 1000", {}),
    ("auth-eof-size", INIT, b"AUTH\n\x00", [], b"E_BAD_BODY AUTH failed to read body size", {"eof": True}),
    ("auth-eof-body", INIT, b"AUTH\n" + size(3) + b"a", [], b"E_BAD_BODY AUTH failed to read body", {"eof": True}),
    # ---------------------------------------------------------------- SUB
    ("sub", INIT, b"SUB topic chan\n", [Sub("topic", "chan")], None, {}),
    ("sub-crlf", INIT, b"SUB topic chan\r\n", [Sub("topic", "chan")], None, {}),
    ("sub-extra", INIT, b"SUB t c extra params\n", [Sub("t", "c")], None, {}),
    ("sub-ephemeral", INIT, b"SUB t#ephemeral c#ephemeral\n", [Sub("t#ephemeral", "c#ephemeral")], None, {}),
    ("sub-64", INIT, b"SUB " + b"a" * 64 + b" .-_Zz09\n", [Sub("a" * 64, ".-_Zz09")], None, {}),
    ("sub-subscribed", SUBSCRIBED, b"SUB t c\n", [], b"E_INVALID cannot SUB in current state", {}),
    ("sub-closing", CLOSING, b"SUB t c\n", [], b"E_INVALID cannot SUB in current state", {}),
    ("sub-no-heartbeats", INIT, b"SUB\n", [], b"E_INVALID cannot SUB with heartbeats disabled", {"heartbeats": False}),
    ("sub-no-params", INIT, b"SUB\n", [], b"E_INVALID SUB insufficient number of parameters", {}),
    ("sub-one-param", INIT, b"SUB t\n", [], b"E_INVALID SUB insufficient number of parameters", {}),
    ("sub-bad-topic", INIT, b"SUB bad! c\n", [], b'E_BAD_TOPIC SUB topic name "bad!" is not valid', {}),
    ("sub-empty-topic", INIT, b"SUB  c\n", [], b'E_BAD_TOPIC SUB topic name "" is not valid', {}),
    ("sub-long-topic", INIT, b"SUB " + b"a" * 65 + b" c\n", [],
     b'E_BAD_TOPIC SUB topic name "' + b"a" * 65 + b'" is not valid', {}),
    ("sub-colon-topic", INIT, b"SUB t:ephemeral c\n", [], b'E_BAD_TOPIC SUB topic name "t:ephemeral" is not valid', {}),
    ("sub-cr-topic", INIT, b"SUB t\r c\n", [], b'E_BAD_TOPIC SUB topic name "t\\r" is not valid', {}),
    ("sub-bad-channel", INIT, b"SUB t c#ephemeralx\n", [],
     b'E_BAD_CHANNEL SUB channel name "c#ephemeralx" is not valid', {}),
    ("sub-cr-channel", INIT, b"SUB t c\r\r\n", [], b'E_BAD_CHANNEL SUB channel name "c\\r" is not valid', {}),
    ("sub-binary-channel", INIT, b'SUB t \xff"\x00\n', [], b'E_BAD_CHANNEL SUB channel name "\\xff\\"\\x00" is not valid', {}),
    ("sub-topic-checked-first", INIT, b"SUB ! !\n", [], b'E_BAD_TOPIC SUB topic name "!" is not valid', {}),
    # ---------------------------------------------------------------- RDY
    ("rdy", SUBSCRIBED, b"RDY 10\n", [Rdy(10)], None, {}),
    ("rdy-default-1", SUBSCRIBED, b"RDY\n", [Rdy(1)], None, {}),
    ("rdy-empty-is-0", SUBSCRIBED, b"RDY \n", [Rdy(0)], None, {}),
    ("rdy-0", SUBSCRIBED, b"RDY 0\n", [Rdy(0)], None, {}),
    ("rdy-leading-zeros", SUBSCRIBED, b"RDY 0007\n", [Rdy(7)], None, {}),
    ("rdy-max", SUBSCRIBED, b"RDY 2500\n", [Rdy(2500)], None, {}),
    ("rdy-extra", SUBSCRIBED, b"RDY 3 4\n", [Rdy(3)], None, {}),
    ("rdy-over", SUBSCRIBED, b"RDY 2501\n", [], b"E_INVALID RDY count 2501 out of range 0-2500", {}),
    ("rdy-negative", SUBSCRIBED, b"RDY -1\n", [], b"E_INVALID RDY could not parse count -1", {}),
    ("rdy-plus", SUBSCRIBED, b"RDY +1\n", [], b"E_INVALID RDY could not parse count +1", {}),
    ("rdy-junk", SUBSCRIBED, b"RDY 1a\n", [], b"E_INVALID RDY could not parse count 1a", {}),
    ("rdy-unicode-digit", SUBSCRIBED, "RDY \u0661\n".encode(), [], "E_INVALID RDY could not parse count \u0661".encode(), {}),
    ("rdy-uint64-max", SUBSCRIBED, b"RDY 18446744073709551615\n", [],
     b"E_INVALID RDY count -1 out of range 0-2500", {}),
    ("rdy-wraps-to-0", SUBSCRIBED, b"RDY 18446744073709551616\n", [Rdy(0)], None, {}),
    ("rdy-huge-wraps", SUBSCRIBED, b"RDY " + b"9" * 5000 + b"\n", [],
     b"E_INVALID RDY count -1 out of range 0-2500", {}),
    ("rdy-init", INIT, b"RDY 1\n", [], b"E_INVALID cannot RDY in current state", {}),
    ("rdy-closing-ignored", CLOSING, b"RDY 1\nRDY junk\nRDY 99999\nNOP\n", [Nop()], None, {}),
    # ---------------------------------------------------------------- FIN
    ("fin", SUBSCRIBED, b"FIN " + ID + b"\n", [Fin(ID)], None, {}),
    ("fin-closing", CLOSING, b"FIN " + ID + b"\n", [Fin(ID)], None, {}),
    ("fin-crlf", SUBSCRIBED, b"FIN " + ID + b"\r\n", [Fin(ID)], None, {}),
    ("fin-extra", SUBSCRIBED, b"FIN " + ID + b" x\n", [Fin(ID)], None, {}),
    ("fin-not-hex", SUBSCRIBED, b"FIN zzzzzzzzzzzzzzzz\n", [Fin(b"z" * 16)], None, {}),
    ("fin-inner-cr", SUBSCRIBED, b"FIN 0123456789abc\ref\n", [Fin(b"0123456789abc\ref")], None, {}),
    ("fin-run", SUBSCRIBED, b"".join(b"FIN %016x\n" % i for i in range(5)),
     [Fin(b"%016x" % i) for i in range(5)], None, {}),
    ("fin-init", INIT, b"FIN " + ID + b"\n", [], b"E_INVALID cannot FIN in current state", {}),
    ("fin-no-params", SUBSCRIBED, b"FIN\n", [], b"E_INVALID FIN insufficient number of params", {}),
    ("fin-empty-id", SUBSCRIBED, b"FIN \n", [], b"E_INVALID invalid message ID", {}),
    ("fin-short-id", SUBSCRIBED, b"FIN abc\n", [], b"E_INVALID invalid message ID", {}),
    ("fin-long-id", SUBSCRIBED, b"FIN " + ID + b"0\n", [], b"E_INVALID invalid message ID", {}),
    ("fin-space-in-id", SUBSCRIBED, b"FIN 01234567 9abcdef\n", [], b"E_INVALID invalid message ID", {}),
    ("fin-cr-shortens-id", SUBSCRIBED, b"FIN 0123456789abcde\r\n", [], b"E_INVALID invalid message ID", {}),
    ("fin-then-bad", SUBSCRIBED, b"FIN " + ID + b"\nFIN x\n", [Fin(ID)], b"E_INVALID invalid message ID", {}),
    # ---------------------------------------------------------------- REQ
    ("req", SUBSCRIBED, b"REQ " + ID + b" 1000\n", [Req(ID, 1000)], None, {}),
    ("req-closing", CLOSING, b"REQ " + ID + b" 0\n", [Req(ID, 0)], None, {}),
    ("req-empty-timeout", SUBSCRIBED, b"REQ " + ID + b" \n", [Req(ID, 0)], None, {}),
    ("req-clamped", SUBSCRIBED, b"REQ " + ID + b" 3600001\n", [Req(ID, 3600000)], None, {}),
    ("req-clamped-limit", SUBSCRIBED, b"REQ " + ID + b" 120000\n", [Req(ID, 60000)], None,
     {"limits": Limits(max_req_timeout_ms=60000)}),
    ("req-wrap-negative-clamped", SUBSCRIBED, b"REQ " + ID + b" 18446744073709551615\n", [Req(ID, 0)], None, {}),
    ("req-init", INIT, b"REQ " + ID + b" 1\n", [], b"E_INVALID cannot REQ in current state", {}),
    ("req-no-timeout", SUBSCRIBED, b"REQ " + ID + b"\n", [], b"E_INVALID REQ insufficient number of params", {}),
    ("req-bad-id-first", SUBSCRIBED, b"REQ abc x\n", [], b"E_INVALID invalid message ID", {}),
    ("req-bad-timeout", SUBSCRIBED, b"REQ " + ID + b" -1\n", [], b"E_INVALID REQ could not parse timeout -1", {}),
    ("req-float-timeout", SUBSCRIBED, b"REQ " + ID + b" 1.5\n", [], b"E_INVALID REQ could not parse timeout 1.5", {}),
    # ---------------------------------------------------------------- TOUCH
    ("touch", SUBSCRIBED, b"TOUCH " + ID + b"\n", [Touch(ID)], None, {}),
    ("touch-closing", CLOSING, b"TOUCH " + ID + b"\n", [Touch(ID)], None, {}),
    ("touch-init", INIT, b"TOUCH " + ID + b"\n", [], b"E_INVALID cannot TOUCH in current state", {}),
    ("touch-no-params", SUBSCRIBED, b"TOUCH\n", [], b"E_INVALID TOUCH insufficient number of params", {}),
    ("touch-bad-id", SUBSCRIBED, b"TOUCH 123\n", [], b"E_INVALID invalid message ID", {}),
    # ---------------------------------------------------------------- CLS
    ("cls", SUBSCRIBED, b"CLS\n", [Cls()], None, {}),
    ("cls-extra", SUBSCRIBED, b"CLS now\n", [Cls()], None, {}),
    ("cls-init", INIT, b"CLS\n", [], b"E_INVALID cannot CLS in current state", {}),
    ("cls-closing", CLOSING, b"CLS\n", [], b"E_INVALID cannot CLS in current state", {}),
    # ---------------------------------------------------------------- NOP
    ("nop-init", INIT, b"NOP\n", [Nop()], None, {}),
    ("nop-subscribed", SUBSCRIBED, b"NOP\r\n", [Nop()], None, {}),
    ("nop-closing", CLOSING, b"NOP extra\n", [Nop()], None, {}),
    # ---------------------------------------------------------------- PUB
    ("pub", INIT, b"PUB t\n" + sized(b"hello\nworld"), [Pub("t", [b"hello\nworld"])], None, {}),
    ("pub-subscribed", SUBSCRIBED, b"PUB t\n" + sized(b"x"), [Pub("t", [b"x"])], None, {}),
    ("pub-closing", CLOSING, b"PUB t\n" + sized(b"x"), [Pub("t", [b"x"])], None, {}),
    ("pub-max", INIT, b"PUB t\n" + sized(b"m" * 100), [Pub("t", [b"m" * 100])], None, {}),
    ("pub-no-topic", INIT, b"PUB\n", [], b"E_INVALID PUB insufficient number of parameters", {}),
    ("pub-bad-topic", INIT, b"PUB bad!\n" + sized(b"x"), [], b'E_BAD_TOPIC PUB topic name "bad!" is not valid', {}),
    ("pub-size-0", INIT, b"PUB t\n" + size(0), [], b"E_BAD_MESSAGE PUB invalid message body size 0", {}),
    ("pub-size-negative", INIT, b"PUB t\n" + size(-5), [], b"E_BAD_MESSAGE PUB invalid message body size -5", {}),
    ("pub-too-big", INIT, b"PUB t\n" + size(101), [], b"E_BAD_MESSAGE PUB message too big 101 > 100", {}),
    ("pub-eof-size", INIT, b"PUB t\n", [], b"E_BAD_MESSAGE PUB failed to read message body size", {"eof": True}),
    ("pub-eof-body", INIT, b"PUB t\n" + size(5) + b"abc", [], b"E_BAD_MESSAGE PUB failed to read message body",
     {"eof": True}),
    # ---------------------------------------------------------------- DPUB
    ("dpub", INIT, b"DPUB t 1000\n" + sized(b"x"), [Dpub("t", [b"x"], defer_ms=1000)], None, {}),
    ("dpub-empty-timeout", INIT, b"DPUB t \n" + sized(b"x"), [Dpub("t", [b"x"], defer_ms=0)], None, {}),
    ("dpub-max", SUBSCRIBED, b"DPUB t 3600000\n" + sized(b"x"), [Dpub("t", [b"x"], defer_ms=3600000)], None, {}),
    ("dpub-wraps-into-range", INIT, b"DPUB t 18446744073710\n" + sized(b"x"), [Dpub("t", [b"x"], defer_ms=0)], None, {}),
    ("dpub-no-timeout", INIT, b"DPUB t\n", [], b"E_INVALID DPUB insufficient number of parameters", {}),
    ("dpub-bad-topic-first", INIT, b"DPUB t! x\n", [], b'E_BAD_TOPIC DPUB topic name "t!" is not valid', {}),
    ("dpub-bad-timeout", INIT, b"DPUB t x\n", [], b"E_INVALID DPUB could not parse timeout x", {}),
    ("dpub-negative-timeout", INIT, b"DPUB t -1\n", [], b"E_INVALID DPUB could not parse timeout -1", {}),
    ("dpub-out-of-range", INIT, b"DPUB t 3600100\n", [], b"E_INVALID DPUB timeout 3600100 out of range 0-3600000", {}),
    ("dpub-out-of-range-limit", INIT, b"DPUB t 60001\n", [], b"E_INVALID DPUB timeout 60001 out of range 0-60000",
     {"limits": Limits(max_req_timeout_ms=60000)}),
    ("dpub-wraps-negative", INIT, b"DPUB t 18446744073709551615\n", [],
     b"E_INVALID DPUB timeout 18446744073709551615 out of range 0-3600000", {}),
    ("dpub-size-0", INIT, b"DPUB t 1\n" + size(0), [], b"E_BAD_MESSAGE DPUB invalid message body size 0", {}),
    ("dpub-too-big", INIT, b"DPUB t 1\n" + size(101), [], b"E_BAD_MESSAGE DPUB message too big 101 > 100", {}),
    ("dpub-eof-size", INIT, b"DPUB t 1\n", [], b"E_BAD_MESSAGE DPUB failed to read message body size", {"eof": True}),
    ("dpub-eof-body", INIT, b"DPUB t 1\n" + size(2) + b"a", [], b"E_BAD_MESSAGE DPUB failed to read message body",
     {"eof": True}),
    # ---------------------------------------------------------------- MPUB
    ("mpub", INIT, b"MPUB t\n" + mpub_body([b"a", b"bb", b"\n"]), [Mpub("t", [b"a", b"bb", b"\n"])], None, {}),
    ("mpub-closing", CLOSING, b"MPUB t\n" + mpub_body([b"a"]), [Mpub("t", [b"a"])], None, {}),
    ("mpub-max-body", INIT, b"MPUB t\n" + mpub_body([b"m" * 100] * 9 + [b"m" * 56]),
     [Mpub("t", [b"m" * 100] * 9 + [b"m" * 56])], None, {}),
    ("mpub-no-topic", INIT, b"MPUB\n", [], b"E_INVALID MPUB insufficient number of parameters", {}),
    ("mpub-bad-topic", INIT, b"MPUB bad!\n", [], b'E_BAD_TOPIC E_BAD_TOPIC MPUB topic name "bad!" is not valid', {}),
    ("mpub-size-0", INIT, b"MPUB t\n" + size(0), [], b"E_BAD_BODY MPUB invalid body size 0", {}),
    ("mpub-too-big", INIT, b"MPUB t\n" + mpub_body([b"x" * 100] * 11), [], b"E_BAD_BODY MPUB body too big 1148 > 1000", {}),
    ("mpub-count-0", INIT, b"MPUB t\n" + size(8) + size(0), [], b"E_BAD_BODY MPUB invalid message count 0", {}),
    ("mpub-count-negative", INIT, b"MPUB t\n" + size(8) + size(-2), [], b"E_BAD_BODY MPUB invalid message count -2", {}),
    ("mpub-count-over", INIT, b"MPUB t\n" + size(1000) + size(200), [], b"E_BAD_BODY MPUB invalid message count 200", {}),
    ("mpub-empty-message", INIT, b"MPUB t\n" + mpub_body([b"x" * 100] * 5 + [b""]), [],
     b"E_BAD_MESSAGE MPUB invalid message(5) body size 0", {}),
    ("mpub-negative-message", INIT, b"MPUB t\n" + size(20) + size(2) + sized(b"a") + size(-1), [],
     b"E_BAD_MESSAGE MPUB invalid message(1) body size -1", {}),
    ("mpub-message-too-big", INIT, b"MPUB t\n" + mpub_body([b"x" * 101] * 5), [],
     b"E_BAD_MESSAGE MPUB message too big 101 > 100", {}),
    ("mpub-stream-beyond-max-body", INIT, b"MPUB t\n" + size(10) + size(11) + sized(b"x" * 100) * 10, [],
     b"E_BAD_BODY MPUB body too big 1044 > 1000", {}),
    ("mpub-declared-size-does-not-frame", INIT, b"MPUB t\n" + size(100) + size(1) + sized(b"x") + b"NOP\n",
     [Mpub("t", [b"x"]), Nop()], None, {}),
    ("mpub-eof-size", INIT, b"MPUB t\n", [], b"E_BAD_BODY MPUB failed to read body size", {"eof": True}),
    ("mpub-eof-count", INIT, b"MPUB t\n" + size(9) + b"\x00", [], b"E_BAD_BODY MPUB failed to read message count",
     {"eof": True}),
    ("mpub-eof-message-size", INIT, b"MPUB t\n" + size(20) + size(2) + sized(b"a") + b"\x00", [],
     b"E_BAD_MESSAGE MPUB failed to read message(1) body size", {"eof": True}),
    ("mpub-eof-first-message-size", INIT, b"MPUB t\n" + size(20) + size(2), [],
     b"E_BAD_MESSAGE MPUB failed to read message(0) body size", {"eof": True}),
    ("mpub-eof-message-body", INIT, b"MPUB t\n" + size(20) + size(2) + sized(b"a") + size(5) + b"ab", [],
     b"E_BAD_MESSAGE MPUB failed to read message body", {"eof": True}),
    # ---------------------------------------------------------------- unknown commands, lines
    ("invalid-command", INIT, b"ASDF\n", [], b"E_INVALID invalid command ASDF", {}),
    ("empty-line", INIT, b"\n", [], b"E_INVALID invalid command ", {}),
    ("empty-crlf-line", SUBSCRIBED, b"\r\n", [], b"E_INVALID invalid command ", {}),
    ("only-cr-stripped-once", INIT, b"NOP\r\r\n", [], b"E_INVALID invalid command NOP\r", {}),
    ("lowercase", INIT, b"pub t\n", [], b"E_INVALID invalid command pub", {}),
    ("leading-space", INIT, b" NOP\n", [], b"E_INVALID invalid command ", {}),
    ("raw-bytes-echoed", INIT, b"\xff\xfe\x00 x\n", [], b"E_INVALID invalid command \xff\xfe\x00", {}),
    ("good-then-bad", INIT, b"NOP\nNOP\nXX\nNOP\n", [Nop(), Nop()], b"E_INVALID invalid command XX", {}),
    ("partial-line-at-eof", INIT, b"NOP\nSUB t", [Nop()], None, {"eof": True}),
    # ---------------------------------------------------------------- TLS required
    ("tls-sub", INIT, b"SUB t c\n", [], b"E_INVALID cannot SUB in current state (TLS required)", {"tls": True}),
    ("tls-pub-before-body", INIT, b"PUB t\n", [], b"E_INVALID cannot PUB in current state (TLS required)", {"tls": True}),
    ("tls-nop", SUBSCRIBED, b"NOP\n", [], b"E_INVALID cannot NOP in current state (TLS required)", {"tls": True}),
    ("tls-fin", SUBSCRIBED, b"FIN " + ID + b"\n", [], b"E_INVALID cannot FIN in current state (TLS required)",
     {"tls": True}),
    ("tls-unknown", INIT, b"ASDF\n", [], b"E_INVALID cannot ASDF in current state (TLS required)", {"tls": True}),
    ("tls-empty", INIT, b"\n", [], b"E_INVALID cannot  in current state (TLS required)", {"tls": True}),
]


@pytest.mark.parametrize("name,state,data,events,error,options", CASES, ids=[c[0] for c in CASES])
def test_command(name, state, data, events, error, options):
    check(data, events, error, state=state, **options)


def test_every_error_is_sticky():
    conn = ServerConnection(SMALL)
    conn.receive_data(MAGIC_V2 + b"NOP\nBAD\nNOP\n")
    assert conn.next_events() == [Nop()]
    with pytest.raises(ProtocolError) as first:
        conn.next_events()
    with pytest.raises(ProtocolError) as second:
        conn.next_events()
    assert (first.value.code, first.value.payload, first.value.fatal) == (
        second.value.code, second.value.payload, second.value.fatal)
    assert first.value.payload == b"E_INVALID invalid command BAD"


def test_size_errors_need_only_the_size_field():
    # the error is raised with nothing of the body buffered: nothing is waited for
    for data, payload in [
        (b"PUB t\n" + size(1 << 30), b"E_BAD_MESSAGE PUB message too big 1073741824 > 100"),
        (b"DPUB t 5\n" + size(1 << 30), b"E_BAD_MESSAGE DPUB message too big 1073741824 > 100"),
        (b"IDENTIFY\n" + size(1 << 30), b"E_BAD_BODY IDENTIFY body too big 1073741824 > 1000"),
        (b"AUTH\n" + size(1 << 30), b"E_BAD_BODY AUTH body too big 1073741824 > 1000"),
        (b"MPUB t\n" + size(1 << 30), b"E_BAD_BODY MPUB body too big 1073741824 > 1000"),
        (b"MPUB t\n" + size(900) + size(3) + size(1 << 30), b"E_BAD_MESSAGE MPUB message too big 1073741824 > 100"),
    ]:
        conn = ServerConnection(SMALL)
        conn.receive_data(MAGIC_V2 + data)
        with pytest.raises(ProtocolError) as err:
            conn.next_events()
        assert err.value.payload == payload


def test_bodies_wait_for_all_their_bytes():
    conn = ServerConnection(SMALL)
    conn.receive_data(MAGIC_V2 + b"PUB t\n" + size(50))
    for _ in range(49):
        conn.receive_data(b"z")
        assert conn.next_events() == []
    conn.receive_data(b"zNOP\n")
    assert conn.next_events() == [Pub("t", [b"z" * 50]), Nop()]


# ------------------------------------------------------------------ the magic

@pytest.mark.parametrize("mode", ["whole", "bytes"])
@pytest.mark.parametrize("magic", [b"  V1", b"V2  ", b"GET / HTTP/1.1\r\n", b"\x00\x00\x00\x00", b"  v2"])
def test_bad_magic(magic, mode):
    events, error, _ = feed(magic + b"NOP\n", mode, magic=False)
    assert events == []
    assert error.code == "E_BAD_PROTOCOL"
    assert error.payload == b"E_BAD_PROTOCOL"
    assert error.fatal


def test_bad_magic_is_named_for_the_log_as_nsqd_names_it():
    """nsqd logs ``bad protocol magic 'POST'``: an HTTP request sent to the TCP port is recognisable."""
    _, error, _ = feed(b"POST /pub?topic=t HTTP/1.1\r\n", "whole", magic=False)
    assert error.description == "bad protocol magic 'POST'"
    _, error, _ = feed(b"\x00\n\x1bA", "whole", magic=False)
    assert error.description == "bad protocol magic '\\x00\\x0a\\x1bA'"


@pytest.mark.parametrize("mode", ["whole", "bytes"])
def test_magic_then_commands(mode):
    events, error, _ = feed(b"NOP\n", mode)
    assert (events, error) == ([Nop()], None)


def test_short_magic_at_eof_is_silent():
    conn = ServerConnection(SMALL)
    conn.receive_data(b"  V")
    conn.receive_data(b"")
    assert conn.next_events() == []


def test_data_after_eof_is_a_bug():
    conn = ServerConnection(SMALL)
    conn.receive_data(b"")
    with pytest.raises(RuntimeError):
        conn.receive_data(b"x")


# ------------------------------------------------------------------ line length (nsqd's 16 KiB bufio buffer)

def test_default_line_limit_is_nsqd_bufio_size():
    assert Limits().max_line_length == 16384


def test_longest_line_accepted():
    line = b"NOP " + b"x" * (16384 - 5) + b"\n"
    assert len(line) == 16384
    check(line, [Nop()], None, limits=Limits())


def test_line_one_byte_too_long_closes_silently():
    line = b"NOP " + b"x" * (16384 - 4) + b"\n"
    conn = check(line, [], b"", limits=Limits())
    with pytest.raises(ProtocolError) as err:
        conn.next_events()
    assert err.value.code == LINE_TOO_LONG
    assert err.value.payload == b""
    assert err.value.fatal


def test_line_too_long_raised_without_waiting_for_newline():
    conn = ServerConnection(Limits())
    conn.receive_data(MAGIC_V2 + b"x" * 16383)
    assert conn.next_events() == []
    conn.receive_data(b"x")
    with pytest.raises(ProtocolError) as err:
        conn.next_events()
    assert err.value.code == LINE_TOO_LONG


def test_line_limit_applies_to_each_line():
    limits = Limits(max_line_length=8)
    check(b"NOP 123\nNOP 123\n", [Nop(), Nop()], None, limits=limits)
    check(b"NOP 123\nNOP 1234\n", [Nop()], b"", limits=limits)


def test_long_line_trickled_byte_by_byte():
    conn = ServerConnection(Limits())
    conn.receive_data(MAGIC_V2 + b"NOP ")
    for _ in range(16000):
        conn.receive_data(b"x")
        assert conn.next_events() == []
    conn.receive_data(b"\nNOP\n")
    assert conn.next_events() == [Nop(), Nop()]


def test_receive_data_accepts_any_bytes_like():
    conn = ServerConnection(SMALL)
    conn.receive_data(bytearray(MAGIC_V2 + b"NO"))
    conn.receive_data(memoryview(b"P\nNOP"))
    conn.receive_data(b"\n")
    assert conn.next_events() == [Nop(), Nop()]


def test_default_limits_are_nsqd_defaults():
    assert Limits() == Limits(
        max_msg_size=1048576, max_body_size=5242880, max_rdy_count=2500,
        max_req_timeout_ms=3600000, max_line_length=16384,
    )


# ------------------------------------------------------------------ state machine

# nsqd's legality table (reference §1.2): "ok", "error" (cannot X in current state) or "ignored"
LEGALITY = {
    "IDENTIFY": {INIT: "ok", SUBSCRIBED: "error", CLOSING: "error"},
    "AUTH": {INIT: "ok", SUBSCRIBED: "error", CLOSING: "error"},
    "SUB": {INIT: "ok", SUBSCRIBED: "error", CLOSING: "error"},
    "RDY": {INIT: "error", SUBSCRIBED: "ok", CLOSING: "ignored"},
    "FIN": {INIT: "error", SUBSCRIBED: "ok", CLOSING: "ok"},
    "REQ": {INIT: "error", SUBSCRIBED: "ok", CLOSING: "ok"},
    "TOUCH": {INIT: "error", SUBSCRIBED: "ok", CLOSING: "ok"},
    "CLS": {INIT: "error", SUBSCRIBED: "ok", CLOSING: "error"},
    "PUB": {INIT: "ok", SUBSCRIBED: "ok", CLOSING: "ok"},
    "MPUB": {INIT: "ok", SUBSCRIBED: "ok", CLOSING: "ok"},
    "DPUB": {INIT: "ok", SUBSCRIBED: "ok", CLOSING: "ok"},
    "NOP": {INIT: "ok", SUBSCRIBED: "ok", CLOSING: "ok"},
}

VALID = {
    "IDENTIFY": (encode_identify({"user_agent": "t"}), Identify({"user_agent": "t"}), INIT),
    "AUTH": (encode_auth(b"secret"), Auth(b"secret"), INIT),
    "SUB": (encode_sub("t", "c"), Sub("t", "c"), SUBSCRIBED),
    "RDY": (encode_rdy(5), Rdy(5), None),
    "FIN": (encode_fin(ID), Fin(ID), None),
    "REQ": (encode_req(ID, 100), Req(ID, 100), None),
    "TOUCH": (encode_touch(ID), Touch(ID), None),
    "CLS": (encode_cls(), Cls(), CLOSING),
    "PUB": (encode_pub("t", b"m"), Pub("t", [b"m"]), None),
    "MPUB": (encode_mpub("t", [b"m", b"n"]), Mpub("t", [b"m", b"n"]), None),
    "DPUB": (encode_dpub("t", 10, b"m"), Dpub("t", [b"m"], defer_ms=10), None),
    "NOP": (encode_nop(), Nop(), None),
}


@pytest.mark.parametrize("state", [INIT, SUBSCRIBED, CLOSING], ids=lambda s: s.name)
@pytest.mark.parametrize("command", sorted(LEGALITY))
def test_legality(command, state):
    data, event, next_state = VALID[command]
    outcome = LEGALITY[command][state]
    if outcome == "ok":
        conn = check(data, [event], None, state=state)
        assert conn.state == (next_state if next_state is not None else state)
    elif outcome == "ignored":
        conn = check(data, [], None, state=state)
        assert conn.state == state
    else:
        conn = check(data, [], f"E_INVALID cannot {command} in current state".encode(), state=state)
        assert conn.state == state


def test_state_transitions_through_a_session():
    stream = (
        encode_identify({}) + encode_sub("t", "c") + encode_rdy(2) + encode_fin(ID)
        + encode_cls() + encode_rdy(9) + encode_touch(ID) + encode_req(ID, 0) + encode_pub("t", b"x")
    )
    for mode in ("whole", "bytes"):
        events, error, conn = feed(stream, mode)
        assert error is None
        assert events == [Identify({}), Sub("t", "c"), Rdy(2), Fin(ID), Cls(), Touch(ID), Req(ID, 0), Pub("t", [b"x"])]
        assert conn.state == CLOSING


def test_parsing_pauses_after_identify():
    conn = ServerConnection(SMALL)
    conn.receive_data(MAGIC_V2 + encode_identify({"heartbeat_interval": -1}) + encode_sub("t", "c"))
    assert conn.next_events() == [Identify({"heartbeat_interval": -1})]
    # the owner applies the IDENTIFY before the SUB that follows it is checked
    conn.heartbeats_enabled = False
    with pytest.raises(ProtocolError) as err:
        conn.next_events()
    assert err.value.payload == b"E_INVALID cannot SUB with heartbeats disabled"


def test_has_more_says_when_another_call_is_needed_before_more_bytes():
    conn = ServerConnection(SMALL)
    conn.receive_data(MAGIC_V2 + encode_nop() + encode_identify({}) + encode_nop())
    assert conn.next_events() == [Nop(), Identify({})]
    assert conn.has_more  # paused after IDENTIFY
    assert conn.next_events() == [Nop()]
    assert not conn.has_more
    assert conn.next_events() == []
    conn.receive_data(encode_nop() + b"BAD\n")
    assert conn.next_events() == [Nop()]
    assert conn.has_more  # the error comes with the next call
    with pytest.raises(ProtocolError):
        conn.next_events()


def test_a_limit_bounds_the_commands_one_call_parses():
    conn = ServerConnection(SMALL)
    conn.fin_runs = True
    ids = [b"%016d" % i for i in range(5)]
    conn.receive_data(MAGIC_V2 + encode_nop() * 3 + encode_pub("t", b"x") + encode_sub("t", "c")
                      + b"".join(encode_fin(i) for i in ids) + encode_nop())
    assert conn.next_events(2) == [Nop(), Nop()]
    assert conn.has_more
    assert conn.next_events(2) == [Nop(), Pub("t", [b"x"])]
    assert conn.next_events(2) == [Sub("t", "c"), FinRun(ids[:1])]
    assert conn.next_events(3) == [FinRun(ids[1:4])]  # each FIN of a run counts
    assert conn.next_events(3) == [FinRun(ids[4:]), Nop()]
    assert not conn.has_more
    assert conn.next_events(3) == []


def test_each_message_of_an_mpub_counts_against_the_limit():
    # the messages count as they are decoded: a huge MPUB is decoded over many calls,
    # and comes out whole once its last message is
    conn = ServerConnection(SMALL)
    conn.receive_data(MAGIC_V2 + encode_mpub("t", [b"a", b"b", b"c"]) + encode_nop() + encode_nop())
    assert conn.next_events(2) == []
    assert conn.has_more
    assert conn.next_events(2) == [Mpub("t", [b"a", b"b", b"c"]), Nop()]
    assert conn.next_events(2) == [Nop()]
    assert not conn.has_more


def test_an_mpub_decoded_over_many_calls_gives_nsqds_error_for_a_bad_message():
    conn = ServerConnection(SMALL)
    data = encode_mpub("t", [b"a", b"b", b"c"])
    bad = data[:-5] + b"\x00\x00\x00\x00" + data[-1:]  # the last message's size is 0
    conn.receive_data(MAGIC_V2 + bad)
    assert conn.next_events(1) == []
    assert conn.next_events(1) == []
    with pytest.raises(ProtocolError) as err:
        conn.next_events(1)
    assert err.value.payload == b"E_BAD_MESSAGE MPUB invalid message(2) body size 0"


def test_a_limit_that_ends_with_the_input_leaves_nothing_more():
    conn = ServerConnection(SMALL)
    conn.receive_data(MAGIC_V2 + encode_nop() * 2 + b"NO")
    assert conn.next_events(2) == [Nop(), Nop()]
    assert conn.next_events(2) == []
    assert not conn.has_more
    conn.receive_data(b"P\n")
    assert conn.next_events(2) == [Nop()]
    assert not conn.has_more


def test_trailing_data_after_identify_upgrade():
    conn = ServerConnection(SMALL)
    conn.receive_data(MAGIC_V2 + encode_identify({"tls_v1": True}) + b"\x16\x03\x01handshake")
    assert conn.next_events() == [Identify({"tls_v1": True})]
    assert conn.take_trailing_data() == b"\x16\x03\x01handshake"
    assert conn.next_events() == []
    conn.receive_data(encode_nop())
    assert conn.next_events() == [Nop()]


def test_trailing_data_refused_inside_a_body():
    conn = ServerConnection(SMALL)
    conn.receive_data(MAGIC_V2 + b"PUB t\n" + size(4) + b"ab")
    assert conn.next_events() == []
    with pytest.raises(RuntimeError):
        conn.take_trailing_data()


def test_tls_policy_lifted_after_upgrade():
    conn = ServerConnection(SMALL)
    conn.tls_required = True
    conn.receive_data(MAGIC_V2 + encode_identify({"tls_v1": True}))
    assert conn.next_events() == [Identify({"tls_v1": True})]
    conn.tls_required = False
    conn.receive_data(encode_sub("t", "c") + encode_fin(ID))
    assert conn.next_events() == [Sub("t", "c"), Fin(ID)]


# ------------------------------------------------------------------ client encoders round-trip

def test_encoders_round_trip():
    bodies = [bytes([i]) * (i + 1) for i in range(50)]
    identify = {"client_id": "c", "feature_negotiation": True, "sample_rate": 10}
    # (what a client encodes, the event the server reads from it)
    commands = [
        (encode_identify(identify), Identify(identify)),
        (encode_auth(b"\x00secret\n"), Auth(b"\x00secret\n")),
        (encode_pub("topic.a-b_c", b"\x00\xff\n body"), Pub("topic.a-b_c", [b"\x00\xff\n body"])),
        (encode_mpub("t#ephemeral", bodies), Mpub("t#ephemeral", bodies)),
        (encode_dpub("t", 3600000, b"later"), Dpub("t", [b"later"], defer_ms=3600000)),
        (encode_sub("t", "c#ephemeral"), Sub("t", "c#ephemeral")),
        (encode_rdy(2500), Rdy(2500)),
        (encode_fin(ID.decode()), Fin(ID)),
        (encode_req(ID, 0), Req(ID, 0)),
        (encode_touch(ID), Touch(ID)),
        (encode_nop(), Nop()),
        (encode_cls(), Cls()),
    ]
    stream = b"".join(wire for wire, _ in commands)
    check(stream, [event for _, event in commands], None, limits=Limits())


def test_encoder_byte_layout():
    assert encode_sub("t", "c") == b"SUB t c\n"
    assert encode_rdy(10) == b"RDY 10\n"
    assert encode_fin(ID) == b"FIN " + ID + b"\n"
    assert encode_req(ID, 250) == b"REQ " + ID + b" 250\n"
    assert encode_touch(ID) == b"TOUCH " + ID + b"\n"
    assert encode_cls() == b"CLS\n"
    assert encode_nop() == b"NOP\n"
    assert encode_pub("t", b"ab") == b"PUB t\n\x00\x00\x00\x02ab"
    assert encode_dpub("t", 7, b"ab") == b"DPUB t 7\n\x00\x00\x00\x02ab"
    assert encode_auth(b"s") == b"AUTH\n\x00\x00\x00\x01s"
    assert encode_identify({"a": 1}) == b'IDENTIFY\n\x00\x00\x00\x07{"a":1}'
    assert encode_mpub("t", [b"a", b"bc"]) == (
        b"MPUB t\n" + b"\x00\x00\x00\x0f" + b"\x00\x00\x00\x02" + b"\x00\x00\x00\x01a" + b"\x00\x00\x00\x02bc"
    )


@pytest.mark.parametrize("call", [
    lambda: encode_sub("bad topic", "c"),
    lambda: encode_sub("t", "c\n"),
    lambda: encode_pub("", b"x"),
    lambda: encode_fin(b"short"),
    lambda: encode_req("0123456789abcdef0", 1),
])
def test_encoders_refuse_what_would_corrupt_the_stream(call):
    with pytest.raises(ValueError):
        call()


# ------------------------------------------------------------------ throughput sanity (kept small)

def test_many_fins_in_one_chunk_all_parsed():
    lines = b"".join(b"FIN %016x\n" % i for i in range(2000))
    conn = ServerConnection()
    conn.state = SUBSCRIBED
    conn.receive_data(MAGIC_V2 + lines + b"FIN 0123")
    events = conn.next_events()
    assert len(events) == 2000
    assert events[1999] == Fin(b"%016x" % 1999)
    conn.receive_data(b"456789abcdef\n")
    assert conn.next_events() == [Fin(ID)]


def test_fin_runs_come_as_one_event_when_asked():
    conn = ServerConnection()
    conn.state = SUBSCRIBED
    conn.fin_runs = True
    ids = [b"%016x" % i for i in range(5)]
    conn.receive_data(MAGIC_V2 + b"".join(b"FIN " + i + b"\n" for i in ids[:3])
                      + b"FIN " + ids[3] + b"\r\nNOP\nFIN " + ids[4] + b"\nFIN 0123")
    assert conn.next_events() == [FinRun(ids[:3]), Fin(ids[3]), Nop(), FinRun([ids[4]])]
    conn.receive_data(b"456789abcdef\nFIN short\n")
    assert conn.next_events() == [FinRun([ID])]
    with pytest.raises(ProtocolError, match="E_INVALID"):
        conn.next_events()


_RUN_IDS = [b"%016x" % i for i in range(4)]


@pytest.mark.parametrize("bad, events_after, error", [
    (b"FIN " + _RUN_IDS[3] + b"\n", [Fin(_RUN_IDS[3])], None),
    (b"FIN 0123 456789abcde\n", [], b"E_INVALID invalid message ID"),  # a space in the id
    (b"FIN 0123456789abcde\r\n", [], b"E_INVALID invalid message ID"),  # "\r" dropped: 15 bytes
    (b"FIX " + _RUN_IDS[3] + b"\n", [], b"E_INVALID invalid command FIX"),
    (b"FIN " + _RUN_IDS[3][:15] + b"\n\n", [], b"E_INVALID invalid message ID"),  # the newline a byte early
    (b"NOP\nNOP\nNOP\nNOP\nNOP\n", [Nop()] * 5, None),  # as long as a FIN line, not one
])
def test_a_chunk_of_fin_lines_is_read_line_by_line_wherever_one_is_not_a_fin(bad, events_after, error):
    # two good lines, the line under test, two more: whole, each chunk is FIN-line sized
    data = b"".join(b"FIN " + i + b"\n" for i in _RUN_IDS[:2]) + bad + b"".join(
        b"FIN " + i + b"\n" for i in _RUN_IDS[:2])
    expected = [Fin(i) for i in _RUN_IDS[:2]] + events_after + ([] if error else [Fin(i) for i in _RUN_IDS[:2]])
    check(data, expected, error, state=SUBSCRIBED)


def test_large_mpub_in_random_chunks():
    bodies = [b"%05d" % i * 20 for i in range(200)]
    data = encode_mpub("t", bodies)
    events, error, _ = feed(data, "random", seed=7, limits=Limits())
    assert error is None and events == [Mpub("t", bodies)]


# ------------------------------------------------------------------ seeded fuzz: any split, same answer

PIECES = [
    encode_identify({"heartbeat_interval": 1000}), encode_sub("t", "c"), encode_rdy(3), encode_fin(ID),
    encode_req(ID, 5), encode_touch(ID), encode_cls(), encode_nop(), encode_pub("t", b"body"),
    encode_mpub("t", [b"a", b"b"]), encode_dpub("t", 9, b"d"), encode_auth(b"s"),
    b"FIN " + ID + b"\r\n", b"RDY\n", b"\n", b"BAD\n", b"PUB t\n" + size(0), b"MPUB t\n" + size(8) + size(0),
]


@pytest.mark.parametrize("seed", range(60))
def test_fuzz_split_invariance(seed):
    rng = random.Random(seed)
    stream = bytearray(b"".join(rng.choice(PIECES) for _ in range(rng.randint(1, 12))))
    for _ in range(rng.randint(0, 3)):  # a few random mutations
        stream[rng.randrange(len(stream))] = rng.randrange(256)
    limits = Limits(max_msg_size=64, max_body_size=256, max_line_length=40)
    results = set()
    for mode, split_seed in (("whole", 0), ("bytes", 0), ("random", seed), ("random", seed + 1000)):
        events, error, _ = feed(bytes(stream), mode, seed=split_seed, limits=limits, eof=True)
        results.add((repr(events), None if error is None else error.payload))
    assert len(results) == 1


def test_a_large_identify_body_is_left_for_the_owner_to_decode() -> None:
    """Its decoding takes a worker thread (tests/system/test_input_floods.py): the parser hands on the bytes."""
    body = b'{"heartbeat_interval": 2000}' + b" " * DECODE_INLINE_BELOW
    conn = ServerConnection(Limits())
    conn.receive_data(MAGIC_V2 + b"IDENTIFY\n" + sized(body))
    assert conn.next_events() == [Identify(None, body)]
    assert finish_identify(body) == Identify({"heartbeat_interval": 2000})
    with pytest.raises(ProtocolError, match="IDENTIFY failed to decode JSON body"):
        finish_identify(b"[" + body)


def test_command_events_compare_and_print_as_values():
    from broker.protocol.commands import Cls, Fin, Nop, Pub, Touch

    assert Pub("t", [b"x"]) == Pub("t", [b"x"]) and Pub("t", [b"x"]) != Pub("t", [b"y"])
    assert Fin(b"0" * 16) != Touch(b"0" * 16)  # same fields, other command
    assert Nop() == Nop() and Nop() != Cls()
    assert hash(Fin(b"a")) == hash(Fin(b"a")) and hash(Fin(b"a")) != hash(Touch(b"a"))
    assert repr(Pub("t", [b"x"])) == "Pub(topic='t', bodies=[b'x'], keys=None, priorities=None, defer_ms=0)"
    assert repr(Nop()) == "Nop()"


# ---------------------------------------------------------------- keyed MPUB (pynsqd's keyed publishes)

KEYED_CASES = [
    ("keyed", [b"\x01ka", b"\x00plain", b"\x03keyb", b"\x80" + b"k" * 128 + b"x" * 100],
     [Mpub("t", [b"a", b"plain", b"b", b"x" * 100], [b"k", b"", b"key", b"k" * 128])], None),
    ("key-too-long", [b"\x01ka", b"\x81" + b"k" * 129 + b"x"], [], b"E_BAD_MESSAGE MPUB invalid key length 129"),
    ("key-past-the-end", [b"\x05ab"], [], b"E_BAD_MESSAGE MPUB invalid key length 5"),
    ("empty-body", [b"\x01ka", b"\x02kk"], [], b"E_BAD_MESSAGE MPUB invalid message(1) body size 0"),
    ("body-too-big", [b"\x01k" + b"x" * 101], [], b"E_BAD_MESSAGE MPUB message too big 101 > 100"),
    ("message-too-big-with-its-key", [b"\x80" + b"k" * 128 + b"x" * 101], [], b"E_BAD_MESSAGE MPUB message too big "
     b"230 > 229"),
]


@pytest.mark.parametrize("name,messages,events,error", KEYED_CASES, ids=[c[0] for c in KEYED_CASES])
def test_keyed_mpub(name, messages, events, error):
    check(b"MPUB t\n" + mpub_body(messages), events, error, keyed=True, limits=SMALL._replace(max_body_size=2000))


def test_keyed_pub_and_dpub_come_with_their_keys_cut_off():
    body = b"\x80" + b"k" * 128 + b"x" * 100
    check(b"PUB t\n" + sized(body) + b"DPUB t 5\n" + sized(body) + b"PUB t\n" + sized(b"\x00plain"),
          [Pub("t", [b"x" * 100], [b"k" * 128]), Dpub("t", [b"x" * 100], [b"k" * 128], defer_ms=5),
           Pub("t", [b"plain"], [b""])], None, keyed=True)


PRIORITY_CASES = [
    ("pub", b"PUB t\n" + sized(b"\x00\x00\x00\x07job"), [Pub("t", [b"job"], priorities=[7])], None),
    ("dpub", b"DPUB t 5\n" + sized(b"\xff\xff\xff\xffjob"), [Dpub("t", [b"job"], None, [(1 << 32) - 1], 5)], None),
    ("mpub", b"MPUB t\n" + mpub_body([b"\x00\x00\x00\x01a", b"\x00\x00\x00\x02" + b"b" * 100]),
     [Mpub("t", [b"a", b"b" * 100], None, [1, 2])], None),
    ("mpub-body-too-big", b"MPUB t\n" + mpub_body([b"\x00\x00\x00\x01" + b"b" * 101]), [],
     b"E_BAD_MESSAGE MPUB message too big 105 > 104"),  # the message counts its priority, as before
    ("pub-empty-body", b"PUB t\n" + sized(b"\x00\x00\x00\x01"), [], b"E_BAD_MESSAGE PUB invalid message body size 0"),
    ("pub-shorter-than-a-priority", b"PUB t\n" + sized(b"ab"), [],
     b"E_BAD_MESSAGE PUB invalid message size 2 (a priority takes 4 bytes)"),
]


@pytest.mark.parametrize("name,data,events,error", PRIORITY_CASES, ids=[c[0] for c in PRIORITY_CASES])
def test_prioritised_publishes_come_with_their_priorities_cut_off(name, data, events, error):
    check(data, events, error, prioritised=True, limits=SMALL._replace(max_body_size=2000))


def test_keyed_and_prioritised_publishes_come_with_both_cut_off():
    message = b"\x02ky\x00\x00\x00\x09" + b"x" * 100
    check(b"PUB t\n" + sized(message) + b"MPUB t\n" + mpub_body([message, b"\x00\x00\x00\x00\x01z"]),
          [Pub("t", [b"x" * 100], [b"ky"], [9]), Mpub("t", [b"x" * 100, b"z"], [b"ky", b""], [9, 1])], None,
          keyed=True, prioritised=True, limits=SMALL._replace(max_body_size=2000))


def test_a_connection_refused_is_freed_at_once_without_the_cycle_collector():
    """The error a parser keeps (raised again on every call) holds no traceback, whose frames
    would hold the parser and the bytes it was given: refused connections are plain garbage,
    freed when dropped, not cycles waiting for the collector (before: about 60 KB each here,
    until a collection)."""
    import gc
    import tracemalloc

    from broker.protocol.frames import FrameDecoder

    def refuse() -> None:
        conn = ServerConnection()
        conn.receive_data(MAGIC_V2 + b"BOGUS " + b"x" * 60_000 + b"\n")
        decoder = FrameDecoder(16)
        for _ in range(2):
            with pytest.raises(ProtocolError):
                conn.next_events()
            with pytest.raises(ProtocolError):
                decoder.feed(b"\x00\x10\x00\x00" + b"y" * 60_000)

    gc.collect()
    gc.disable()
    tracemalloc.start()
    try:
        refuse()  # warm up what is made once
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(100):
            refuse()
        assert tracemalloc.get_traced_memory()[0] - before < 1_000_000
    finally:
        tracemalloc.stop()
        gc.enable()
