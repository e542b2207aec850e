"""Waiting for input on many sockets with one edge-triggered epoll set.

Trio's :func:`trio.lowlevel.wait_readable` arms a one-shot epoll registration per
wait: a connection that answers one request at a time pays an ``epoll_ctl`` for
every request, on top of the read that found nothing. Here each plain V2
connection's socket joins one epoll set once, edge-triggered, and one task
(:meth:`ReadPoller.run`) waits on that set's descriptor through Trio and wakes the
connections whose sockets received something. A connection reads until a read
comes back short (the socket is drained: the next bytes to arrive bring a new
edge), then waits here without a system call of its own.

An edge that arrives while its connection is busy is remembered, so the
connection's next wait returns at once and its read finds the bytes (or, if it
read them already, nothing; then it waits again).

epoll is Linux's; :func:`open_poller` returns None elsewhere and the connections
read through their Trio streams.
"""

from __future__ import annotations

import select

import trio

__all__ = ["ReadPoller", "open_poller"]

#: Most events taken from the epoll set per wake-up; more stay there for the next one.
MAX_EVENTS = 1024


class ReadPoller:
    """One epoll set of sockets and the tasks waiting for them to become readable.

    Owned by the server that runs :meth:`run`; the connections register their
    descriptors and must :meth:`unregister` them before closing the socket.
    :meth:`close` releases the epoll descriptor.
    """

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._waiting: dict[int, trio.lowlevel.Task] = {}
        self._ready: set[int] = set()  # edges that came while nobody waited

    def register(self, fd: int) -> None:
        """Watch ``fd`` (a socket) for input, hang-ups and errors."""
        self._epoll.register(fd, select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLET)

    def unregister(self, fd: int) -> None:
        """Stop watching ``fd`` (before it is closed: the number may be reused).

        Called by the task that reads ``fd``, when it stops reading it.
        """
        self._ready.discard(fd)
        try:
            self._epoll.unregister(fd)
        except (OSError, ValueError):  # closed already, or the poller was closed
            pass

    async def wait_readable(self, fd: int) -> None:
        """Return once ``fd`` received something since it was last drained (a checkpoint).

        The caller has read ``fd`` until a short read or ``EAGAIN``. Raises
        ``trio.BusyResourceError`` if another task waits for ``fd`` already.
        """
        if fd in self._ready:
            self._ready.discard(fd)
            await trio.lowlevel.checkpoint()
            return
        if fd in self._waiting:
            raise trio.BusyResourceError("another task is already reading this socket")
        self._waiting[fd] = trio.lowlevel.current_task()

        def abort(_: object) -> trio.lowlevel.Abort:
            self._waiting.pop(fd, None)
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    async def run(self) -> None:
        """Wake the waiting connections as their sockets receive bytes; runs until cancelled."""
        epoll_fd = self._epoll.fileno()
        poll = self._epoll.poll
        waiting = self._waiting
        ready = self._ready
        reschedule = trio.lowlevel.reschedule
        while True:
            await trio.lowlevel.wait_readable(epoll_fd)
            for fd, _ in poll(0, MAX_EVENTS):
                task = waiting.pop(fd, None)
                if task is None:
                    ready.add(fd)
                else:
                    reschedule(task)

    def close(self) -> None:
        """Release the epoll descriptor (after :meth:`run` has stopped)."""
        self._epoll.close()


def open_poller() -> ReadPoller | None:
    """A :class:`ReadPoller`, or None where the platform has no epoll."""
    if not hasattr(select, "epoll"):
        return None
    return ReadPoller()
