"""Sending the output other tasks queued for many connections, in one task.

A connection's frames are queued by synchronous code and sent by its writer task
(:mod:`broker.server.client`). What its own reader queues goes out at the end of
the reader's chunk. What other tasks queue (a topic's pump delivering a batch to a
channel's consumers, another consumer's FIN freeing messages, a timeout, a heartbeat)
used to wake the connection's writer task: a batch spread over 64 consumers cost 64
task switches and 64 sends through Trio's socket, each with its own checkpoints.

Instead each such connection is marked in the server's :class:`Flusher` (once, however
many times it is woken before the flusher runs), and the flusher's task, woken once,
hands each marked connection's output to its socket without blocking, in the order
they were marked. Only a connection whose socket does not take everything (or that is
closing, or upgrading its stream) has its writer task woken, to send the rest as before.

A connection with less than a quarter of its output buffer queued waits one turn of the
scheduler, and more while other tasks are runnable (the pump or the readers still have
work that may queue more for it), for at most :data:`DEFER_ROUNDS` turns, so that what
they queue goes out in the same write; once nothing else is runnable, or after those
turns, everything marked is sent. A connection never waits for input to arrive: when
the broker has nothing else to do its output goes at once.
"""

from __future__ import annotations

from typing import Protocol

import trio

__all__ = ["DEFER_ROUNDS", "Flushable", "Flusher"]

#: The most turns of the scheduler a connection with little output waits for other runnable tasks.
DEFER_ROUNDS = 4


class Flushable(Protocol):
    """A connection as the flusher uses it (:class:`~broker.server.client.Client`)."""

    def flush_marked(self, small: bool) -> bool:
        """Hand what is queued to the socket, or have the writer task send it; without
        ``small``, only if enough is queued to be worth a write (False: it stays marked)."""
        ...


class Flusher:
    """The connections to flush once the running task yields; :meth:`run` flushes them."""

    __slots__ = ("_marked", "_event", "running")

    def __init__(self) -> None:
        self._marked: list[Flushable] = []
        self._event = trio.Event()
        self.running = False  # while run() runs: marking is of use only then

    def mark(self, client: Flushable) -> None:
        """Flush ``client`` soon (the caller marks each connection once until it is flushed)."""
        if not self._marked:
            self._event.set()
        self._marked.append(client)

    def flush(self, small: bool = True) -> None:
        """Flush the marked connections now, in the order they were marked; without ``small``,
        those with little queued stay marked."""
        marked = self._marked
        if marked:
            self._marked = [client for client in marked if not client.flush_marked(small)]

    async def run(self) -> None:
        """Flush the marked connections each time some are marked (see the module docstring);
        runs until cancelled, then flushes what is left."""
        self.running = True
        statistics = trio.lowlevel.current_statistics
        checkpoint = trio.lowlevel.checkpoint
        try:
            while True:
                await self._event.wait()
                self._event = trio.Event()
                for _ in range(DEFER_ROUNDS):
                    self.flush(small=False)
                    if not self._marked:
                        break
                    await checkpoint()
                    if not statistics().tasks_runnable:
                        break
                self.flush()
        finally:
            self.running = False
            self.flush()
