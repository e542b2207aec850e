"""One request head, read as Go's ``net/http`` server reads it (nsqd 1.3.0 is built with Go 1.19).

:func:`parse_head` takes the request line and header lines of one request and returns a
:class:`ParsedRequest`, or raises :class:`HeadError` with the answer Go's server gives
without calling a handler. The checks and their order are Go's:

1. ``http.readRequest``: the request line is ``METHOD SP TARGET SP HTTP/x.y`` with a token
   for method, exactly ``HTTP/`` and two single digits for the version, a target that
   ``url.ParseRequestURI`` accepts; else ``400``.
2. ``textproto.Reader.ReadMIMEHeader``: a line ends at LF, a CR just before the LF is
   dropped (any other CR is a byte of the line); a line starting with a space or tab
   continues the header before it (joined with one space), but not as the first header
   line; a line without ``:`` is ``400``; a header with an empty name is skipped; spaces and
   tabs around a value are dropped.
3. More than one ``Host``: ``400``.
4. ``readTransfer``: on HTTP/1.1 and later, ``Transfer-Encoding`` must appear once and be
   ``chunked`` (any case; else ``501``), and it overrides ``Content-Length``; on HTTP/1.0 it
   is ignored. ``Content-Length`` headers must agree (``400``), the value must be decimal
   digits within int64 (``400``; empty means none). ``Trailer`` may not name
   ``Transfer-Encoding``, ``Trailer`` or ``Content-Length`` on a chunked request (``400``).
5. The server: a major version other than 1 is ``505`` (except HTTP/2's ``PRI *``
   preface), an HTTP/1.1 request without ``Host`` is ``400 ... missing required Host
   header``, a ``Host`` with a byte ``httpguts.ValidHostHeader`` refuses is ``400 ...
   malformed Host header``, a header name that is not a token or a value with a control
   byte other than tab is ``400 ... invalid header name`` / ``invalid header value``.

An ``Expect`` holding the token ``100-continue`` makes the server send ``100 Continue``
before it reads a body (on HTTP/1.1, when one is announced); any other non-empty
``Expect`` is answered ``417``.
"""

from __future__ import annotations

from broker.gocompat.url import request_uri_error

__all__ = ["HeadError", "ParsedRequest", "parse_head", "request_line_error", "header_line_error"]

_DIGITS = b"0123456789"
_LETTERS = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
#: ``httpguts.IsTokenRune``'s bytes: what a method and a header name are made of.
_TOKEN = _DIGITS + _LETTERS + b"!#$%&'*+-.^_`|~"
#: What ``httpguts.ValidHeaderFieldValue`` lets through: any byte but controls, tab included.
_VALUE = bytes(b for b in range(256) if b >= 0x20 and b != 0x7F) + b"\t"
#: ``httpguts.ValidHostHeader``'s bytes.
_HOST = _DIGITS + _LETTERS + b"!$%&'()*+,-.:;=[]_~"
#: ``textproto.TrimString``'s spaces.
_TRIM = b" \t\r\n"
#: The largest ``Content-Length``: ``strconv.ParseUint(s, 10, 63)``.
_MAX_CONTENT_LENGTH = (1 << 63) - 1
#: Heads, request lines and header lines that passed every check, kept (up to a number,
#: each up to a length) with what they parse to: most clients send the same few again and
#: again, and a head is parsed from its bytes alone.
_HEADS: dict[bytes, dict[str, object]] = {}
_REQUEST_LINES: dict[bytes, tuple[bytes, bytes, bytes, tuple[int, int]]] = {}
_HEADER_LINES: dict[bytes, tuple[bytes, bytes]] = {}
_KEPT = 1024
_HEAD_KEPT_BYTES = 1024
_LINE_KEPT_BYTES = 256
#: The headers that frame a request or decide its answer.
_FRAMING = frozenset((b"host", b"content-length", b"transfer-encoding", b"connection", b"expect", b"trailer"))
_BAD_TRAILER_KEYS = (b"transfer-encoding", b"trailer", b"content-length")
#: The headers ``readTransfer`` takes out before the server checks names and values.
_DROPPED = (b"transfer-encoding",)
_DROPPED_CHUNKED = (b"transfer-encoding", b"content-length", b"trailer")


class HeadError(Exception):
    """A request head the server answers without a handler: Go's status and its ``text``
    (the answer is ``<status> <reason>[: <text>]``, or just ``body`` when given)."""

    def __init__(self, status: int, text: str = "", body: bytes | None = None):
        super().__init__(text or str(status))
        self.status = status
        self.text = text
        self.body = body


class ParsedRequest:
    """One request as it was read: its head, and its body as far as it has arrived.

    ``method`` and ``target`` are the raw bytes of the request line; ``headers`` are
    (lower-case name, value) pairs. ``content_length`` is None for a chunked body.
    ``parts`` holds body bytes not yet taken (``buffered`` of them); ``complete`` is set
    once the body has ended, ``error`` when it cannot be read to its end. How the handler
    read it (``taken``, ``all_taken``, ``cut_short``) is the connection's to keep
    (:mod:`broker.http.connection`).
    """

    # Class-level defaults: a request sets only what it differs in (most set none of them).
    method = b""
    target = b""
    http10 = False
    keep_alive = True
    content_length: int | None = 0
    expect_continue = False  # the client waits for "100 Continue" before it sends the body
    expect_failed = False  # an Expect header Go answers with 417
    buffered = 0
    complete = False
    error: str | None = None
    truncated = False  # the input ended within its Content-Length body
    taken = 0  # bytes of the body the handler read
    all_taken = False  # the handler read all of it
    cut_short = False  # a read of the handler met the input's end within a Content-Length body

    headers: tuple[tuple[bytes, bytes], ...] = ()

    def __init__(self) -> None:
        self.parts: list[bytes] = []


def _version(proto: bytes) -> tuple[int, int] | None:
    """``http.ParseHTTPVersion``: (major, minor) of ``HTTP/x.y``, one digit each."""
    if proto == b"HTTP/1.1":
        return 1, 1
    if proto == b"HTTP/1.0":
        return 1, 0
    if len(proto) != 8 or not proto.startswith(b"HTTP/") or proto[6] != 0x2E:
        return None
    major, minor = proto[5] - 0x30, proto[7] - 0x30
    if not (0 <= major <= 9 and 0 <= minor <= 9):
        return None
    return major, minor


def _request_line(line: bytes) -> tuple[bytes, bytes, bytes, tuple[int, int]]:
    """(method, target, version text, version) of a request line; raises :class:`HeadError`."""
    method, _, rest = line.partition(b" ")
    target, space, proto = rest.partition(b" ")
    version = _version(proto)
    if (not space or version is None or not method or method.translate(None, _TOKEN)
            or request_uri_error(target, method) is not None):
        raise HeadError(400)
    return method, target, proto, version


def request_line_error(line: bytes) -> HeadError | None:
    """What Go answers to a request line (without its LF) as soon as it has it, or None."""
    try:
        _request_line(line.removesuffix(b"\r"))
    except HeadError as error:
        return error
    return None


def header_line_error(line: bytes, first: bool) -> HeadError | None:
    """What Go answers to one header line (without its LF) as soon as it has it, or None:
    a first line that starts with a space or tab, a line that neither continues the one
    before nor holds a ``:``."""
    if line[:1] in (b" ", b"\t"):
        return HeadError(400) if first else None
    if b":" not in line:
        return HeadError(400)
    return None


def _remember(known: dict, text: bytes, parsed: object, max_bytes: int) -> None:
    """Keep ``parsed`` as what ``text`` (up to ``max_bytes``) parses to, forgetting all
    that was kept when ``known`` is full."""
    if len(text) <= max_bytes:
        if len(known) >= _KEPT:
            known.clear()
        known[text] = parsed


def _listed(values: list[bytes], token: bytes) -> bool:
    """``httpguts.HeaderValuesContainsToken``: a comma-separated element of a value equals
    ``token`` (lower case) once spaces and tabs around it are dropped."""
    for value in values:
        for element in value.split(b","):
            if element.strip(b" \t").lower() == token:
                return True
    return False


def _has_token(value: bytes, token: bytes) -> bool:
    """``http.hasToken``: ``token`` (lower case) in ``value``, any case, between boundaries
    (start, end, space, tab or comma)."""
    value = value.lower()
    start = value.find(token)
    while start >= 0:
        end = start + len(token)
        if (start == 0 or value[start - 1] in b" \t,") and (end == len(value) or value[end] in b" \t,"):
            return True
        start = value.find(token, start + 1)
    return False


def _content_length(values: list[bytes] | tuple[()]) -> int:
    """``fixLength`` for a request without chunking: the one length its ``Content-Length``
    headers agree on (0 when none or empty); raises :class:`HeadError` ``400``."""
    if not values:
        return 0
    first = values[0].strip(_TRIM)
    if len(values) == 1 and first.isdigit() and len(first) < 19:  # the usual length, within int64
        return int(first)
    for value in values[1:]:
        if value.strip(_TRIM) != first:
            raise HeadError(400)  # "http: message cannot contain multiple Content-Length headers"
    if not first:
        return 0
    if first.translate(None, _DIGITS) or int(first) > _MAX_CONTENT_LENGTH:
        raise HeadError(400)  # "bad Content-Length"
    return int(first)


def parse_head(head: bytes) -> ParsedRequest:
    """The request whose request line and header lines are ``head``, each line ending in
    LF (a CR before it is dropped), without the blank line that ends the head.

    Raises :class:`HeadError` with Go's answer for a head it refuses.
    """
    fields = _HEADS.get(head)
    if fields is None:
        fields = _read_head(head)
        _remember(_HEADS, head, fields, _HEAD_KEPT_BYTES)
    request = ParsedRequest()
    request.__dict__.update(fields)
    return request


def _read_head(head: bytes) -> dict[str, object]:
    """:func:`parse_head`'s work: the fields of the request (those that differ from
    :class:`ParsedRequest`'s defaults)."""
    lines = head.replace(b"\r\n", b"\n").split(b"\n")
    lines.pop()  # what follows the last LF: nothing
    first = lines[0]
    line_entry = _REQUEST_LINES.get(first)
    if line_entry is None:
        line_entry = _request_line(first)
        _remember(_REQUEST_LINES, first, line_entry, _LINE_KEPT_BYTES)
    method, target, proto, version = line_entry
    fields: dict[str, object] = {"method": method, "target": target}
    headers: list[tuple[bytes, bytes]] = []
    known = _HEADER_LINES
    unchecked = False  # a name or value still to be checked for Go's last refusals
    joined = False  # the last line was a header (not skipped) that a continuation line extends
    for i in range(1, len(lines)):
        line = lines[i]
        entry = known.get(line)
        if entry is not None:
            headers.append(entry)
            joined = True
            continue
        if line[:1] in (b" ", b"\t"):
            if i == 1:
                raise HeadError(400)  # "malformed MIME header initial line"
            if joined:
                key, value = headers[-1]
                headers[-1] = (key, (value + b" " + line.strip(b" \t")).lstrip(b" \t"))
                unchecked = True
            continue
        name, colon, value = line.partition(b":")
        if not colon:
            raise HeadError(400)  # "malformed MIME header line"
        if not name:
            joined = False  # Go skips a header without a name
            continue
        entry = (name.lower(), value.strip(b" \t"))
        if name.translate(None, _TOKEN) or value.translate(None, _VALUE):
            unchecked = True
        else:
            _remember(known, line, entry, _LINE_KEPT_BYTES)
        headers.append(entry)
        joined = True

    # the headers that frame the request, each name's values in order
    framing: dict[bytes, list[bytes]] = {}
    for key, value in headers:
        if key in _FRAMING:
            values = framing.get(key)
            if values is None:
                framing[key] = [value]
            else:
                values.append(value)
    hosts = framing.get(b"host")
    if hosts is not None and len(hosts) > 1:
        raise HeadError(400)  # "too many Host headers"
    connection = framing.get(b"connection")
    if version == (1, 0):
        # the response keeps the connection only if the first Connection header asks for it
        fields["http10"] = True
        if connection is None or not _has_token(connection[0], b"keep-alive"):
            fields["keep_alive"] = False
    elif connection is not None and (_listed(connection, b"close") or _has_token(connection[0], b"close")):
        fields["keep_alive"] = False
    length: int | None
    encodings = framing.get(b"transfer-encoding")
    chunked = encodings is not None and version >= (1, 1)
    if chunked:
        assert encodings is not None
        if len(encodings) != 1 or encodings[0].strip(_TRIM).lower() != b"chunked":
            raise HeadError(501, body=b"Unsupported transfer encoding")
        length = None
        fields["content_length"] = None
        for value in framing.get(b"trailer", ()):
            for element in value.split(b","):
                if element.strip(_TRIM).lower() in _BAD_TRAILER_KEYS:
                    raise HeadError(400)  # "bad trailer key"
    else:
        length = _content_length(framing.get(b"content-length", ()))
        if length:
            fields["content_length"] = length
    # readTransfer takes these out of the headers the server looks at afterwards
    dropped = _DROPPED_CHUNKED if chunked else _DROPPED
    preface = False
    if method == b"PRI" and target == b"*" and version == (2, 0):
        # HTTP/2's connection preface (and no header) is served, then the connection closes
        preface = proto == b"HTTP/2.0" and all(key in dropped for key, _ in headers)
        if preface:
            fields["keep_alive"] = False
    elif version[0] != 1:
        raise HeadError(505, "unsupported protocol version")
    if hosts is None:
        if version >= (1, 1) and not preface and method != b"CONNECT":
            raise HeadError(400, "missing required Host header")
    elif hosts[0].translate(None, _HOST):
        raise HeadError(400, "malformed Host header")
    if unchecked:
        for key, value in headers:
            if key in dropped:
                continue
            if key.translate(None, _TOKEN):
                raise HeadError(400, "invalid header name")
            if value.translate(None, _VALUE):
                raise HeadError(400, "invalid header value")
    expect = framing.get(b"expect")
    if expect is not None:
        if _has_token(expect[0], b"100-continue"):
            if version >= (1, 1) and length != 0:
                fields["expect_continue"] = True
        elif expect[0]:
            fields["expect_failed"] = True
    fields["headers"] = tuple(headers)
    return fields
