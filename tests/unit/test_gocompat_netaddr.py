"""Go's ``net.SplitHostPort`` and ``LookupPort``, table-driven with Go's own cases and words."""

from __future__ import annotations

import pytest

from broker.gocompat.netaddr import AddrError, lookup_port, split_host_port


@pytest.mark.parametrize(("hostport", "parts"), [
    ("localhost:http", ("localhost", "http")), ("localhost:80", ("localhost", "80")),
    ("[::1]:80", ("::1", "80")), ("[fe80::1%lo0]:80", ("fe80::1%lo0", "80")), (":80", ("", "80")),
    ("host:", ("host", "")), ("[]:80", ("", "80")), ("127.0.0.1:99999", ("127.0.0.1", "99999")),
])
def test_split_host_port(hostport, parts):
    assert split_host_port(hostport) == parts


@pytest.mark.parametrize(("hostport", "error"), [
    ("golang.org", "address golang.org: missing port in address"),
    ("127.0.0.1", "address 127.0.0.1: missing port in address"),
    ("[::1]", "address [::1]: missing port in address"),
    ("[fe80::1]80", "address [fe80::1]80: missing port in address"),
    ("::1:80", "address ::1:80: too many colons in address"),
    ("[::1]:80:90", "address [::1]:80:90: too many colons in address"),
    ("[foo:bar]baz:80", "address [foo:bar]baz:80: missing port in address"),
    ("[fe80::1:80", "address [fe80::1:80: missing ']' in address"),
    ("fe80::1]:80", "address fe80::1]:80: too many colons in address"),
    ("[[::1]:80", "address [[::1]:80: unexpected '[' in address"),
    ("[[::1]]:80", "address [[::1]]:80: missing port in address"),
    ("host]:80", "address host]:80: unexpected ']' in address"),
    ("ho[st:80", "address ho[st:80: unexpected '[' in address"),
])
def test_split_host_port_refuses_in_gos_words(hostport, error):
    with pytest.raises(AddrError) as refused:
        split_host_port(hostport)
    assert str(refused.value) == error


@pytest.mark.parametrize(("port", "number"), [
    ("", 0), ("0", 0), ("80", 80), ("+80", 80), ("-0", 0), ("065535", 65535), ("65535", 65535),
])
def test_lookup_port_numbers(port, number):
    assert lookup_port("udp", port) == number


@pytest.mark.parametrize(("port", "error"), [
    ("65536", "address 65536: invalid port"), ("-1", "address -1: invalid port"),
    ("99999999999999999999", "address 99999999999999999999: invalid port"),
    ("no-such-service", "address tcp/no-such-service: unknown port"),
    ("8O", "address tcp/8O: unknown port"),  # a letter among the digits: a name
    ("８０", "address tcp/８０: unknown port"),  # Go reads ASCII digits only
])
def test_lookup_port_refuses_in_gos_words(port, error):
    with pytest.raises(AddrError) as refused:
        lookup_port("tcp", port)
    assert str(refused.value) == error
