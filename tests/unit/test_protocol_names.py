"""Name validity (nsqd's internal/protocol/names.go) and Go's %q quoting of bad names."""

from __future__ import annotations

import pytest

from broker.protocol import go_quote, is_ephemeral, is_valid_name


@pytest.mark.parametrize("name,valid", [
    ("a", True),
    ("test", True),
    (".-_azAZ09", True),
    ("a" * 64, True),
    ("a" * 65, False),
    ("a" * 54 + "#ephemeral", True),
    ("a" * 55 + "#ephemeral", False),  # the suffix counts towards the 64
    ("t#ephemeral", True),
    ("#ephemeral", False),
    ("t#ephemeral#ephemeral", False),
    ("t#Ephemeral", False),
    ("t:ephemeral", False),
    ("", False),
    ("a b", False),
    ("a\n", False),  # Go's "$" does not match before a trailing newline
    ("é", False),
    ("a/b", False),
    ("a*", False),
])
def test_is_valid_name(name, valid):
    assert is_valid_name(name) is valid
    assert is_valid_name(name.encode("utf-8")) is valid


def test_is_ephemeral():
    assert is_ephemeral("t#ephemeral")
    assert not is_ephemeral("t")
    assert not is_ephemeral("t#ephemeralx")


# Outputs of Go's strconv.Quote (fmt %q on a string)
@pytest.mark.parametrize("raw,quoted", [
    (b"", b'""'),
    (b"bad!", b'"bad!"'),
    (b" ", b'" "'),
    (b'a"b', b'"a\\"b"'),
    (b"a\\b", b'"a\\\\b"'),
    (b"\x00", b'"\\x00"'),
    (b"\x07\x08\x0c\n\r\t\x0b", b'"\\a\\b\\f\\n\\r\\t\\v"'),
    (b"\x1b", b'"\\x1b"'),
    (b"\x7f", b'"\\x7f"'),
    (b"\xff", b'"\\xff"'),
    (b"\xe2\x82", b'"\\xe2\\x82"'),
    (b"\xe2\x82z", b'"\\xe2\\x82z"'),
    (b"\xed\xa0\x80", b'"\\xed\\xa0\\x80"'),  # an encoded surrogate is invalid UTF-8
    (b"\xc0\xaf", b'"\\xc0\\xaf"'),  # overlong encoding
    ("é日本".encode(), '"é日本"'.encode()),
    ("\u00a0".encode(), b'"\\u00a0"'),  # no-break space is not printable for Go
    ("\u0085".encode(), b'"\\u0085"'),
    ("\u00ad".encode(), b'"\\u00ad"'),  # soft hyphen (Cf)
    ("\u2028".encode(), b'"\\u2028"'),
    ("\ufeff".encode(), b'"\\ufeff"'),
    ("\ufffd".encode(), '"\ufffd"'.encode()),
    ("\U0001f600".encode(), '"\U0001f600"'.encode()),
    ("\U000e0001".encode(), b'"\\U000e0001"'),
])
def test_go_quote(raw, quoted):
    assert go_quote(raw) == quoted
