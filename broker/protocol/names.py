"""Topic and channel names: the validity rule and Go's quoting of bad names.

nsqd (``internal/protocol/names.go``) accepts ``^[.a-zA-Z0-9_-]+(#ephemeral)?$``
with a length of 1 to 64 bytes, for topics and channels alike. Error messages
quote a rejected name with Go's ``%q`` (``strconv.Quote``), which
:func:`go_quote` reproduces byte for byte.
"""

from __future__ import annotations

import re

__all__ = ["is_valid_name", "is_ephemeral", "go_quote", "EPHEMERAL_SUFFIX", "MAX_NAME_LENGTH"]

EPHEMERAL_SUFFIX = "#ephemeral"
MAX_NAME_LENGTH = 64

# fullmatch, not "$": Go's "$" (without (?m)) only matches at the very end,
# while Python's would also accept a name followed by one "\n".
_NAME_BYTES = re.compile(rb"[.a-zA-Z0-9_-]+(?:#ephemeral)?")
_NAME_STR = re.compile(r"[.a-zA-Z0-9_-]+(?:#ephemeral)?", re.ASCII)


def is_valid_name(name: str | bytes) -> bool:
    """True if ``name`` is a valid topic or channel name (nsqd's rule)."""
    if isinstance(name, str):
        return 1 <= len(name) <= MAX_NAME_LENGTH and _NAME_STR.fullmatch(name) is not None
    return 1 <= len(name) <= MAX_NAME_LENGTH and _NAME_BYTES.fullmatch(name) is not None


def is_ephemeral(name: str) -> bool:
    """True if the topic or channel ``name`` ends in ``#ephemeral``."""
    return name.endswith(EPHEMERAL_SUFFIX)


# Printable ASCII without '"' and '\\' is copied as is; anything else needs the rune walk.
_PLAIN = re.compile(rb'[ !#-\[\]-~]*')
_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def go_quote(raw: bytes) -> bytes:
    """Format ``raw`` (a Go string's bytes) as Go's ``%q`` does, UTF-8 encoded.

    Invalid UTF-8 bytes become ``\\xNN``; ``"`` and ``\\`` are backslashed;
    printable runes (Go's ``strconv.IsPrint``: letters, marks, numbers,
    punctuation, symbols and U+0020 -- the same classes as ``str.isprintable``)
    are kept; other runes use ``\\a``-style, ``\\xNN``, ``\\uNNNN`` or
    ``\\UNNNNNNNN`` escapes.
    """
    if _PLAIN.fullmatch(raw):
        return b'"' + raw + b'"'
    out = ['"']
    # surrogateescape maps each byte of an invalid sequence to its own U+DC80+byte,
    # the same one-byte-at-a-time resynchronisation as Go's utf8.DecodeRune.
    for ch in raw.decode("utf-8", "surrogateescape"):
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:
            out.append("\\x%02x" % (code - 0xDC00))
        elif ch == '"' or ch == "\\":
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        elif ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif code < 0x20 or code == 0x7F:
            out.append("\\x%02x" % code)
        elif code < 0x10000:
            out.append("\\u%04x" % code)
        else:
            out.append("\\U%08x" % code)
    out.append('"')
    return "".join(out).encode("utf-8")
