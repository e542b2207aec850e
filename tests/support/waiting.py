"""Waiting for a condition the broker reaches on its own, instead of sleeping a fixed time."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

__all__ = ["wait_for", "wait_until"]


async def wait_for(predicate: Callable[[], object], timeout: float = 5.0, *, poll: float = 0.01) -> None:
    """Return as soon as ``predicate()`` is true; fail after ``timeout`` seconds.

    It polls because what it watches (counters, queue lengths, files) has no event to wait on.
    """
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(poll)


async def wait_until(predicate: Callable[[], Awaitable[object]], timeout: float = 15.0, *, poll: float = 0.05) -> None:
    """:func:`wait_for` with a predicate that must be awaited (an HTTP request to ``/stats``, say)."""
    with trio.fail_after(timeout):
        while not await predicate():
            await trio.sleep(poll)
