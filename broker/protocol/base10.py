"""nsqd's numeric parsing of command arguments, overflow included.

``internal/protocol/byte_base10.go`` accepts ASCII digits only (no sign, no
spaces), parses an empty token as 0, and accumulates in a ``uint64`` that
silently wraps. Handlers then convert to ``int64`` (RDY) or multiply into a
``time.Duration`` in nanoseconds (REQ, DPUB), which wraps again. The helpers
here reproduce those wraps so that out-of-range input gets nsqd's answer.
"""

from __future__ import annotations

__all__ = ["parse_base10", "to_int64", "ms_to_duration_ns"]

_U64_MASK = (1 << 64) - 1
_I64_SIGN = 1 << 63
_NS_PER_MS = 1_000_000


def parse_base10(token: bytes) -> int | None:
    """The ``uint64`` nsqd reads from ``token``, or None if it has a non-digit.

    Only the last 64 digits can change the value modulo 2**64 (10**64 is a
    multiple of 2**64), so longer tokens are cut before ``int()`` sees them.
    """
    if not token:
        return 0
    if not token.isdigit():  # bytes.isdigit() is ASCII-only
        return None
    return int(token[-64:]) & _U64_MASK


def to_int64(value: int) -> int:
    """Reinterpret a ``uint64`` bit pattern as Go's ``int64``."""
    value &= _U64_MASK
    return value - (1 << 64) if value & _I64_SIGN else value


def ms_to_duration_ns(ms: int) -> int:
    """``time.Duration(ms) * time.Millisecond`` with Go's int64 wrap-around."""
    return to_int64(ms * _NS_PER_MS)
