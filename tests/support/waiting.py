"""Waiting for a condition the broker reaches on its own, instead of sleeping a fixed time.

Each returns what the predicate returned once it was true, so that a predicate may hand back
what it looked at (the ``/stats`` document that showed the condition, say)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

__all__ = ["wait_for", "wait_sync", "wait_until"]

T = TypeVar("T")


async def wait_for(predicate: Callable[[], T], timeout: float = 5.0, *, poll: float = 0.01) -> T:
    """Return as soon as ``predicate()`` is true; fail after ``timeout`` seconds.

    It polls because what it watches (counters, queue lengths, files) has no event to wait on.
    """
    with trio.fail_after(timeout):
        while not (value := predicate()):
            await trio.sleep(poll)
    return value


async def wait_until(predicate: Callable[[], Awaitable[T]], timeout: float = 15.0, *, poll: float = 0.05) -> T:
    """:func:`wait_for` with a predicate that must be awaited (an HTTP request to ``/stats``, say)."""
    with trio.fail_after(timeout):
        while not (value := await predicate()):
            await trio.sleep(poll)
    return value


def wait_sync(predicate: Callable[[], T], timeout: float, *, poll: float = 0.05,
              report: Callable[[], str] | None = None) -> T:
    """:func:`wait_for` in a test that runs outside Trio (a Spark test, say): fails after
    ``timeout`` seconds with an AssertionError that ends with ``report()`` (a log's end) if given."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s" + (f"\n{report()}" if report is not None else ""))
        time.sleep(poll)
    return value
