"""The fate of a publish whose copies were not all stored: refused, or delivered by a holder.

A publish is refused when fewer than its topic's replicas hold copies within
``--replica-timeout``. The holders that stored a copy, and those whose answer was lost
with their connection (they may have stored one), may still take it over: this node may
be on the minority side of a partition, taken for gone by a majority. So a refusal first
settles with them (:meth:`RefusedPublishes.settle`):

1. it waits until this node reaches a majority again (until then a holder might be in a
   majority that takes the copies over);
2. it waits until each of those holders is linked, its HELLO answered on the link's current
   connection. A holder answers HELLO only once no takeover of this node is under way there
   (see :mod:`.holder`), so the answer says whether the holder took the messages over; and
   while that connection lasts, the holder reaches this node and takes nothing more over;
3. if a holder says it took them over, they are delivered there: the publish is acknowledged
   after all. Otherwise each holder is asked to drop them (a DROP, answered on that same
   connection); once every holder answered, no holder keeps them, and the publish is
   refused.

A holder that is not linked again, or does not answer, within :data:`SETTLE_WAITS` times
``--replica-timeout`` of this node reaching a majority (counted again if the node loses it
meanwhile: a refusal may begin before the node noticed it lost one), is given up on: the publish is
refused, and the DROP waits on its link until the holder is back (before it can take this
node for gone again). Such a holder can still deliver the messages, when it took them over
before it became unreachable and a majority then delivered them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable

import trio

from broker.replication.links import PeerLink
from broker.replication.wire import Drop

__all__ = ["RefusedPublishes", "SETTLE_WAITS"]

#: How many times ``--replica-timeout`` a refusal waits for its holders, once this node
#: reaches a majority again.
SETTLE_WAITS = 3
#: Seconds between two rounds of asking the holders.
RETRY = 0.1


class RefusedPublishes:
    """The refusals being settled (see the module docstring); ``has_majority`` and
    ``wait_majority`` are the quorum's, ``timeout`` ``--replica-timeout``."""

    def __init__(self, has_majority: Callable[[], bool], wait_majority: Callable[[], Awaitable[None]],
                 timeout: float):
        self._has_majority = has_majority
        self._wait_majority = wait_majority
        self._timeout = timeout
        #: ids of refusals being settled, by topic; and those a holder said it took over
        self._settling: dict[str, set[bytes]] = defaultdict(set)
        self._taken: set[bytes] = set()

    def taken(self, topic: str, ids: list[bytes]) -> None:
        """A holder's HELLO said it took ``ids`` of ``topic`` over from this node."""
        settling = self._settling.get(topic)
        if settling:
            self._taken.update(settling.intersection(ids))

    async def settle(self, topic: str, ids: list[bytes], holders: list[PeerLink]) -> bool:
        """Whether a holder took the messages ``ids`` over (True: the publish is acknowledged),
        once each of ``holders`` said so or dropped them, or was given up on (False)."""
        self._settling[topic].update(ids)
        try:
            deadline = -1.0
            while not self._taken.issuperset(ids):
                if not self._has_majority():  # (lost while settling, too: the count starts again)
                    await self._wait_majority()
                    deadline = -1.0
                now = trio.current_time()
                if deadline < 0:
                    deadline = now + SETTLE_WAITS * self._timeout
                elif now >= deadline:
                    break
                if not all(link.connected for link in holders):
                    await trio.sleep(0.01)
                    continue
                drops = [link.request(Drop(topic, ids), 17 * len(ids)) for link in holders]
                with trio.move_on_at(deadline):
                    for drop in drops:
                        await drop.done.wait()
                if all(drop.done.is_set() and drop.error is None for drop in drops):
                    break  # on the connections whose HELLO said nothing was taken: dropped everywhere
                await trio.sleep(RETRY)  # a link lost meanwhile, or a holder whose disk refused the DROP
            return self._taken.issuperset(ids)
        finally:
            settling = self._settling[topic]
            settling.difference_update(ids)
            self._taken.difference_update(ids)
            if not settling:
                del self._settling[topic]
