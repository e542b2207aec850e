"""Hostile input at every entry point that parses it gets nsqd's clear error, never a traceback."""

from __future__ import annotations

import json
import logging
import struct
from functools import partial
from pathlib import Path

import pytest
import trio

from broker.lookup.peer import PeerInfo
from broker.lookup.topic_channels import LookupHTTPError, get_topic_channels
from broker.server.auth import AuthError, parse_state
from broker.storage.metadata import load
from tests.support.http_client import request
from tests.support.logs import no_traceback_logged
from tests.support.v2client import connect

DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize("body", [DEEP, b"[" * 9000 + b"]" * 9000, b'["a", [[["b"]]]]', b"[NaN]", b'{"a": 1}',
                                  b'["a"', b"[1e999]"], ids=["deep", "nsqd-depth", "nested", "nan", "object",
                                                            "cut", "huge-number"])
async def test_config_put_of_hostile_json_is_invalid_value(daemon, caplog: pytest.LogCaptureFixture,
                                                           body: bytes) -> None:
    with trio.fail_after(20):
        reply = await request(daemon.addresses.http, "PUT", "/config/nsqlookupd_tcp_addresses", body)
    assert (reply.status, reply.body) == (400, b'{"message":"INVALID_VALUE"}')
    assert daemon.broker.options.nsqlookupd_tcp_addresses == ()
    no_traceback_logged(caplog)


async def test_config_put_reads_invalid_utf8_and_lone_surrogates_as_nsqd_does(daemon) -> None:
    with trio.fail_after(10):
        reply = await request(daemon.addresses.http, "PUT", "/config/nsqlookupd_tcp_addresses",
                              b'["h\xff:4160", "\\ud800x:4160"]')
    # nsqd 1.3.0 answers the same: Go reads both as U+FFFD
    assert (reply.status, json.loads(reply.body)) == (200, ["h\ufffd:4160", "\ufffdx:4160"])


async def test_identify_of_hostile_json_is_bad_body(daemon, caplog: pytest.LogCaptureFixture) -> None:
    with trio.fail_after(20):
        for body in (DEEP, b'{"heartbeat_interval": NaN}', b"\xff\xfe{"):
            client = await connect(daemon.addresses.tcp)
            await client.send(b"IDENTIFY\n" + struct.pack(">i", len(body)) + body)
            await client.expect_error(b"E_BAD_BODY IDENTIFY failed to decode JSON body")
        client = await connect(daemon.addresses.tcp)  # the broker still serves
        await client.identify(client_id="after")
    no_traceback_logged(caplog)


@pytest.mark.parametrize("target, body, status, message", [
    ("/pub?topic=t&defer=99999999999999999999", b"x", 400, "INVALID_DEFER"),
    ("/pub?topic=%ff", b"x", 400, "INVALID_TOPIC"),
    ("/pub?topic=t%00", b"x", 400, "INVALID_TOPIC"),
    ("/mpub?topic=t&binary=true", b"\x00\x00\x00\x05", 413, "BAD_MESSAGE"),
    ("/mpub?topic=t&binary=true", b"\xff\xff\xff\xff\x00\x00\x00\x01a", 413, "BAD_BODY"),
    ("/mpub?topic=t&binary=true", b"\x00\x00\x00\x01\x7f\xff\xff\xffa", 413, "BAD_MESSAGE"),
    ("/topic/create?topic=t;%0d%0a", None, 400, "INVALID_REQUEST"),
])
async def test_hostile_publish_queries_and_bodies(daemon, caplog: pytest.LogCaptureFixture, target: str,
                                                  body: bytes | None, status: int, message: str) -> None:
    # answers checked against nsqd 1.3.0 with the same requests
    with trio.fail_after(10):
        reply = await request(daemon.addresses.http, "POST", target, body)
    assert (reply.status, reply.json()) == (status, {"message": message})
    no_traceback_logged(caplog)


HUGE = "9" * 5000  # more digits than Python's int() reads


@pytest.mark.parametrize("target, message", [
    ("/channel/kick?topic=t&channel=c&n=99999999999999999999", "INVALID_N"),
    ("/channel/kick?topic=t&channel=c&n=9223372036854775808", "INVALID_N"),  # int64's greatest + 1
    ("/channel/delete_buried?topic=t&channel=c&n=99999999999999999999", "INVALID_N"),
    (f"/channel/delete_buried?topic=t&channel=c&n={HUGE}", "INVALID_N"),
    ("/channel/max_attempts?topic=t&channel=c&value=" + "9" * 400, "INVALID_VALUE"),
    (f"/channel/max_attempts?topic=t&channel=c&value={HUGE}", "INVALID_VALUE"),
    ("/channel/max_attempts?topic=t&channel=c&value=65536", "INVALID_VALUE"),  # more than a frame's attempts
], ids=["kick", "kick-int64", "delete", "delete-huge", "max-attempts", "max-attempts-huge", "max-attempts-uint16"])
async def test_numbers_out_of_range_are_refused_and_not_stored(daemon, tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture,
                                                                target: str, message: str) -> None:
    with trio.fail_after(10):
        await request(daemon.addresses.http, "POST", "/topic/create?topic=t")
        await request(daemon.addresses.http, "POST", "/channel/create?topic=t&channel=c")
        reply = await request(daemon.addresses.http, "POST", target)
        await request(daemon.addresses.http, "POST", "/channel/pause?topic=t&channel=c")  # writes nsqd.dat at once
    assert (reply.status, reply.body) == (400, b'{"message":"%s"}' % message.encode())
    saved = json.loads((tmp_path / "data" / "nsqd.dat").read_bytes())
    assert saved["topics"] == [{"channels": [{"name": "c", "paused": True}], "name": "t", "paused": False}]
    assert daemon.broker.topics["t"].channels["c"].max_attempts is None
    no_traceback_logged(caplog)


@pytest.mark.parametrize("method, target, body, reply", [
    ("GET", f"/channel/peek?topic=t&channel=c&n={HUGE}", None, b'{"message":"INVALID_N"}'),
    ("GET", "/channel/peek?topic=t&channel=c&n=" + "0" * 5000 + "1", None, None),
    ("POST", "/channel/kick?topic=t&channel=c&n=9223372036854775807", None, b'{"kicked":0}'),
    ("POST", "/channel/max_attempts?topic=t&channel=c&value=" + "0" * 5000 + "65535", None,
     b'{"max_attempts":65535}'),
    ("POST", "/pub?topic=t&defer=" + "0" * 5000 + "1", b"x", b"OK"),  # nsqd 1.3.0: OK (Go reads any zeros)
], ids=["peek-huge", "peek-zeros", "kick-int64", "max-attempts-zeros", "defer-zeros"])
async def test_numbers_in_range_are_read_whatever_their_length(daemon, caplog: pytest.LogCaptureFixture,
                                                               method: str, target: str, body: bytes | None,
                                                               reply: bytes | None) -> None:
    with trio.fail_after(10):
        await request(daemon.addresses.http, "POST", "/topic/create?topic=t")
        await request(daemon.addresses.http, "POST", "/channel/create?topic=t&channel=c")
        answer = await request(daemon.addresses.http, method, target, body)
    assert answer.status == (400 if reply is not None and b"INVALID" in reply else 200), answer
    if reply is not None:
        assert answer.body == reply
    no_traceback_logged(caplog)


async def test_max_attempts_out_of_range_in_nsqd_dat_is_ignored(start_daemon, tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "nsqd.dat").write_text(json.dumps({"topics": [{"name": "t", "paused": False, "channels": [
        {"name": "huge", "paused": False, "max_attempts": int("9" * 400)},
        {"name": "most", "paused": False, "max_attempts": 65535},
        {"name": "float", "paused": False, "max_attempts": 1e999},
    ]}], "version": "1.3.0"}).replace("Infinity", "1e999"))
    caplog.set_level(logging.WARNING, "pynsqd")
    async with start_daemon() as daemon:
        channels = daemon.broker.topics["t"].channels
        assert (channels["huge"].max_attempts, channels["most"].max_attempts, channels["float"].max_attempts) == (
            None, 65535, None)
        saved = json.loads((data / "nsqd.dat").read_text())["topics"][0]["channels"]
        assert {c["name"]: c.get("max_attempts") for c in saved} == {"huge": None, "most": 65535, "float": None}
    assert "ignoring max_attempts of channel t:huge in nsqd.dat - not a count from 0 to 65535" in caplog.text
    no_traceback_logged(caplog)


@pytest.mark.parametrize("doc, error", [
    (b'{"topics": [1]}', "json: cannot unmarshal number into Go struct field Metadata.topics of type "
                         "nsqd.TopicMetadata"),
    (b'{"topics": [{"name": "a", "channels": [1]}]}', "json: cannot unmarshal number into Go struct field "
                                                      "TopicMetadata.topics.channels of type nsqd.ChannelMetadata"),
    (b'{"topics": [{"name": 5}]}', "json: cannot unmarshal number into Go struct field TopicMetadata.topics.name "
                                   "of type string"),
    (b'{"topics": [{"name": "a", "channels": [{"name": []}]}]}', "json: cannot unmarshal array into Go struct "
                                                                 "field ChannelMetadata.topics.channels.name of type string"),
    (b'{"topics": [{"name": "t", "paused": "yes"}]}', "json: cannot unmarshal string into Go struct field "
                                                      "TopicMetadata.topics.paused of type bool"),
    (b"[]", "json: cannot unmarshal array into Go value of type nsqd.Metadata"),
    (b'{"topics": {"a": 1}}', "json: cannot unmarshal object into Go struct field Metadata.topics of type "
                              "[]nsqd.TopicMetadata"),
    (b'{"Topics": [{"NAME": 5}]}', "json: cannot unmarshal number into Go struct field TopicMetadata.topics.name "
                                   "of type string"),
    (DEEP, "invalid character '[' exceeded max depth"),
    (b"[" * 5000 + b"]" * 5000, "JSON nested too deeply"),  # nsqd: cannot unmarshal array (Python decodes less deep)
    (b"\xff\xff", "invalid character '\xff' looking for beginning of value"),
    (b'{"topics": [{"name": "a"}] x', "invalid character 'x' after object key:value pair"),
], ids=["entry", "channels", "name", "channel-name", "paused", "array", "topics", "case", "deep", "deeper-than-python",
        "not-utf8", "syntax"])
def test_hostile_metadata_file_is_a_clear_error(tmp_path: Path, doc: bytes, error: str) -> None:
    # the messages are nsqd 1.3.0's for the same files (but "deeper-than-python")
    (tmp_path / "nsqd.dat").write_bytes(doc)
    with pytest.raises(ValueError) as info:
        load(tmp_path)
    assert str(info.value) == f"failed to parse metadata in {tmp_path / 'nsqd.dat'} - {error}"


@pytest.mark.parametrize("doc, topics", [
    (b"null", []), (b"{}", []), (b'{"topics": null, "version": null, "other": 5.5e99}', []),
    (b'{"Topics": [{"NAME": "orders", "Channels": [{"name": "b", "max_attempts": 3}], "extra": {}}]}',
     [{"name": "orders", "paused": False, "channels": [{"name": "b", "paused": False, "max_attempts": 3}]}]),
    (b'{"topics": [{"name": ""}, null, {"name": "bad name!"}]}', []),
], ids=["null", "empty", "null-topics", "other-case", "invalid-names"])
def test_metadata_file_nsqd_reads_is_read(tmp_path: Path, doc: bytes, topics: list) -> None:
    # nsqd 1.3.0 starts on each of these (it ignores unknown keys, matches keys ignoring case,
    # and skips invalid names with a warning)
    (tmp_path / "nsqd.dat").write_bytes(doc)
    assert load(tmp_path) == topics


def test_auth_server_answer_of_hostile_json_is_an_auth_error() -> None:
    for body in (DEEP, b"[NaN]", b"\xff{"):
        with pytest.raises(AuthError, match="^invalid JSON - "):
            parse_state(body, 0.0)


def test_auth_server_ttl_past_int64_is_an_auth_error() -> None:
    """Go's decoder refuses a ttl that does not fit an int; one that does is kept, however long."""
    for ttl in (b"1" + b"0" * 400, b"9223372036854775808", b"-9223372036854775809"):
        with pytest.raises(AuthError, match="^json: cannot unmarshal number .* of type int$"):
            parse_state(b'{"ttl": %s, "authorizations": []}' % ttl, 0.0)
    assert parse_state(b'{"ttl": 9223372036854775807}', 5.0).expires == 5.0 + 9223372036854775807


@pytest.mark.parametrize(("permission", "kind"), [(b'["publish"]', "array"), (b'{"a": 1}', "object"), (b"5", "number")])
def test_auth_server_permission_of_another_type_is_an_auth_error(permission: bytes, kind: str) -> None:
    """nsqd 1.3.0's words, measured; a list or an object was a TypeError that closed the connection."""
    body = b'{"ttl": 60, "authorizations": [{"topic": ".*", "channels": [".*"], "permissions": [%s]}]}' % permission
    with pytest.raises(AuthError) as raised:
        parse_state(body, 0.0)
    assert str(raised.value) == (f"json: cannot unmarshal {kind} into Go struct field "
                                 "Authorization.authorizations.permissions of type string")


def test_auth_server_answer_keys_match_ignoring_case() -> None:
    """As Go's decoder matches them: nsqd 1.3.0 grants this answer (pynsqd read its ttl as 0)."""
    state = parse_state(b'{"TTL": 60, "Identity": "me", "AUTHORIZATIONS": [{"Topic": "^t$", "CHANNELS": [".*"], '
                        b'"Permissions": ["publish"]}]}', 5.0)
    assert (state.identity, state.expires) == ("me", 65.0)
    assert state.allows("t", "") and not state.allows("t", "c") and not state.allows("u", "")


def test_lookupd_identify_answer_of_hostile_json_is_a_value_error() -> None:
    for body in (DEEP, b'{"tcp_port": NaN}', b"\xff{"):
        with pytest.raises(ValueError):
            PeerInfo.parse(body)


async def test_lookupd_channels_answer_of_hostile_json_is_a_lookup_error() -> None:
    """A lookupd whose ``/channels`` answer nests 100,000 arrays: a clear error, not a RecursionError."""

    async def lookupd(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(DEEP) + DEEP)
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, lookupd, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        with trio.fail_after(10), pytest.raises(LookupHTTPError, match="bad answer from"):
            await get_topic_channels(f"127.0.0.1:{port}", "t", 2, 5)
        nursery.cancel_scope.cancel()
