"""Go's ``encoding/json``: ``json.Marshal`` of maps, slices, strings and numbers, and what
``json.Unmarshal`` accepts.

Go writes no spaces, escapes ``<``, ``>``, ``&``, U+2028 and U+2029, replaces invalid UTF-8
with U+FFFD, and prints a float64 in the shortest fixed notation between 1e-6 and 1e21
(``1``, ``0.99``) and in exponent notation outside (``1e-7``, ``1e+21``).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

__all__ = ["go_json", "go_unmarshal", "json_float", "replace_surrogates"]

_PLAIN = re.compile(r'[ !#-%\'-;=?-\[\]-~]*\Z')
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t",
            "<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def _string(text: str) -> str:
    if _PLAIN.match(text):
        return f'"{text}"'
    out = ['"']
    for ch in text:
        escaped = _ESCAPES.get(ch)
        if escaped is not None:
            out.append(escaped)
        elif ch < " ":
            out.append("\\u%04x" % ord(ch))
        elif "\ud800" <= ch <= "\udfff":
            # a lone surrogate stands for invalid UTF-8, which Go replaces
            out.append("\ufffd")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)

_SURROGATE = re.compile("[\ud800-\udfff]")


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


_decoder = json.JSONDecoder(parse_constant=_reject_constant)


def go_unmarshal(raw: bytes) -> Any:
    """Decode a JSON document from an untrusted peer as Go's ``json.Unmarshal`` reads it.

    Invalid UTF-8 reads as U+FFFD, as in Go. Raises ``ValueError`` wherever Go's decoder
    fails: malformed JSON, ``NaN``/``Infinity``, and nesting too deep to decode (Python's
    recursion limit, about 1,000 levels, is below Go's 10,000; no value nsqd accepts nests
    that deep). Strings may hold lone surrogates from ``\\ud800`` escapes, which Go turns
    into U+FFFD: see ``replace_surrogates``.
    """
    try:
        return _decoder.decode(raw.decode("utf-8", "replace"))
    except RecursionError as exc:
        raise ValueError("JSON nested too deeply") from exc


def replace_surrogates(text: str) -> str:
    """``text`` with every lone surrogate (from a ``\\ud800`` escape) replaced by U+FFFD, as Go does."""
    return _SURROGATE.sub("\ufffd", text)


def json_float(value: float) -> str:
    """A float64 as Go's ``encoding/json`` writes it (``1``, ``0.99``, ``1e-7``, ``1e+21``).

    Raises ``ValueError`` for NaN and the infinities, which JSON cannot hold.
    """
    if not math.isfinite(value):
        raise ValueError(f"json: unsupported value: {value!r}")
    if value == 0:
        return "0"
    text = repr(float(value))
    if 1e-6 <= abs(value) < 1e21:
        # Go: the shortest digits in fixed notation
        if "e" in text:
            from decimal import Decimal  # rare (1e-06 <= |v| < 1e-04 or 1e16 <= |v| < 1e21): not at import

            text = format(Decimal(text), "f")
        return text[:-2] if text.endswith(".0") else text
    # Go: exponent notation with at least two exponent digits, "e-07" shortened to "e-7"
    if len(text) >= 4 and text[-4] == "e" and text[-3] == "-" and text[-2] == "0":
        text = text[:-2] + text[-1]
    return text


def _encode(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(str(int(value)))
    elif isinstance(value, float):
        out.append(json_float(value))
    elif isinstance(value, str):
        out.append(_string(value))
    elif isinstance(value, dict):
        out.append("{")
        first = True
        for key, item in value.items():
            if not first:
                out.append(",")
            first = False
            out.append(_string(key))
            out.append(":")
            _encode(item, out)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _encode(item, out)
        out.append("]")
    else:
        raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def go_json(value: Any, *, floats: bool = True) -> bytes:
    """``value`` as Go's ``json.Marshal`` would write it; dicts keep their key order.

    Raises ``TypeError`` for a value that is not None, bool, int, float, str, dict, list or
    tuple, and ``ValueError`` for a float JSON cannot hold. ``floats=False`` promises that
    ``value`` holds no float: it is then written by the standard library's C encoder and
    made Go's afterwards (escapes and invalid UTF-8), many times faster for a large
    document such as ``/stats`` with thousands of topics.
    """
    if not floats:
        return _go_text(_c_encode(value)).encode("utf-8")
    out: list[str] = []
    _encode(value, out)
    return "".join(out).encode("utf-8")


#: The standard library's encoder with Go's separators; its strings differ from Go's only in
#: what ``_go_text`` changes. (Its floats differ too: callers promise there are none.)
_c_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False,
                             check_circular=False).encode
#: The escapes Python writes short and Go as \u00XX, with the escaped backslash that must be
#: passed over so that a ``\\`` followed by ``b`` is left alone.
_SHORT_ESCAPE = re.compile(r"\\([\\bf])")
_GO_SHORT = {"\\": "\\\\", "b": "\\u0008", "f": "\\u000c"}


def _go_text(text: str) -> str:
    """JSON text from the standard encoder (``ensure_ascii=False``) as Go writes the same value."""
    if "\\b" in text or "\\f" in text:
        text = _SHORT_ESCAPE.sub(lambda m: _GO_SHORT[m.group(1)], text)
    if "<" in text:
        text = text.replace("<", "\\u003c")
    if ">" in text:
        text = text.replace(">", "\\u003e")
    if "&" in text:
        text = text.replace("&", "\\u0026")
    if not text.isascii():
        text = _SURROGATE.sub("\ufffd", text).replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return text
