"""Majorities: whether this node reaches more than half of the cluster's members
(:mod:`.members`), and whether a majority agrees that a node is gone.

No two sides of a partition both reach a majority of the same members, so:

- a node takes over another's messages only when it reaches a majority and a majority of the
  members (this node among them) does not reach the other node (:meth:`Quorum.agree_gone`),
  asked at that moment with a GONE request: a node that comes back into view of one member
  is not taken for gone by another that cannot see it yet;
- a node delivers a replicated topic's messages only once a majority of the members, this
  node among them, answered that they reach it, asked after the messages were chosen
  (:meth:`Quorum.confirm`, :mod:`.confirm`): a node cut off delivers nothing more at once;
- a node that has not reached a majority for half of ``--replica-timeout``, or has heard
  nothing from a majority for that long (two heartbeats at least: :meth:`Quorum.silent`),
  holds the delivery of its replicated topics (:mod:`.fence`): its messages may be taken
  over by the majority, after a whole ``--replica-timeout`` of silence, and once the
  majority's links to it gave up on it (two and a half heartbeats of silence). Silence
  counts: through a partition that drops packets, each side keeps its connections open
  until their heartbeats give up, and the majority may take over as soon as they do;
- a publish refused while some holder may have stored its copies is answered only once this
  node reaches a majority again (:meth:`Quorum.wait_majority`): until then that holder might
  be in a majority that takes the copies over, and the publish delivered (then each holder
  says whether it did, see :mod:`.refused`).

With two nodes, a node alone is never a majority: it neither takes over nor delivers its
replicated topics until the other comes back (or is forgotten by an operator).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from broker.replication.answers import decode_gone_answer
from broker.replication.links import PeerLink
from broker.replication.members import Members
from broker.replication.peers import Peers
from broker.replication.wire import Gone, WireError

__all__ = ["Quorum", "ASK_TIMEOUT"]

log = logging.getLogger("pynsqd.replication")

#: Seconds a GONE question waits for the peers' answers.
ASK_TIMEOUT = 1.0


class Quorum:
    """Majorities of ``members`` over ``peers``; ``timeout`` is ``--replica-timeout``."""

    def __init__(self, members: Members, peers: Peers, timeout: float):
        self.members = members
        self._peers = peers
        self._timeout = timeout
        self._majority = True  # as at the start: the fence holds anyway until the peers answered
        self.majority_since = trio.current_time()  # when a majority was last reached
        self._started = self.majority_since
        self._regained = trio.Event()

    def reachable(self) -> set[str]:
        """The members this node reaches now (itself included)."""
        me = self.members.me
        return {node for node in self.members.nodes if node == me or self._peers.reachable(node)}

    def tick(self) -> float:
        """Look again; how long this node has been without a majority (0 while it has one)."""
        now = trio.current_time()
        has = self.members.majority(self.reachable())
        if has:
            self.majority_since = now
            if not self._majority:
                log.info("REPLICATION: this node reaches a majority of the cluster's %d nodes again",
                         len(self.members))
                self._regained.set()
                self._regained = trio.Event()
        elif self._majority:
            log.warning("REPLICATION: this node reaches %d of the cluster's %d nodes, no majority: it takes "
                        "nothing over, and its replicated topics hold delivery after %.1fs",
                        len(self.reachable()), len(self.members), self._timeout / 2)
        self._majority = has
        return 0.0 if has else now - self.majority_since

    def silent(self) -> float:
        """Seconds since this node last heard from a majority of the members (itself among them)."""
        now = trio.current_time()
        members = self.members
        heard = sorted((now if node == members.me else self._peers.last_heard(node, self._started)
                        for node in members.nodes), reverse=True)
        return now - heard[len(heard) // 2]  # the latest time more than half of them had been heard

    def has_majority(self) -> bool:
        return self._majority

    async def wait_majority(self) -> None:
        """Return once this node reaches a majority (at once if it does)."""
        while not self._majority:
            await self._regained.wait()

    async def agree_gone(self, node: str) -> bool:
        """Whether a majority of the members, this node among them, does not reach ``node`` now
        (each peer asked; one that does not answer within :data:`ASK_TIMEOUT` does not agree)."""
        if not self.members.majority(self.reachable()):
            return False
        half = self._timeout / 2
        return self.members.majority(await self._ask(
            node, ASK_TIMEOUT, lambda reaches, silent: not reaches and (silent is None or silent >= half), early=False))

    async def confirm(self, timeout: float) -> bool:
        """Whether a majority of the members, this node among them, answers now that it reaches
        this node (asked with GONE of it; False after ``timeout``): see :mod:`.confirm`."""
        if not self.members.majority(self.reachable()):
            return False
        return self.members.majority(await self._ask(self.members.me, timeout, lambda reaches, _silent: reaches,
                                                     early=True))

    async def _ask(self, node: str, timeout: float, says: Callable[[bool, float | None], bool], *,
                   early: bool) -> set[str]:
        """This node and the members whose answer to GONE of ``node`` ``says`` so: each connected
        member but ``node`` is asked at once; returns once every answer came, or ``timeout``
        passed, or (``early``) they are a majority."""
        members = self.members
        agree = {members.me}
        links = [link for link in self._peers.connected() if link.peer_id in members and link.peer_id != node]

        async def ask(link: PeerLink) -> None:
            waiter = link.request(Gone(node))
            await waiter.done.wait()
            if waiter.error is None:
                try:
                    reaches, silent = decode_gone_answer(waiter.extra)
                except WireError:
                    return
                if says(reaches, silent):
                    agree.add(link.peer_id or "")
                    if early and members.majority(agree):
                        scope.cancel()

        with trio.move_on_after(timeout) as scope:
            async with trio.open_nursery() as nursery:
                for link in links:
                    nursery.start_soon(ask, link)
        return agree
