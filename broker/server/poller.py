"""Waiting for input on many sockets with one edge-triggered epoll set.

Trio's :func:`trio.lowlevel.wait_readable` arms a one-shot epoll registration per
wait: a connection that answers one request at a time pays an ``epoll_ctl`` for
every request, on top of the read that found nothing. Here each plain connection's
socket (V2 or HTTP; each server has its own set) joins one epoll set once,
edge-triggered, and one task
(:meth:`ReadPoller.run`) waits on that set's descriptor through Trio and wakes the
connections whose sockets received something. A connection reads until a read
comes back short (the socket is drained: the next bytes to arrive bring a new
edge), then waits here without a system call of its own.

An edge that arrives while its connection is busy is remembered, so the
connection's next wait returns at once and its read finds the bytes (or, if it
read them already, nothing; then it waits again).

A waiting connection may leave an input handler (:meth:`ReadPoller.wait_readable`'s
``on_input``): the poller's task then calls it on each edge instead of waking the
connection's task, and wakes the task only when the handler says it cannot finish
alone. A request that needs nothing awaited (a PUB answered at once) then costs no
task switch: only the poller's, shared by every connection that became readable.
Why not wake the connection's task on every edge and let it apply its own input?
That costs a Trio task switch per request: measured side by side with the handler
(``tests/bench/run_matrix.py --quick``, eight nsq ``bench_writer`` connections with
one PUB in flight each, where the broker spends its CPU on little else), it served
0.80-0.90x the requests per second.

So the poller runs other connections' synchronous work, but never their failures:
a handler must not raise. Whatever goes wrong in it (a fatal protocol error, a
failed disk write, a fault of ours) it keeps as its connection's state and returns
False; the connection's task, woken, acts on it (logs it, answers, closes) as it
does on its own failures. The poller holds no exception and raises nothing in
another task, so one connection's failure never reaches the poller or the other
connections. An exception that escapes a handler all the same is a fault of the
poller's owner: it ends :meth:`ReadPoller.run` in the nursery that runs it, as any
task's unhandled error does, and never surfaces in a connection's task.

epoll is Linux's; :func:`open_poller` returns None elsewhere and the connections
read through their Trio streams.
"""

from __future__ import annotations

import select
from collections.abc import Callable

import trio

__all__ = ["InputHandler", "ReadPoller", "open_poller"]

#: Most events taken from the epoll set per wake-up; more stay there for the next one.
MAX_EVENTS = 1024
#: The events that say a socket's peer closed its side or the socket failed: they may come
#: with the last bytes, in one edge, and then no other edge follows.
_HANG_UP = select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR

#: Called by the poller's task on an edge of a socket whose connection waits: True if it
#: took care of the input itself, False to wake the connection's task; never raises (see
#: :meth:`ReadPoller.wait_readable`).
InputHandler = Callable[[], bool]


class ReadPoller:
    """One epoll set of sockets and the tasks waiting for them to become readable.

    Owned by the server that runs :meth:`run`; the connections register their
    descriptors and must :meth:`unregister` them before closing the socket.
    :meth:`close` releases the epoll descriptor.
    """

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._waiting: dict[int, tuple[trio.lowlevel.Task, InputHandler | None]] = {}
        self._ready: set[int] = set()  # edges that came while nobody waited
        self._hung_up: set[int] = set()  # sockets whose peer closed (or failed)

    def register(self, fd: int) -> None:
        """Watch ``fd`` (a socket) for input, hang-ups and errors."""
        self._epoll.register(fd, select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLET)

    def hung_up(self, fd: int) -> bool:
        """The peer of ``fd`` closed its side (or the socket failed): a short read did not
        drain it, a read will find the end of input, and no edge will come to say so."""
        return fd in self._hung_up

    def unregister(self, fd: int) -> None:
        """Stop watching ``fd`` (before it is closed: the number may be reused).

        Called by the task that reads ``fd``, when it stops reading it.
        """
        self._ready.discard(fd)
        self._hung_up.discard(fd)
        try:
            self._epoll.unregister(fd)
        except (OSError, ValueError):  # closed already, or the poller was closed
            pass

    async def wait_readable(self, fd: int, on_input: InputHandler | None = None) -> None:
        """Return once ``fd`` received something since it was last drained (a checkpoint).

        The caller has read ``fd`` until a short read or ``EAGAIN``. With ``on_input``, each
        edge while waiting first calls ``on_input()`` in the poller's task: True means it
        took care of the input (the wait goes on), False that the caller must (the wait
        returns). ``on_input`` must not raise: what fails in it is left as state for the
        caller to act on once the wait returns (see the module docstring). Raises
        ``trio.BusyResourceError`` if another task waits for ``fd`` already.
        """
        if fd in self._ready:
            self._ready.discard(fd)
            await trio.lowlevel.checkpoint()
            return
        if fd in self._waiting:
            raise trio.BusyResourceError("another task is already reading this socket")
        self._waiting[fd] = (trio.lowlevel.current_task(), on_input)

        def abort(_: object) -> trio.lowlevel.Abort:
            self._waiting.pop(fd, None)
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    def wake(self, fd: int) -> None:
        """End the wait for ``fd`` now in progress, if any (its owner is closing the connection)."""
        waiter = self._waiting.pop(fd, None)
        if waiter is not None:
            trio.lowlevel.reschedule(waiter[0])

    async def run(self) -> None:
        """Wake the waiting connections as their sockets receive bytes; runs until cancelled."""
        epoll_fd = self._epoll.fileno()
        poll = self._epoll.poll
        waiting = self._waiting
        ready = self._ready
        hung_up = self._hung_up
        reschedule = trio.lowlevel.reschedule
        while True:
            events = poll(0, MAX_EVENTS)
            if not events:
                await trio.lowlevel.wait_readable(epoll_fd)
                continue
            for fd, mask in events:
                if mask & _HANG_UP:
                    hung_up.add(fd)
                waiter = waiting.get(fd)
                if waiter is None:
                    ready.add(fd)
                    continue
                task, on_input = waiter
                if on_input is not None and on_input():  # never raises: see the module docstring
                    continue
                del waiting[fd]
                reschedule(task)
            # the woken tasks and everyone else run before the next look (which may find more
            # and need no re-arming of the epoll descriptor's one-shot registration in Trio)
            await trio.lowlevel.checkpoint()

    def close(self) -> None:
        """Release the epoll descriptor (after :meth:`run` has stopped)."""
        self._epoll.close()


def open_poller() -> ReadPoller | None:
    """A :class:`ReadPoller`, or None where the platform has no epoll."""
    if not hasattr(select, "epoll"):
        return None
    return ReadPoller()
