"""Go's ``fmt`` ``%v`` for the values a config file holds, as nsqd's messages echo them."""

from __future__ import annotations

from typing import Any

from broker.gocompat.strconv import format_float_v

__all__ = ["format_v"]


def format_v(value: Any) -> str:
    """``value`` as Go's ``%v`` shows it: ``true``, ``[a b]``, ``1.5``, ``text`` (no quotes)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + " ".join(format_v(item) for item in value) + "]"
    if isinstance(value, float):
        return format_float_v(value)
    return str(value)
