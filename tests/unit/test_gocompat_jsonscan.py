"""Go's JSON syntax errors, word for word: each expected message is what nsqd 1.3.0 printed for
an ``nsqd.dat`` holding the same bytes (``failed to parse metadata in <path> - <message>``)."""

from __future__ import annotations

import pytest

from broker.gocompat.jsonscan import syntax_error

NSQD_SAYS = [
    (b'', 'unexpected end of JSON input'),
    (b'  \n', 'unexpected end of JSON input'),
    (b'{', 'unexpected end of JSON input'),
    (b'[1,', 'unexpected end of JSON input'),
    (b'[1,]', "invalid character ']' looking for beginning of value"),
    (b'{}x', "invalid character 'x' after top-level value"),
    (b'1 2', "invalid character '2' after top-level value"),
    (b'1.', "invalid character ' ' after decimal point in numeric literal"),
    (b'1.a', "invalid character 'a' after decimal point in numeric literal"),
    (b'-a', "invalid character 'a' in numeric literal"),
    (b'01', "invalid character '1' after top-level value"),
    (b'1e+', "invalid character ' ' in exponent of numeric literal"),
    (b'1ex', "invalid character 'x' in exponent of numeric literal"),
    (b'-01', "invalid character '1' after top-level value"),
    (b'0.1e-', "invalid character ' ' in exponent of numeric literal"),
    (b'trux', "invalid character 'x' in literal true (expecting 'e')"),
    (b'fals', "invalid character ' ' in literal false (expecting 'e')"),
    (b'nulx', "invalid character 'x' in literal null (expecting 'l')"),
    (b'"abc', 'unexpected end of JSON input'),
    (b'"a\x01"', "invalid character '\\x01' in string literal"),
    (b'"\\x"', "invalid character 'x' in string escape code"),
    (b'"\\u12g4"', "invalid character 'g' in \\u hexadecimal character escape"),
    (b'{"a" 1}', "invalid character '1' after object key"),
    (b'{"a":1 "b"}', 'invalid character \'"\' after object key:value pair'),
    (b'{1:2}', "invalid character '1' looking for beginning of object key string"),
    (b'[1 2]', "invalid character '2' after array element"),
    (b'{]', "invalid character ']' looking for beginning of object key string"),
    (b'[}', "invalid character '}' looking for beginning of value"),
    (b'\xff', "invalid character 'ÿ' looking for beginning of value"),
    (b'\x80', "invalid character '\\u0080' looking for beginning of value"),
    (b'\xa0', "invalid character '\\u00a0' looking for beginning of value"),
    (b'\xad', "invalid character '\\u00ad' looking for beginning of value"),
    (b'\x7f', "invalid character '\\x7f' looking for beginning of value"),
    (b'\x00', "invalid character '\\x00' looking for beginning of value"),
    (b'\x1b', "invalid character '\\x1b' looking for beginning of value"),
    (b'\x08', "invalid character '\\b' looking for beginning of value"),
    (b'\x0b', "invalid character '\\v' looking for beginning of value"),
    (b"'", "invalid character '\\'' looking for beginning of value"),
    (b'"', 'unexpected end of JSON input'),
    (b'\\', "invalid character '\\\\' looking for beginning of value"),
    (b'\xef\xbb\xbf{}', "invalid character 'ï' looking for beginning of value"),
    (b'{"topics":[{"name":"t","pa', 'unexpected end of JSON input'),
    (b"[" * 10001, "invalid character '[' exceeded max depth"),
]
_INSIDE = [(d, m) for d, m in NSQD_SAYS if m != "unexpected end of JSON input"]


@pytest.mark.parametrize("data, message", NSQD_SAYS, ids=[repr(d[:12]) for d, _ in NSQD_SAYS])
def test_invalid_json_gets_gos_message(data: bytes, message: str) -> None:
    assert syntax_error(data) == message


@pytest.mark.parametrize("data", [b"{}", b' {"topics": [{"name": "t", "paused": false, "channels": []}]} ',
                                  b"null", b"-0.5e+10", b'"\\u00ff\\n\xff"', b"[" * 10000 + b"]" * 10000,
                                  b'{"a": [true, false, null, 1, "x", {}]}'])
def test_valid_json_has_no_error(data: bytes) -> None:
    assert syntax_error(data) is None


@pytest.mark.parametrize("data, message", _INSIDE, ids=[repr(d[:12]) for d, _ in _INSIDE])
def test_the_start_of_a_document_reports_the_errors_inside_it(data: bytes, message: str) -> None:
    # what the first bytes of a damaged file show is reported without reading the rest
    assert syntax_error(data + b" ", complete=False) == message
    assert syntax_error(b'{"topics": [{"na', complete=False) is None
