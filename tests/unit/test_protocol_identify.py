"""IDENTIFY bodies decoded as Go's json.Unmarshal into nsqd's identifyDataV2 would."""

from __future__ import annotations

import pytest

from broker.protocol import decode_identify


@pytest.mark.parametrize("body,data", [
    (b"{}", {}),
    (b"null", {}),
    (b" \t\r\n{ } \n", {}),
    (b'{"client_id":"c","hostname":"h","user_agent":"pynsq/0.9.1"}',
     {"client_id": "c", "hostname": "h", "user_agent": "pynsq/0.9.1"}),
    (b'{"heartbeat_interval":-1,"output_buffer_size":-1,"output_buffer_timeout":0,"msg_timeout":60000}',
     {"heartbeat_interval": -1, "output_buffer_size": -1, "output_buffer_timeout": 0, "msg_timeout": 60000}),
    (b'{"feature_negotiation":true,"tls_v1":false,"snappy":true,"deflate":false,"deflate_level":6}',
     {"feature_negotiation": True, "tls_v1": False, "snappy": True, "deflate": False, "deflate_level": 6}),
    (b'{"sample_rate":2147483647}', {"sample_rate": 2147483647}),
    (b'{"sample_rate":-2147483648}', {"sample_rate": -2147483648}),
    (b'{"msg_timeout":9223372036854775807}', {"msg_timeout": 9223372036854775807}),
    (b'{"msg_timeout":-0}', {"msg_timeout": 0}),
    # unknown keys are ignored whatever their type (old clients still send short_id/long_id)
    (b'{"short_id":"a","long_id":"b","x":[1,{"y":null}],"z":1.5e300}', {}),
    (b'{"x":1' + b"0" * 5000 + b'}', {}),
    # keys match case-insensitively, including the two non-ASCII folds of ASCII letters
    (b'{"Heartbeat_Interval":1000,"CLIENT_ID":"x"}', {"heartbeat_interval": 1000, "client_id": "x"}),
    ('{"\u212aey":1,"\u017fnappy":true}'.encode(), {"snappy": True}),
    ('{"\u212a":1,"hostname":"h"}'.encode(), {"hostname": "h"}),
    # null leaves a field as it was; a later duplicate wins
    (b'{"heartbeat_interval":1000,"heartbeat_interval":null}', {"heartbeat_interval": 1000}),
    (b'{"heartbeat_interval":1000,"heartbeat_interval":2000}', {"heartbeat_interval": 2000}),
    (b'{"client_id":null}', {}),
    # invalid UTF-8 in strings becomes U+FFFD, one per bad byte; so does a lone surrogate escape
    (b'{"client_id":"a\xff\xe2\x82b"}', {"client_id": "a\ufffd\ufffd\ufffdb"}),
    (b'{"client_id":"\\ud800x"}', {"client_id": "\ufffdx"}),
    (b'{"client_id":"\\ud83d\\ude00"}', {"client_id": "\U0001f600"}),
])
def test_decodes(body, data):
    assert decode_identify(body) == data


@pytest.mark.parametrize("body", [
    b"",
    b"   ",
    b"{",
    b"{} {}",
    b"[]",
    b"[{}]",
    b'"x"',
    b"1",
    b"true",
    b"NaN",
    b'{"x":NaN}',
    b'{"x":Infinity}',
    b"{'a':1}",
    b'{"a":1,}',
    b"\xef\xbb\xbf{}",  # a byte order mark is not JSON
    b'{"client_id":"a\x01"}',  # control characters must be escaped
    b'{"heartbeat_interval":"1000"}',
    b'{"heartbeat_interval":1000.0}',
    b'{"heartbeat_interval":1e3}',
    b'{"heartbeat_interval":true}',
    b'{"msg_timeout":9223372036854775808}',
    b'{"msg_timeout":-9223372036854775809}',
    b'{"msg_timeout":1' + b"0" * 5000 + b'}',
    b'{"sample_rate":2147483648}',
    b'{"sample_rate":-2147483649}',
    b'{"tls_v1":1}',
    b'{"tls_v1":"true"}',
    b'{"snappy":{}}',
    b'{"client_id":5}',
    b'{"hostname":["h"]}',
    b"\xff{}",
])
def test_rejects(body):
    with pytest.raises(ValueError):
        decode_identify(body)
