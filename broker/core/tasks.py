"""``TaskSet``: an object's background tasks, started in its owner's nursery only when needed.

A broker with thousands of idle topics and channels should not pay a task (and a nursery,
and a cancel scope) for each one at start-up: most never sync, commit or deliver anything
until a client comes. A channel therefore keeps no nursery of its own: its tasks are
started on demand in its topic's nursery through a ``TaskSet``, each under its own cancel
scope, and :meth:`TaskSet.close` cancels them together, as closing a nursery would.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

__all__ = ["TaskSet"]


class TaskSet:
    """Tasks of one owner, run in a nursery it is given later (:meth:`attach`).

    Tasks started before :meth:`attach` wait for it; tasks started after :meth:`close`
    are not started at all, so a late start (a disk queue's first change at shutdown)
    never hits a closed nursery. The nursery's owner owns the tasks' lifetime; this
    object only cancels them.
    """

    __slots__ = ("_nursery", "_pending", "_scopes", "closed")

    def __init__(self) -> None:
        self._nursery: trio.Nursery | None = None
        self._pending: list[Callable[[], Awaitable[Any]]] = []
        self._scopes: set[trio.CancelScope] = set()
        self.closed = False

    def attach(self, nursery: trio.Nursery) -> None:
        """Run the tasks in ``nursery`` from now on, starting those already asked for."""
        self._nursery = nursery
        pending, self._pending = self._pending, []
        for async_fn in pending:
            self.start_soon(async_fn)

    def start_soon(self, async_fn: Callable[[], Awaitable[Any]]) -> None:
        """Start ``async_fn()`` in the nursery (once attached); nothing once closed."""
        if self.closed:
            return
        if self._nursery is None:
            self._pending.append(async_fn)
        else:
            self._nursery.start_soon(self._guarded, async_fn, name=async_fn)

    async def _guarded(self, async_fn: Callable[[], Awaitable[Any]]) -> None:
        if self.closed:
            return
        with trio.CancelScope() as scope:
            self._scopes.add(scope)
            try:
                await async_fn()
            finally:
                self._scopes.discard(scope)

    def close(self) -> None:
        """Cancel every task and start none from now on. Idempotent."""
        self.closed = True
        self._pending.clear()
        for scope in self._scopes:
            scope.cancel()
