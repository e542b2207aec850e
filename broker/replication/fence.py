"""The fence of a replicating node (:class:`~broker.core.host.Fence`): when its channels deliver
nothing, so that no message is delivered both here and by a node that took it over.

A replicated topic's channels hold delivery:

- from the start, until the peers said what they took over from this node while it was
  down (``starting``);
- while this node asks its peers again after it noticed it had been stopped (SIGSTOP) or
  starved (``armed``), and from the moment its clock task last ran more than ``limit``
  seconds ago (``last_tick``, ``time.monotonic``) until it has looked;
- while this node has not reached a majority of the cluster's nodes for ``limit`` seconds,
  or heard from one for that long (two heartbeats at least) (``minority``): the others, a majority, take its messages over after ``--replica-timeout``
  of silence, twice that long; a node in a minority holds them meanwhile, and once it reaches
  a majority again, until its links to the peers are up again, each HELLO answered (which
  says what the peer took over from it), or failed (``--replica-timeout`` at most);
- while no majority answered the last question of :mod:`.confirm` (``doubt``), asked before
  every delivery: that one holds at once.

A topic with one replica is never held: nobody else can deliver its messages.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["ClockFence"]


class ClockFence:
    """The fence of a replicating node; ``replicated(topic)``: whether the topic has copies."""

    __slots__ = ("starting", "armed", "minority", "doubt", "last_tick", "limit", "_replicated")

    def __init__(self, limit: float, replicated: Callable[[str], bool]):
        self.starting = True
        self.armed = False
        self.minority = False
        self.doubt = False
        self.last_tick = time.monotonic()
        self.limit = limit
        self._replicated = replicated

    def holds(self, topic: str) -> bool:
        return (self.starting or self.armed or self.minority or self.doubt or time.monotonic() - self.last_tick > self.limit) \
            and self._replicated(topic)
