"""Go's ``json.Unmarshal`` into a struct of strings, bools and slices, with Go's errors.

A Go program reading a JSON file into a struct reports a document of the wrong shape with
the first value that does not fit, in document order, and decodes the rest anyway:
``json: cannot unmarshal string into Go struct field Metadata.topics of type
[]nsqd.TopicMetadata``. :func:`unmarshal` reads a document the same way against a
description of the struct (:class:`GoStruct`, :class:`GoSlice`, :data:`GO_STRING`,
:data:`GO_BOOL`, :data:`GO_INT`), so a program that mirrors a Go file format answers with Go's words.

As in Go: a syntax error is reported first, in Go's words
(:func:`~broker.gocompat.jsonscan.syntax_error`); ``null`` leaves a value at its zero value; object keys match field names exactly or else
ignoring case; keys of no field are ignored (and kept here, for a reader that knows more
than the Go program); invalid UTF-8 and lone surrogates in strings read as U+FFFD.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from broker.gocompat.ints import INT64_MAX, INT64_MIN
from broker.gocompat.json import replace_surrogates
from broker.gocompat.jsonscan import syntax_error

__all__ = ["GO_BOOL", "GO_INT", "GO_STRING", "GoScalar", "GoSlice", "GoStruct", "unmarshal"]


class GoScalar(NamedTuple):
    """A Go ``string``, ``bool`` or ``int``: ``name`` as Go prints the type, ``json`` the Python
    type it holds, ``bounds`` the range a number must be in (Go refuses one that overflows)."""

    name: str
    json: type
    zero: Any
    bounds: tuple[int, int] | None = None


GO_STRING = GoScalar("string", str, "")
GO_BOOL = GoScalar("bool", bool, False)
#: Go's ``int`` (64 bits): an integer literal in range; a fraction, an exponent or more is refused
GO_INT = GoScalar("int", int, 0, (INT64_MIN, INT64_MAX))


class GoSlice(NamedTuple):
    """A Go slice of ``element``."""

    element: GoType

    @property
    def name(self) -> str:
        return "[]" + self.element.name


@dataclass(frozen=True)
class GoStruct:
    """A Go struct type ``name`` (``package.Type``) whose fields have the JSON names of ``fields``."""

    name: str
    fields: dict[str, GoType] = field(default_factory=dict)


GoType = GoScalar | GoSlice | GoStruct


class _Pairs(list):
    """A JSON object as its (key, value) pairs in document order (Go decodes duplicates in turn)."""


def _kind(value: Any) -> str:
    """The JSON kind Go names in a type error."""
    if isinstance(value, _Pairs):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "bool"
    return "number"


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _number(text: str) -> int | float:
    # Go reads any number of digits; Python refuses to convert more than 4300 to an int
    return int(text) if len(text) < 4000 else float(text)


_decoder = json.JSONDecoder(object_pairs_hook=_Pairs, parse_constant=_reject_constant, parse_int=_number)


class _Decoding:
    """One decode: the first type error (Go keeps the first and goes on) and where it was."""

    def __init__(self) -> None:
        self.error: str | None = None

    def fail(self, value: Any, go_type: GoType, context: tuple[str, tuple[str, ...]] | None) -> None:
        if self.error is not None:
            return
        where = "Go value"
        if context is not None:
            struct, path = context
            where = f"Go struct field {struct}.{'.'.join(path)}"
        self.error = f"json: cannot unmarshal {_kind(value)} into {where} of type {go_type.name}"

    def value(self, value: Any, go_type: GoType, context: tuple[str, tuple[str, ...]] | None) -> Any:
        if value is None:
            return self.zero(go_type)
        if isinstance(go_type, GoScalar):
            bounds = go_type.bounds
            if type(value) is go_type.json and (
                    bounds is None or (isinstance(value, int) and bounds[0] <= value <= bounds[1])):
                return replace_surrogates(value) if isinstance(value, str) else value
            self.fail(value, go_type, context)
            return go_type.zero
        if isinstance(go_type, GoSlice):
            if isinstance(value, list) and not isinstance(value, _Pairs):
                return [self.value(item, go_type.element, context) for item in value]
            self.fail(value, go_type, context)
            return []
        if not isinstance(value, _Pairs):
            self.fail(value, go_type, context)
            return self.zero(go_type)
        decoded = self.zero(go_type)
        short = go_type.name.rpartition(".")[2]
        path = context[1] if context is not None else ()
        for key, item in value:
            name = key if key in go_type.fields else next(
                (f for f in go_type.fields if f.casefold() == key.casefold()), None)
            if name is None:
                decoded[key] = _plain(item)  # not a field of the Go struct: kept for the caller
                continue
            decoded[name] = self.value(item, go_type.fields[name], (short, (*path, name)))
        return decoded

    def zero(self, go_type: GoType) -> Any:
        if isinstance(go_type, GoScalar):
            return go_type.zero
        if isinstance(go_type, GoSlice):
            return []
        return {name: self.zero(t) for name, t in go_type.fields.items()}


def _plain(value: Any) -> Any:
    """A decoded value with objects as dicts (the last of duplicate keys wins, as in Go)."""
    if isinstance(value, _Pairs):
        return {key: _plain(item) for key, item in value}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def unmarshal(data: bytes, go_type: GoStruct) -> dict[str, Any]:
    """Decode ``data`` into ``go_type`` as Go's ``json.Unmarshal`` does.

    Returns the struct as a dict: every field (at its zero value when absent or null),
    plus the keys of no field with their values. Raises ``ValueError`` with Go's message
    for invalid JSON or the first value of the wrong type.
    """
    try:
        document = _decoder.decode(data.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        # What Python's parser refuses Go's refuses too, but with other words (checking
        # first would cost a pass over every valid document). The one exception: nesting
        # deeper than Python decodes, and less than Go's limit of 10,000 levels.
        raise ValueError(syntax_error(data) or "JSON nested too deeply") from None
    decoding = _Decoding()
    result = decoding.value(document, go_type, None)
    if decoding.error is not None:
        raise ValueError(decoding.error)
    return result
