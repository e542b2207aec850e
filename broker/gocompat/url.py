"""``net/url``'s ``ParseRequestURI``: which request targets Go's HTTP server accepts.

Go reads the target of a request line with ``url.ParseRequestURI`` and answers
``400 Bad Request`` when it fails. :func:`request_uri_error` says why it would fail, in
Go's words, or None when Go accepts the target. Accepted are ``*``, an origin-form path
(``/a/b?q``), an absolute URL (``http://host:port/path?q``, or a scheme with an opaque
rest, ``mailto:x``) and, for ``CONNECT``, an authority (``host:port``). Refused are control
bytes anywhere, an empty target, a path without a leading ``/`` and no scheme, a bad
``%`` escape in the path, and an authority whose host, port or user information Go's
``parseAuthority`` refuses. The query is never checked.
"""

from __future__ import annotations

__all__ = ["request_uri_error"]

_HEX = b"0123456789abcdefABCDEF"
_LETTERS = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_ALNUM = _LETTERS + b"0123456789"
#: Bytes below 0x20 and DEL: ``stringContainsCTLByte``.
_NOT_CTL = bytes(b for b in range(256) if b >= 0x20 and b != 0x7F)
#: What ``shouldEscape(c, encodeHost)`` lets through unescaped (bytes >= 0x80 are never checked).
_HOST_BYTES = _ALNUM + b"-_.~!$&'()*+,;=:[]<>\"" + bytes(range(0x80, 0x100))
#: ``validUserinfo``'s bytes (ASCII only: a multi-byte rune is refused).
_USERINFO_BYTES = _ALNUM + b"-._:~!$&'()*+,;=%@"


def _escape_error(text: bytes, host: bool) -> str | None:
    """``unescape``'s complaint about ``text``: a ``%`` not followed by two hex digits; in a
    host also an escaped ASCII byte (other than ``%25``) or a byte that must be escaped."""
    i = text.find(b"%")
    while i >= 0:
        code = text[i + 1:i + 3]
        if len(code) < 2 or code[0] not in _HEX or code[1] not in _HEX:
            return f"invalid URL escape {text[i:i + 3].decode('latin-1')!r}"
        if host and code[0] < ord(b"8") and code != b"25":
            return f"invalid URL escape {text[i:i + 3].decode('latin-1')!r}"
        i = text.find(b"%", i + 3)
    if host:
        bad = text.translate(None, _HOST_BYTES + b"%")
        if bad:
            return f"invalid character {bad[:1].decode('latin-1')!r} in host name"
    return None


def _port_error(port: bytes) -> str | None:
    """``validOptionalPort``: empty, or ``:`` and any number of digits."""
    if not port or (port[:1] == b":" and not port[1:].translate(None, b"0123456789")):
        return None
    return f"invalid port {port.decode('latin-1')!r} after host"


def _zone_error(zone: bytes) -> str | None:
    """``unescape(zone, encodeZone)``: an escape may stand for a space or any byte a host
    may hold as it is (``%25`` included)."""
    i = zone.find(b"%")
    while i >= 0:
        code = zone[i + 1:i + 3]
        if len(code) < 2 or code[0] not in _HEX or code[1] not in _HEX:
            return f"invalid URL escape {zone[i:i + 3].decode('latin-1')!r}"
        byte = int(code, 16)
        if code != b"25" and byte != 0x20 and byte < 0x80 and byte not in _HOST_BYTES:
            return f"invalid URL escape {zone[i:i + 3].decode('latin-1')!r}"
        i = zone.find(b"%", i + 3)
    bad = zone.translate(None, _HOST_BYTES + b"%")
    if bad:
        return f"invalid character {bad[:1].decode('latin-1')!r} in host name"
    return None


def _host_error(host: bytes) -> str | None:
    """``parseHost``: a bracketed IP literal (with an optional ``%25`` zone) or a name, then
    an optional port."""
    if host.startswith(b"["):
        end = host.rfind(b"]")
        if end < 0:
            return "missing ']' in host"
        zone = host.find(b"%25", 0, end)
        if zone < 0:
            return _port_error(host[end + 1:]) or _escape_error(host[:end + 1], True)
        return (_port_error(host[end + 1:]) or _escape_error(host[:zone], True) or _zone_error(host[zone:end])
                or _escape_error(host[end:end + 1], True))
    colon = host.rfind(b":")
    if colon >= 0:
        error = _port_error(host[colon:])
        if error:
            return error
    return _escape_error(host, True)


def _authority_error(authority: bytes) -> str | None:
    """``parseAuthority``: ``[userinfo@]host``."""
    at = authority.rfind(b"@")
    if at < 0:
        return _host_error(authority)
    error = _host_error(authority[at + 1:])
    if error:
        return error
    userinfo = authority[:at]
    if userinfo.translate(None, _USERINFO_BYTES):
        return "net/url: invalid userinfo"
    return _escape_error(userinfo, False)


def _scheme(raw: bytes) -> tuple[bytes, bytes] | None:
    """``getScheme``: (scheme, rest), the scheme empty when there is none; None when the
    target starts with ``:``."""
    for i, c in enumerate(raw):
        if c in _LETTERS:
            continue
        if c in b"0123456789+-.":
            if i == 0:
                return b"", raw
            continue
        if c == ord(b":"):
            if i == 0:
                return None
            return raw[:i], raw[i + 1:]
        return b"", raw
    return b"", raw


def request_uri_error(target: bytes, method: bytes = b"GET") -> str | None:
    """Why ``url.ParseRequestURI`` refuses the request target ``target`` (as the server
    passes it for ``method``), or None when it accepts it."""
    if target.translate(None, _NOT_CTL):
        return "net/url: invalid control character in URL"
    if target[:1] == b"/":  # the usual target: a path, perhaps a query
        path = target.partition(b"?")[0]
        return _escape_error(path, False) if b"%" in path else None
    if method == b"CONNECT" and not target.startswith(b"/"):
        target = b"http://" + target
    if not target:
        return "empty url"
    if target == b"*":
        return None
    split = _scheme(target)
    if split is None:
        return "missing protocol scheme"
    scheme, rest = split
    rest = rest.partition(b"?")[0]
    if not rest.startswith(b"/"):
        return None if scheme else "invalid URI for request"
    if scheme and rest.startswith(b"//"):
        authority, slash, path = rest[2:].partition(b"/")
        error = _authority_error(authority)
        if error:
            return error
        rest = slash + path
    return _escape_error(rest, False)
