"""A ranked channel's sweeps, run a bounded step at a time in a task of the channel.

A sweep (:mod:`broker.core.ranking`) reads every record the channel's disk queue held
when it began, keeps the most urgent in memory and appends the others again. With a
backlog of millions that is seconds of work, which must not hold the broker's one
thread: every other client would wait that long, and heartbeats with them. So a sweep
is a task that reads :data:`~broker.core.retention.memory.SWEEP_STEP` records a step (one
synchronous call to the channel's retention, a millisecond at most) and lets every other
task run between steps.

While it runs the channel delivers nothing: a record not read yet may be more urgent
than the front of memory. Everything else goes on as at any time: messages published,
requeued or released meanwhile join memory or the back of the disk queue (behind what
the sweep reads), and the floor covers those written behind. Each step leaves the queue
consistent, so a sweep cancelled with its channel loses nothing (the next start sweeps
again), and with ``--durable`` a crash between steps is a crash between two requeues.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from broker.core.retention import MemoryRetention
from broker.core.tasks import TaskSet

__all__ = ["Sweeper"]


class Sweeper:
    """Runs the sweeps of one ranked channel; owned by the channel.

    ``retention`` is the channel's, whose queue holds the sweep's state; the steps run in
    ``tasks`` (the channel's), and ``done`` is called once a sweep is over and messages may
    go out (the channel dispatches).
    """

    __slots__ = ("_retention", "_tasks", "_done", "running")

    def __init__(self, retention: MemoryRetention, tasks: TaskSet, done: Callable[[], None]):
        self._retention = retention
        self._tasks = tasks
        self._done = done
        self.running = False

    def start(self) -> None:
        """Begin a sweep of what the disk queue holds, unless one runs or there is nothing."""
        if self.running or not self._retention.begin_sweep():
            return
        self.running = True
        self._tasks.start_soon(self._run)

    async def _run(self) -> None:
        step = self._retention.sweep_step
        try:
            while step():
                await trio.lowlevel.checkpoint()
        finally:
            self.running = False
        self._done()
