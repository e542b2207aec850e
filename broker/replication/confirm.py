"""Delivery only while a majority hears this node (the core's ``Copies.confirm``).

A channel of a replicated topic does not write the messages it chose for a subscriber at
once: it hands them here, and they go out once a majority of the cluster's members, this node
among them, answered a question asked after they were chosen that they reach this node (a
GONE of this node, :meth:`~.quorum.Quorum.confirm`). Cut off from the majority, a node
delivers nothing more from that moment: not half a ``--replica-timeout`` later, when its
fence notices (:mod:`.fence`). A message it delivered before could be delivered again by the
node that takes it over only if its consumer finished it in the moment before the partition
(the FIN cannot cross it); without this, it was everything the node delivered until the
fence held: with consumers that had waited, its whole backlog.

One question at a time answers for every delivery chosen before it was asked, so the
deliveries of a round trip go together, in the order they were chosen. When no majority
answers within ``--replica-timeout`` (or no majority is connected: at once), the round's
messages go back to their channels' queues, not counted as attempts, and the node's
replicated topics hold delivery (``doubt``) until a question is answered by a majority again,
asked every :data:`PROBE_INTERVAL`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from broker.replication.fence import ClockFence

__all__ = ["Confirms", "PROBE_INTERVAL"]

log = logging.getLogger("pynsqd.replication")

#: Seconds between two questions while no majority answers.
PROBE_INTERVAL = 0.1


class Confirms:
    """The deliveries waiting for a majority: ``ask(timeout)`` is the question
    (:meth:`~.quorum.Quorum.confirm`); ``fence`` says whether a topic's channels must not
    deliver now, and holds them while no majority answers (``doubt``); ``reopened`` has every
    channel deliver again once one does."""

    def __init__(self, ask: Callable[[float], Awaitable[bool]], timeout: float, fence: ClockFence,
                 reopened: Callable[[], None]):
        self._ask = ask
        self._timeout = timeout
        self._fence = fence
        self._reopened = reopened
        self._waiting: list[tuple[str, Callable[[], None], Callable[[], None]]] = []
        self._wake = trio.Event()

    def add(self, topic: str, send: Callable[[], None], back: Callable[[], None]) -> None:
        """Deliveries of ``topic``: ``send`` them once a majority answered, or take them ``back``."""
        self._waiting.append((topic, send, back))
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            while self._waiting:
                # those added while the question is out wait for the next: it is asked after they were chosen
                asked = len(self._waiting)
                heard = await self._ask(self._timeout)
                batch, self._waiting = self._waiting[:asked], self._waiting[asked:]
                for topic, send, back in batch:
                    # a fence that closed meanwhile (this node was stopped, or is hearing back
                    # from its peers after a minority) has the last word
                    (send if heard and not self._fence.holds(topic) else back)()
                if not heard:
                    await self._regain()

    async def _regain(self) -> None:
        """Hold every replicated topic (what is waiting goes back) until a majority answers."""
        self._fence.doubt = True
        log.warning("REPLICATION: no majority of the cluster answered (within %.1fs): replicated topics "
                    "hold delivery until one does", self._timeout)
        try:
            batch, self._waiting = self._waiting, []
            for _topic, _send, back in batch:
                back()
            while not await self._ask(self._timeout):
                await trio.sleep(PROBE_INTERVAL)
            log.info("REPLICATION: a majority of the cluster answers again: replicated topics deliver")
        finally:
            self._fence.doubt = False
            self._reopened()
