"""nsqd's numeric parsing of command arguments, overflow included.

``internal/protocol/byte_base10.go`` accepts ASCII digits only (no sign, no
spaces), parses an empty token as 0, and accumulates in a ``uint64`` that
silently wraps. Handlers then convert to ``int64`` (RDY) or multiply into a
``time.Duration`` in nanoseconds (REQ, DPUB), which wraps again. The helpers
here reproduce those wraps so that out-of-range input gets nsqd's answer.
"""

from __future__ import annotations

from broker.gocompat import MILLISECOND, wrap_int64, wrap_uint64

__all__ = ["parse_base10", "to_int64", "ms_to_duration_ns"]

#: Reinterpret a ``uint64`` bit pattern as Go's ``int64`` (what ``int64(count)`` does in RDY).
to_int64 = wrap_int64


def parse_base10(token: bytes) -> int | None:
    """The ``uint64`` nsqd reads from ``token``, or None if it has a non-digit.

    Only the last 64 digits can change the value modulo 2**64 (10**64 is a
    multiple of 2**64), so longer tokens are cut before ``int()`` sees them.
    """
    if not token:
        return 0
    if not token.isdigit():  # bytes.isdigit() is ASCII-only
        return None
    return wrap_uint64(int(token[-64:]))


def ms_to_duration_ns(ms: int) -> int:
    """``time.Duration(ms) * time.Millisecond`` with Go's int64 wrap-around."""
    return wrap_int64(ms * MILLISECOND)
