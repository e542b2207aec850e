"""Go's ``net`` reading of ``host:port`` addresses, with its errors.

nsqd hands its address flags (``--statsd-address``, ``--lookupd-tcp-address``, the listen
addresses) to ``net.Dial`` and ``net.Listen``, which split them with ``SplitHostPort`` and
resolve the port with ``LookupPort``: a number (``+``/``-`` allowed) that must be 0-65535,
an empty port meaning 0, or else a service name (``http``). Their refusals read
``address 99999: invalid port``, ``address 127.0.0.1: missing port in address``,
``address tcp/nosuch: unknown port``; a dial or listen puts ``dial udp: `` or
``listen tcp: `` before them.

Not re-exported by :mod:`broker.gocompat`: it loads ``socket``, which the wire protocol (a
user of that package) must not.
"""

from __future__ import annotations

import socket

__all__ = ["AddrError", "lookup_port", "split_host_port"]

_MISSING_PORT = "missing port in address"
_TOO_MANY_COLONS = "too many colons in address"
_MAX_PORT = 0xFFFF
#: Go's parsePort stops counting here: a longer number is out of range whatever its digits.
_CUTOFF = 1 << 30


class AddrError(ValueError):
    """Go's ``*net.AddrError``: ``address <addr>: <why>``."""

    def __init__(self, why: str, addr: str):
        super().__init__(f"address {addr}: {why}" if addr else why)


def split_host_port(hostport: str) -> tuple[str, str]:
    """``(host, port)`` as Go's ``net.SplitHostPort`` splits ``hostport`` (``[v6]:port`` loses
    its brackets); raises :class:`AddrError` with Go's words where it refuses it."""
    colon = hostport.rfind(":")
    if colon < 0:
        raise AddrError(_MISSING_PORT, hostport)
    open_from = close_from = 0
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0:
            raise AddrError("missing ']' in address", hostport)
        if end + 1 == len(hostport):
            raise AddrError(_MISSING_PORT, hostport)
        if end + 1 != colon:
            raise AddrError(_TOO_MANY_COLONS if hostport[end + 1] == ":" else _MISSING_PORT, hostport)
        host = hostport[1:end]
        open_from, close_from = 1, end + 1
    else:
        host = hostport[:colon]
        if ":" in host:
            raise AddrError(_TOO_MANY_COLONS, hostport)
    if "[" in hostport[open_from:]:
        raise AddrError("unexpected '[' in address", hostport)
    if "]" in hostport[close_from:]:
        raise AddrError("unexpected ']' in address", hostport)
    return host, hostport[colon + 1:]


def lookup_port(network: str, port: str) -> int:
    """The port number Go's ``LookupPort`` gives ``port`` on ``network`` (``tcp``, ``udp``): a
    number in 0-65535 (empty: 0), or a service name of the system's services database.

    Raises :class:`AddrError`: ``invalid port`` out of range, ``unknown port`` for a name
    the database does not hold."""
    if not port:
        return 0
    digits = port[1:] if port[0] in "+-" else port
    if all("0" <= c <= "9" for c in digits):  # Go reads ASCII digits only; anything else is a name
        number = min(int(digits or "0"), _CUTOFF)
        if port[0] == "-":
            number = -number
        if not 0 <= number <= _MAX_PORT:
            raise AddrError("invalid port", port)
        return number
    try:
        return socket.getservbyname(port, network)
    except (OSError, ValueError):  # ValueError: a NUL in the name
        raise AddrError("unknown port", f"{network}/{port}") from None
