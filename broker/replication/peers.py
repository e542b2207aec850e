"""The other nodes as this one knows them: its links to them, their connections to it, and
whether each is reachable now.

A node is *reachable* while a link to it is up (this node dialled it, :mod:`.links`) or a
connection from it is open and proven (it dialled this node). It is *gone* once it has been
unreachable for ``--replica-timeout``, counted from the last bytes heard from it on any
connection, so a paused node is gone that long after it fell silent, not after the
heartbeats gave up on it and then some.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Protocol

import trio

from broker.replication.links import PeerLink, Waiter
from broker.replication.wire import Request

__all__ = ["Inbound", "Peers"]


class Inbound(Protocol):
    """A proven connection from another node (the TCP server's client)."""

    #: when it last received bytes (trio time)
    last_read: float


class Peers:
    """This node's links and the proven connections of other nodes; owned by the replicator."""

    def __init__(self) -> None:
        #: this node's links, by the address the lookupds list
        self.links: dict[tuple[str, int], PeerLink] = {}
        self._inbound: dict[str, set[Inbound]] = defaultdict(set)
        self._heard: dict[str, float] = {}  # when a closed connection from a node last received bytes
        self._changed = trio.Event()  # set (and replaced) when a link connects

    # ---------------------------------------------------------------- connections from nodes

    def opened(self, node: str, connection: Inbound) -> None:
        self._inbound[node].add(connection)

    def closed(self, node: str, connection: Inbound, last_heard: float) -> None:
        self._inbound[node].discard(connection)
        self._heard[node] = max(self._heard.get(node, last_heard), last_heard)

    # ---------------------------------------------------------------- links

    def connected(self) -> list[PeerLink]:
        """The links up, whose node is known."""
        return [link for link in self.links.values() if link.connected and link.peer_id is not None]

    def link_connected(self) -> None:
        """A link came up: whoever waits for peers (:meth:`wait_changed`) looks again."""
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self) -> None:
        """Return once a link has come up."""
        await self._changed.wait()

    def post(self, request: Request, size: int = 0) -> None:
        """Deliver ``request`` to every node linked, at least once (see :meth:`PeerLink.post`)."""
        for link in self.links.values():
            link.post(request, size)

    def ask(self, request: Request, size: int = 0) -> list[tuple[PeerLink, Waiter]]:
        """Send ``request`` to every node linked: a request (answered) to those connected, each
        returned with its waiter, a post to the others (delivered once they are back)."""
        asked = []
        for link in self.links.values():
            if link.connected and link.peer_id is not None:
                asked.append((link, link.request(request, size)))
            else:
                link.post(request, size)
        return asked

    # ---------------------------------------------------------------- reachability

    def reachable(self, node: str) -> bool:
        if self._inbound.get(node):
            return True
        return any(link.connected and link.peer_id == node for link in self.links.values())

    def last_heard(self, node: str, default: float) -> float:
        """When this node last received bytes from ``node`` on any connection (``default`` if never)."""
        times = [link.last_heard for link in self.links.values() if link.peer_id == node]
        times.extend(connection.last_read for connection in self._inbound.get(node, ()))
        if node in self._heard:
            times.append(self._heard[node])
        return max(times, default=default)
