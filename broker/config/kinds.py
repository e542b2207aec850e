"""Value kinds: how each type of option is read from a flag and a config file, and shown.

A flag's text uses Go's syntax (``strconv.ParseInt`` base 0, ``strconv.ParseBool``,
``time.ParseDuration``); a config file holds TOML values, where durations may also be
integer milliseconds (``mreiferson/go-options``). ``to_json`` gives what ``GET /config/:opt``
returns and ``help_default`` the ``(default ...)`` of ``--help``.
"""

from __future__ import annotations

import re
from typing import Any

from broker.config.log import LOG_LEVELS, log_level_number
from broker.config.tls import TLS_NOT_REQUIRED, TLS_REQUIRED, TLS_REQUIRED_EXCEPT_HTTP, TLS_VERSIONS
from broker.gocompat import (
    INT64_MAX,
    INT64_MIN,
    format_duration,
    format_v,
    go_quote_str,
    parse_bool,
    parse_duration,
    parse_int_base0,
    to_ns,
    to_seconds,
)

__all__ = [
    "Kind", "STRING", "INT", "BOOL", "DURATION", "STRINGS", "FLOATS", "LOG_LEVEL", "TLS_REQUIRED_KIND",
    "TLS_MIN_VERSION",
]

_DECIMAL_INT = re.compile(r"[+-]?[0-9]+\Z")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Kind:
    """How one type of option is read from a flag and a config file, shown and rendered."""

    __slots__ = ()
    type_name = "value"  # the word after the flag name in --help
    bool_flag = False  # takes no separate argument: --flag alone means true
    repeatable = False  # each use adds to the list instead of replacing it

    def from_flag(self, text: str) -> Any:
        """The value of ``--flag=text``; ``ValueError`` with the reason if it is not one."""
        raise NotImplementedError

    def from_config(self, value: Any) -> Any:
        """The value of a config file entry; ``ValueError`` with the reason if it is not one."""
        raise NotImplementedError

    def to_json(self, value: Any) -> Any:
        """What ``GET /config/:opt`` shows for ``value``."""
        return value

    def help_default(self, value: Any) -> str | None:
        """The ``(default ...)`` text, or None where Go leaves the zero value unmentioned."""
        return None


class StringKind(Kind):
    """A string, taken as is."""

    __slots__ = ()
    type_name = "string"

    def from_flag(self, text: str) -> str:
        return text

    def from_config(self, value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError("expected a string")
        return value

    def help_default(self, value: str) -> str | None:
        return go_quote_str(value) if value else None


class IntKind(Kind):
    """An int64: Go's integer literal syntax on the command line, a TOML integer in the file."""

    __slots__ = ()
    type_name = "int"

    def from_flag(self, text: str) -> int:
        return parse_int_base0(text)

    def from_config(self, value: Any) -> int:
        if isinstance(value, str) and _DECIMAL_INT.match(value):
            value = int(value)
        if not _is_int(value):
            raise ValueError("expected an integer")
        if not INT64_MIN <= value <= INT64_MAX:
            raise ValueError("value out of range")
        return value

    def help_default(self, value: int) -> str | None:
        return str(value) if value else None


class BoolKind(Kind):
    """A boolean flag: ``--flag`` alone or Go's ``ParseBool`` spellings."""

    __slots__ = ()
    type_name = ""
    bool_flag = True

    def from_flag(self, text: str) -> bool:
        return parse_bool(text)

    def from_config(self, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str):
            return parse_bool(value)
        raise ValueError("expected true or false")

    def help_default(self, value: bool) -> str | None:
        return "true" if value else None


class DurationKind(Kind):
    """A duration in float seconds: Go syntax, or integer milliseconds in the file."""

    __slots__ = ()
    type_name = "duration"

    def from_flag(self, text: str) -> float:
        try:
            return to_seconds(parse_duration(text))
        except ValueError:
            raise ValueError("parse error") from None  # Go's flag package words every bad duration so

    def from_config(self, value: Any) -> float:
        if isinstance(value, str):
            return to_seconds(parse_duration(value))
        if _is_int(value):
            # go-options reads a bare integer duration as milliseconds
            return value / 1000
        raise ValueError('expected a duration string such as "2s", or integer milliseconds')

    def to_json(self, value: float) -> int:
        return to_ns(value)

    def help_default(self, value: float) -> str | None:
        return format_duration(to_ns(value)) if value else None


class StringListKind(Kind):
    """A repeatable list of strings (comma separated in the file)."""

    __slots__ = ()
    repeatable = True

    def from_flag(self, text: str) -> tuple[str, ...]:
        return (text,)

    def from_config(self, value: Any) -> tuple[str, ...]:
        if isinstance(value, str):
            return tuple(item.strip() for item in value.split(",") if item.strip())
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            return tuple(value)
        raise ValueError("expected a list of strings")

    def to_json(self, value: tuple[str, ...]) -> list[str]:
        return list(value)

    def help_default(self, value: tuple[str, ...]) -> str | None:
        return ",".join(value) if value else None


class FloatListKind(Kind):
    """A repeatable list of floats, also comma separated."""

    __slots__ = ()
    repeatable = True

    @staticmethod
    def _split(text: str) -> tuple[float, ...]:
        items = []
        for part in text.split(","):
            try:
                items.append(float(part.strip()))
            except ValueError:
                raise ValueError(f"could not parse {part!r}") from None
        return tuple(items)

    def from_flag(self, text: str) -> tuple[float, ...]:
        return self._split(text)

    def from_config(self, value: Any) -> tuple[float, ...]:
        if isinstance(value, str):
            return self._split(value)
        if isinstance(value, list) and all(
            isinstance(item, (int, float)) and not isinstance(item, bool) for item in value
        ):
            return tuple(float(item) for item in value)
        raise ValueError("expected a list of numbers")

    def to_json(self, value: tuple[float, ...]) -> list[float]:
        return list(value)


class LogLevelKind(Kind):
    """``--log-level``: a level name, shown as nsqd's level number in ``/config``."""

    __slots__ = ()
    _labels = {"debug": "DEBUG", "info": "INFO", "warn": "WARNING", "error": "ERROR", "fatal": "FATAL"}

    def from_flag(self, text: str) -> str:
        level = text.lower()
        if level not in LOG_LEVELS:
            raise ValueError(f"invalid log level '{text}' (debug, info, warn, error, fatal)")
        return level

    def from_config(self, value: Any) -> str:
        return self.from_flag(format_v(value))

    def to_json(self, value: str) -> int:
        return log_level_number(value)

    def help_default(self, value: str) -> str | None:
        return self._labels[value]


class TlsRequiredKind(Kind):
    """``--tls-required``: true, false or ``tcp-https``, kept as nsqd's number."""

    __slots__ = ()
    type_name = ""
    bool_flag = True

    def from_flag(self, text: str) -> int:
        if text.lower() == "tcp-https":
            return TLS_REQUIRED_EXCEPT_HTTP
        try:
            return TLS_REQUIRED if parse_bool(text.lower()) else TLS_NOT_REQUIRED
        except ValueError:  # nsqd hands the rest to strconv.ParseBool and shows its error
            raise ValueError(f"strconv.ParseBool: parsing {go_quote_str(text.lower())}: invalid syntax") from None

    def from_config(self, value: Any) -> int:
        return self.from_flag(format_v(value))

    def help_default(self, value: int) -> str | None:
        return str(value) if value else None


class TlsMinVersionKind(Kind):
    """``--tls-min-version``: a version name, shown as the protocol number in ``/config``."""

    __slots__ = ()

    def from_flag(self, text: str) -> str:
        version = text.lower()
        if version == "":
            # nsqd leaves the default in place for an empty value
            return "tls1.0"
        if version not in TLS_VERSIONS:
            raise ValueError(f"unknown tlsVersionOption {go_quote_str(text)}")
        return version

    def from_config(self, value: Any) -> str:
        return self.from_flag(format_v(value))

    def to_json(self, value: str) -> int:
        return TLS_VERSIONS[value]

    def help_default(self, value: str) -> str | None:
        return value


STRING, INT, BOOL, DURATION = StringKind(), IntKind(), BoolKind(), DurationKind()
STRINGS, FLOATS = StringListKind(), FloatListKind()
LOG_LEVEL, TLS_REQUIRED_KIND, TLS_MIN_VERSION = LogLevelKind(), TlsRequiredKind(), TlsMinVersionKind()
