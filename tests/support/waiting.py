"""Waiting for a condition the broker reaches on its own, instead of sleeping a fixed time."""

from __future__ import annotations

from collections.abc import Callable

import trio

__all__ = ["wait_for"]


async def wait_for(predicate: Callable[[], object], timeout: float = 5.0, *, poll: float = 0.01) -> None:
    """Return as soon as ``predicate()`` is true; fail after ``timeout`` seconds.

    It polls because what it watches (counters, queue lengths, files) has no event to wait on.
    """
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(poll)
