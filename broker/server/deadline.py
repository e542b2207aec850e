"""A connection's deadline that the broker's own stalls do not bring closer.

nsqd closes a client that sent nothing for two heartbeat intervals, and one whose socket
took nothing for one; its Go runtime reads and writes every socket as it becomes ready.
pynsqd runs on one thread: while that thread is busy (a synchronous step that took long,
or the process was not scheduled), no socket is read and no heartbeat is sent. A client
then looks silent, though its bytes wait in its socket, or it waits for a heartbeat to
answer. That silence is of the broker's making and must never count against the client.

The connection's timer task (:meth:`~broker.server.client.Client.run_timers`) sleeps
until its next deadline or heartbeat. When it wakes later than it planned by more than
:data:`STALL_TOLERANCE`, the event loop could not run it, nor read the client's socket,
for that long: a :class:`Deadline` moves itself later by the part of that lateness after
its start, and passes no sooner than :data:`STALL_GRACE` after the stall, so the client's
waiting input is read before its silence is judged. A client that truly sends nothing is
still closed: two intervals of silence while the broker could read it, as in nsqd.
"""

from __future__ import annotations

import math

__all__ = ["Deadline", "STALL_GRACE", "STALL_TOLERANCE"]

#: Seconds the timer task may wake late before the lateness counts as a stall of the broker:
#: more than Trio's scheduling takes on a loaded machine, less than any deadline it guards.
STALL_TOLERANCE = 0.05
#: After a stall, the least time a client has before its deadline passes: enough for the
#: broker to read what the client sent meanwhile (a few turns of the event loop).
STALL_GRACE = 0.1


class Deadline:
    """``limit`` seconds after a start (the last read, a send beginning), plus the broker's stalls
    since that start; owned by a connection's timer task."""

    __slots__ = ("_start", "_excused")

    def __init__(self) -> None:
        self._start: float | None = None
        self._excused = 0.0  # stall seconds since the start that do not count

    def at(self, start: float | None, limit: float, now: float, late: float) -> float:
        """When the deadline passes (``math.inf`` without a ``start``): ``start`` is its current
        start, ``now`` the time, ``late`` how late the timer task woke (0 when it was on time,
        see :data:`STALL_TOLERANCE`)."""
        if start is None:
            self._start = None
            return math.inf
        if start != self._start:
            self._start, self._excused = start, 0.0
        if late:
            self._excused = max(self._excused + min(late, now - start), now + STALL_GRACE - start - limit)
        return start + self._excused + limit
