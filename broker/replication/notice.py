"""Warnings that a peer (or a stranger posing as one) can make happen, said at most once a
minute for each cause, with how many were held back since: a flood of bad handshakes or
requests costs a log line a minute, not one each."""

from __future__ import annotations

import logging

import trio

__all__ = ["Notices", "NOTICE_INTERVAL", "printable"]

#: Seconds between two log lines of the same cause.
NOTICE_INTERVAL = 60.0


class Notices:
    """Rate-limited warnings on ``logger``, keyed by cause."""

    def __init__(self, logger: logging.Logger, interval: float = NOTICE_INTERVAL):
        self._log = logger
        self._interval = interval
        self._said: dict[object, float] = {}
        self._held: dict[object, int] = {}

    def warn(self, cause: object, message: str, *args: object) -> None:
        """Log ``message % args`` unless ``cause`` was logged less than the interval ago."""
        now = trio.current_time()
        if now - self._said.get(cause, -self._interval) < self._interval:
            self._held[cause] = self._held.get(cause, 0) + 1
            return
        if len(self._said) > 10_000:  # causes are addresses and names from outside: bounded too
            self._said.clear()
            self._held.clear()
        self._said[cause] = now
        held = self._held.pop(cause, 0)
        suffix = f" ({held} more like it since the last)" if held else ""
        self._log.warning(message + suffix, *args)


def printable(text: object, limit: int = 200) -> str:
    """``text`` from a peer, safe for one log line: control characters escaped, cut at ``limit``."""
    value = text if isinstance(text, str) else repr(text)
    escaped = value.encode("unicode_escape", "backslashreplace").decode("ascii")
    return escaped if len(escaped) <= limit else escaped[:limit] + "..."
