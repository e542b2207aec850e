"""Decoding an IDENTIFY body the way nsqd's ``json.Unmarshal`` into ``identifyDataV2`` does.

What Go accepts or rejects, and how this module matches it:

* the body must be one valid JSON value (RFC 8259, no NaN/Infinity, nothing
  after it); ``null`` decodes to "no fields"; any other non-object is an error;
* keys match struct fields case-insensitively (``"Heartbeat_Interval"`` sets
  ``heartbeat_interval``; the Kelvin sign and long s fold to ``k`` and ``s``);
  a later duplicate wins; ``null`` leaves a field as it was; unknown keys are
  ignored whatever their value;
* a value of the wrong JSON type for a known field is an error, and int fields
  take only integer literals in range (``1000.0`` and ``1e3`` are errors);
  ``sample_rate`` is an ``int32``, the other ints are 64-bit;
* invalid UTF-8 inside strings and lone surrogate escapes become U+FFFD.

One known difference: Go nests up to 10000 levels, Python's decoder gives up
near its recursion limit (about 1000), so such a body is refused here.
"""

from __future__ import annotations

import json
from typing import Any

from broker.gocompat import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, replace_surrogates

from .commands import Identify
from .errors import ProtocolError

__all__ = ["decode_identify", "finish_identify", "identify_or_defer", "IDENTIFY_FIELDS", "DECODE_INLINE_BELOW"]

#: Bodies of this many bytes or more are decoded off the event loop: 5 MB (``--max-body-size``)
#: of numbers or keys take Python a third of a second, where a real IDENTIFY is a few hundred bytes.
DECODE_INLINE_BELOW = 64 * 1024

_INT64 = (INT64_MIN, INT64_MAX)
_INT32 = (INT32_MIN, INT32_MAX)

#: A field's Go type: ``str``, ``bool``, or an integer type as its (min, max) range.
_FieldKind = type[str] | type[bool] | tuple[int, int]

#: nsqd 1.3.0 ``identifyDataV2``: JSON name -> Go type.
IDENTIFY_FIELDS: dict[str, _FieldKind] = {
    "client_id": str,
    "hostname": str,
    "heartbeat_interval": _INT64,
    "output_buffer_size": _INT64,
    "output_buffer_timeout": _INT64,
    "feature_negotiation": bool,
    "tls_v1": bool,
    "deflate": bool,
    "deflate_level": _INT64,
    "snappy": bool,
    "sample_rate": _INT32,
    "user_agent": str,
    "msg_timeout": _INT64,
    # pynsqd's lease extension (broker/protocol/lease.py); nsqd ignores the key
    "lease": str,
    # pynsqd's keyed publishes (broker/protocol/keys.py)
    "publish_keys": bool,
    # pynsqd's prioritised messages (broker/protocol/priorities.py)
    "priorities": bool,
    # pynsqd's node-to-node role (broker/protocol/replica.py)
    "replica": str,
    "replica_nonce": str,
    "replica_proof": str,
    "replica_address": str,
}



class _Pairs(list[tuple[str, Any]]):
    """An object's members in wire order (a plain list would be confused with a JSON array)."""


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


class _HugeInt:
    """An integer literal too long to be in range for any field (Python's int() caps digits)."""


_HUGE_INT = _HugeInt()


def _parse_int(literal: str) -> int | _HugeInt:
    # 20 digits and a sign cover every int64; longer literals are only valid for unknown keys
    return int(literal) if len(literal) <= 21 else _HUGE_INT


class _Fraction:
    """A number with a fraction or an exponent: no field takes one, and its value is never needed."""


_FRACTION = _Fraction()


def _parse_float(literal: str) -> _Fraction:
    # Python code, where C would convert: a worker thread decoding a large body lets the
    # event loop run between numbers (see DECODE_INLINE_BELOW)
    return _FRACTION


_decoder = json.JSONDecoder(object_pairs_hook=_Pairs, parse_constant=_reject_constant, parse_int=_parse_int,
                            parse_float=_parse_float)


def _fold(key: str) -> str | None:
    key = key.replace("\u212a", "k").replace("\u017f", "s")
    return key.lower() if key.isascii() else None


def decode_identify(body: bytes) -> dict[str, Any]:
    """The fields an IDENTIFY body sets; raises ValueError where Go's decoder fails."""
    text = body.decode("utf-8", "surrogateescape")
    try:
        value = _decoder.decode(text)
    except RecursionError as exc:
        raise ValueError("JSON nested too deeply") from exc
    if value is None:
        return {}
    if type(value) is not _Pairs:
        raise ValueError("IDENTIFY body is not a JSON object")
    data: dict[str, Any] = {}
    for key, item in value:
        name = key if key in IDENTIFY_FIELDS else _fold(key)
        if name is None:
            continue
        kind = IDENTIFY_FIELDS.get(name)
        if kind is None or item is None:
            continue
        if kind is str:
            if type(item) is not str:
                raise ValueError(f"{name} must be a string")
            data[name] = replace_surrogates(item)
        elif kind is bool:
            if type(item) is not bool:
                raise ValueError(f"{name} must be a boolean")
            data[name] = item
        elif isinstance(kind, tuple):
            low, high = kind
            if type(item) is not int or not low <= item <= high:
                raise ValueError(f"{name} must be an integer in range")
            data[name] = item
    return data


def finish_identify(body: bytes) -> Identify:
    """The IDENTIFY event of ``body``, decoded; raises nsqd's fatal ``E_BAD_BODY`` if it is not JSON
    Go's decoder reads. Blocking: a large body takes a worker thread (see :class:`Identify`)."""
    try:
        data = decode_identify(body)
    except ValueError as exc:
        raise ProtocolError("E_BAD_BODY", "IDENTIFY failed to decode JSON body") from exc
    return Identify(data)


def identify_or_defer(body: bytes) -> Identify:
    """The decoded IDENTIFY event, or, for a large body, one left for its owner to decode."""
    return finish_identify(body) if len(body) < DECODE_INLINE_BELOW else Identify(None, body)
