"""Go's fixed-width integers: the int32/int64/uint64 bounds and two's complement wrap-around."""

from __future__ import annotations

__all__ = ["INT32_MIN", "INT32_MAX", "INT64_MIN", "INT64_MAX", "UINT64_MAX", "wrap_int64", "wrap_uint64"]

#: Go's int32 range.
INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1

#: Go's int64 range.
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

#: Go's largest uint64.
UINT64_MAX = (1 << 64) - 1


def wrap_uint64(value: int) -> int:
    """``value`` reduced as Go's uint64 arithmetic wraps on overflow."""
    return value & UINT64_MAX


def wrap_int64(value: int) -> int:
    """``value`` reduced as Go's int64 arithmetic wraps on overflow (two's complement).

    The same reduction reinterprets a uint64 bit pattern as an int64 (``int64(u)`` in Go).
    """
    value &= UINT64_MAX
    return value - (1 << 64) if value > INT64_MAX else value
