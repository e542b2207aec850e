"""Go's ``strconv``: integer and boolean parsing, ``Quote``, and float printing for messages.

Python's ``int()``, ``bool()``, ``repr()`` and ``json.dumps`` each accept or print something
Go does not, so anything that must read or write text the way nsqd does goes through here.
"""

from __future__ import annotations

import math
import re

from broker.gocompat.ints import INT64_MAX, INT64_MIN

__all__ = ["parse_int64", "parse_int_base0", "parse_bool", "go_quote", "go_quote_str", "format_float_v"]

_DECIMAL = re.compile(r"[+-]?[0-9]+")

# strconv.ParseInt(s, 0, 64): decimal, 0x/0o/0b prefixes, a leading 0 means octal, and
# underscores between digits.
_BASE0 = re.compile(
    r"[+-]?(?:0[xX](?:_?[0-9a-fA-F])+|0[bB](?:_?[01])+|0[oO](?:_?[0-7])+|0(?:_?[0-7])*|[1-9](?:_?[0-9])*)\Z"
)

_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def parse_int64(text: str) -> int:
    """``strconv.ParseInt(text, 10, 64)``; ``ValueError`` if ``text`` is not a base-10 int64."""
    if not _DECIMAL.fullmatch(text):
        raise ValueError(text)
    digits = text.lstrip("+-").lstrip("0")
    if len(digits) > 19:  # out of range; and int() refuses 4,300 digits, Go reads any count of zeros
        raise ValueError(text)
    value = int(digits or "0")
    if text[0] == "-":
        value = -value
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(text)
    return value


def parse_int_base0(text: str) -> int:
    """``strconv.ParseInt(text, 0, 64)``, the syntax of Go's integer flags.

    Raises ``ValueError("parse error")`` for text that is not an integer literal and
    ``ValueError("value out of range")`` outside int64.
    """
    if not _BASE0.match(text):
        raise ValueError("parse error")
    negative = text[0] == "-"
    digits = text.lstrip("+-").replace("_", "")
    if len(digits) > 1 and digits[0] == "0" and digits[1].isdigit():
        value = int(digits, 8)
    else:
        value = int(digits, 0)
    value = -value if negative else value
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError("value out of range")
    return value


def parse_bool(text: str) -> bool:
    """``strconv.ParseBool``: ``1 t T TRUE true True`` and their false twins; ``ValueError`` else."""
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError("parse error")


# Printable ASCII without '"' and '\\' is copied as is; anything else needs the rune walk.
_PLAIN = re.compile(rb'[ !#-\[\]-~]*')
_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def go_quote(raw: bytes) -> bytes:
    """Format ``raw`` (a Go string's bytes) as ``strconv.Quote`` (``%q``) does, UTF-8 encoded.

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
        elif ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif code < 0x20 or code == 0x7F:
            out.append("\\x%02x" % code)
        elif code < 0x10000:
            out.append("\\u%04x" % code)
        else:
            out.append("\\U%08x" % code)
    out.append('"')
    return "".join(out).encode("utf-8")


def go_quote_str(text: str) -> str:
    """:func:`go_quote` for text; bytes Python could not decode (surrogate escapes) print as ``\\xNN``."""
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        # a lone surrogate that stands for no byte: Go sees its three-byte (invalid) encoding
        raw = text.encode("utf-8", "surrogatepass")
    return go_quote(raw).decode("utf-8")


def format_float_v(value: float) -> str:
    """A float64 the way nsqd's ``%v`` shows an option value: ``2``, ``1.5``, ``0.25``.

    Whole numbers print without a fraction and the others in the shortest form that reads
    back as the same float, which is Go's for the values options take. NaN and the
    infinities keep Python's spelling (``nan``, ``inf``).
    """
    if math.isfinite(value) and value == int(value) and abs(value) < 1e21:
        return str(int(value))
    return repr(value)
