"""Go's ``time.Duration`` syntax: ``time.ParseDuration`` and ``Duration.String``.

nsqd reads durations with Go's ``time.ParseDuration`` (``250ms``, ``2s``, ``1m30s``, ``1.5h``,
``300us``, ``0``) and prints them with ``Duration.String`` (``250ms``, ``2s``, ``1m0s``,
``1h0m0s``) in ``--help``. JSON renderings (``/config``, ``/info``) are integer nanoseconds.
pynsqd keeps durations as float seconds; these helpers convert at the edges, with integer
nanoseconds in between so that printing is exact.
"""

from __future__ import annotations

from broker.gocompat.ints import INT64_MAX
from broker.gocompat.strconv import go_quote_str

__all__ = [
    "NANOSECOND",
    "MICROSECOND",
    "MILLISECOND",
    "SECOND",
    "MINUTE",
    "HOUR",
    "parse_duration",
    "format_duration",
    "to_ns",
    "to_seconds",
]

NANOSECOND = 1
MICROSECOND = 1_000
MILLISECOND = 1_000_000
SECOND = 1_000_000_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE

# Go's time.Duration is an int64 of nanoseconds; anything larger is an "invalid duration".
_MAX_NS = INT64_MAX

_UNITS = {
    "ns": NANOSECOND,
    "us": MICROSECOND,
    "\u00b5s": MICROSECOND,  # micro sign, what Go prints
    "\u03bcs": MICROSECOND,  # Greek small letter mu, also accepted by Go
    "ms": MILLISECOND,
    "s": SECOND,
    "m": MINUTE,
    "h": HOUR,
}

_DIGITS = "0123456789"


def parse_duration(text: str) -> int:
    """Parse a Go duration string into integer nanoseconds.

    A duration is an optional sign and a sequence of decimal numbers, each with an optional
    fraction and a unit suffix (``ns``, ``us``/``µs``, ``ms``, ``s``, ``m``, ``h``); ``"0"``
    alone needs no unit. Raises ``ValueError`` with Go's message (``time: invalid duration
    "x"``, ``time: missing unit in duration "1"``, ``time: unknown unit "d" in duration
    "1d"``) when the text is not a duration.
    """
    original = text
    rest = text
    negative = False
    if rest[:1] in ("-", "+"):
        negative = rest[0] == "-"
        rest = rest[1:]
    if rest == "0":
        return 0
    if not rest:
        raise ValueError(f"time: invalid duration {go_quote_str(original)}")
    total = 0
    while rest:
        if rest[0] != "." and rest[0] not in _DIGITS:
            raise ValueError(f"time: invalid duration {go_quote_str(original)}")
        i = 0
        while i < len(rest) and rest[i] in _DIGITS:
            i += 1
        whole = rest[:i]
        rest = rest[i:]
        fraction = ""
        if rest[:1] == ".":
            rest = rest[1:]
            i = 0
            while i < len(rest) and rest[i] in _DIGITS:
                i += 1
            fraction = rest[:i]
            rest = rest[i:]
        if not whole and not fraction:
            # no digits on either side of the dot, e.g. "." or ".s"
            raise ValueError(f"time: invalid duration {go_quote_str(original)}")
        i = 0
        while i < len(rest) and rest[i] != "." and rest[i] not in _DIGITS:
            i += 1
        if i == 0:
            raise ValueError(f"time: missing unit in duration {go_quote_str(original)}")
        unit_name = rest[:i]
        rest = rest[i:]
        unit = _UNITS.get(unit_name)
        if unit is None:
            raise ValueError(
                f"time: unknown unit {go_quote_str(unit_name)} in duration {go_quote_str(original)}"
            )
        value = int(whole or "0") * unit
        if fraction:
            value += int(fraction) * unit // 10 ** len(fraction)
        total += value
        if total > _MAX_NS:
            raise ValueError(f"time: invalid duration {go_quote_str(original)}")
    return -total if negative else total


def _fraction(value: int, precision: int) -> tuple[str, int]:
    """Split off ``precision`` decimal digits: (".123" without trailing zeros, the rest)."""
    digits = []
    printed = False
    for _ in range(precision):
        digit = value % 10
        printed = printed or digit != 0
        if printed:
            digits.append(str(digit))
        value //= 10
    if not printed:
        return "", value
    return "." + "".join(reversed(digits)), value


def format_duration(ns: int) -> str:
    """Render integer nanoseconds the way Go's ``Duration.String`` does.

    ``0`` is ``"0s"``; under a second the largest fitting small unit is used (``"250ms"``,
    ``"1.5µs"``, ``"100ns"``); from a second up it is hours, minutes and seconds with the
    leading zero units left out (``"2s"``, ``"1m0s"``, ``"1h0m0s"``, ``"1m30.5s"``).
    """
    ns = int(ns)
    negative = ns < 0
    magnitude = -ns if negative else ns
    if magnitude < SECOND:
        if magnitude == 0:
            return "0s"
        if magnitude < MICROSECOND:
            precision, unit = 0, "ns"
        elif magnitude < MILLISECOND:
            precision, unit = 3, "\u00b5s"
        else:
            precision, unit = 6, "ms"
        fraction, whole = _fraction(magnitude, precision)
        text = f"{whole}{fraction}{unit}"
    else:
        fraction, whole = _fraction(magnitude, 9)
        text = f"{whole % 60}{fraction}s"
        whole //= 60
        if whole > 0:
            text = f"{whole % 60}m{text}"
            whole //= 60
            if whole > 0:
                text = f"{whole}h{text}"
    return "-" + text if negative else text


def to_ns(seconds: float) -> int:
    """Float seconds to integer nanoseconds, rounded to the nearest nanosecond."""
    return round(seconds * SECOND)


def to_seconds(ns: int) -> float:
    """Integer nanoseconds to float seconds."""
    return ns / SECOND
