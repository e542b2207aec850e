"""Query strings as Go and nsqd read them: ``url.ParseQuery``, then nsqd's typed parameters."""

from __future__ import annotations

import logging
import re

from broker.gocompat import INT64_MAX
from broker.http.responses import APIError
from broker.http.server import Request

__all__ = ["Params", "parse_query", "query_params", "request_params", "first", "parse_bool", "count_param"]

log = logging.getLogger("pynsqd.http")

#: Parameter name to its values, in the order given.
Params = dict[str, list[str]]

#: nsqd's ``boolParams``: any other value leaves the default.
_BOOL_PARAMS = {"true": True, "1": True, "false": False, "0": False}

_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
_BYTE_ESCAPE = re.compile(rb"%([0-9A-Fa-f]{2})")


def _query_unescape(text: str) -> str:
    if "%" in text:
        if text.count("%") != len(_ESCAPE.findall(text)):
            raise ValueError(f"invalid URL escape in {text!r}")
        raw = text.replace("+", " ").encode("utf-8", "surrogateescape")
        raw = _BYTE_ESCAPE.sub(lambda m: bytes((int(m.group(1), 16),)), raw)
        return raw.decode("utf-8", "surrogateescape")
    return text.replace("+", " ") if "+" in text else text


def parse_query(raw: str) -> Params:
    """Go's ``url.ParseQuery``: ``&``-separated, ``+`` is a space, ``%XX`` escapes.

    Raises ``ValueError`` (after parsing what it can, as Go does) for a ``;`` in a pair
    or a bad escape; invalid UTF-8 survives as surrogate escapes.
    """
    values: Params = {}
    error = None
    for pair in raw.split("&"):
        if ";" in pair:
            error = error or ValueError("invalid semicolon separator in query")
            continue
        if not pair:
            continue
        key, _, value = pair.partition("=")
        try:
            key = _query_unescape(key)
            value = _query_unescape(value)
        except ValueError as exc:
            error = error or exc
            continue
        values.setdefault(key, []).append(value)
    if error is not None:
        raise error
    return values


def request_params(request: Request) -> Params:
    """The request's query parameters; ``400 INVALID_REQUEST`` if they do not parse."""
    return query_params(request.raw_query)


def query_params(raw_query: str) -> Params:
    """The parameters of a raw query string; ``400 INVALID_REQUEST`` if they do not parse."""
    try:
        return parse_query(raw_query)
    except ValueError as exc:
        log.error("failed to parse request params - %s", exc)
        raise APIError(400, "INVALID_REQUEST") from None


def first(params: Params, key: str) -> str | None:
    """The first value of ``key``, or None."""
    found = params.get(key)
    return found[0] if found else None


def parse_bool(text: str | None) -> bool | None:
    """nsqd's boolean parameter values (``true``, ``1``, ``false``, ``0``); None for anything else."""
    return None if text is None else _BOOL_PARAMS.get(text)


def count_param(params: Params, key: str, default: int | None, maximum: int = INT64_MAX) -> int | None:
    """A decimal parameter from 0 to ``maximum`` (int64's greatest by default); ``default``
    when absent, None when malformed or out of range (a huge one is refused before it is read)."""
    text = first(params, key)
    if text is None:
        return default
    if not text.isdigit() or not text.isascii():
        return None
    digits = text.lstrip("0")
    if len(digits) > len(str(maximum)):
        return None
    value = int(digits or "0")
    return value if value <= maximum else None
