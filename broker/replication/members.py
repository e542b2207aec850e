"""The cluster as this node knows it: the nodes it has proven itself to (and they to it), each
with the address it was last reached at, kept in ``replication.members`` in the data directory.

A majority of these members (this node among them) is what it takes to decide that a node
is gone (:mod:`.takeover`) and what a node needs to keep delivering (:mod:`.fence`): two sides
of a partition cannot both have one. A node joins when a link to it, or from it, is proven.
It leaves only when it is known dead: another node id answers at its address (it came back
wiped, as a new node), or an operator says so (``POST /replication/forget``). So a node that
is merely unreachable, stopped or partitioned away keeps counting, and the others cannot
take its messages over without a majority that does not include it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from broker.protocol.replica import is_valid_node_id
from diskqueue.checkpoint import replace_durably

__all__ = ["Members"]

log = logging.getLogger("pynsqd.replication")

_FILE = "replication.members"


class Members:
    """The members, this node (``me``) first; read from and written to ``data_path``."""

    def __init__(self, data_path: Path, me: str):
        self._path = data_path / _FILE
        self.me = me
        #: node id -> the address ("host:port") it was last reached at ("" not known)
        self.nodes: dict[str, str] = {me: ""}
        try:
            found = json.loads(self._path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.error("REPLICATION: %s cannot be read (%s): this node knows no other member", self._path, exc)
            return
        if isinstance(found, dict):
            for node, address in found.items():
                if is_valid_node_id(node) and isinstance(address, str):
                    self.nodes[node] = address

    def __contains__(self, node: object) -> bool:
        return node in self.nodes

    def __len__(self) -> int:
        return len(self.nodes)

    def proven(self, node: str, address: str) -> None:
        """A link to or from ``node`` (reached at ``address``, "" when it dialled) was proven:
        it is a member, and a member that answered at that address before is not (it came
        back as this new node)."""
        changed = False
        if address:
            for other, at in list(self.nodes.items()):
                if at == address and other not in (node, self.me):
                    del self.nodes[other]
                    changed = True
                    log.info("REPLICATION: node %s answers at %s, where node %s did: %s is no longer a member",
                             node, address, other, other)
        known = self.nodes.get(node)
        now_at = address or known or ""
        if known != now_at:
            self.nodes[node] = now_at
            changed = True
        if changed:
            self._save()

    def forget(self, node: str) -> bool:
        """An operator said ``node`` is gone for good; whether it was a member."""
        if node == self.me or node not in self.nodes:
            return False
        del self.nodes[node]
        self._save()
        log.warning("REPLICATION: node %s is no longer a member (an operator said so)", node)
        return True

    def majority(self, reachable: set[str]) -> bool:
        """Whether this node and the members in ``reachable`` are more than half of the members."""
        count = sum(1 for node in self.nodes if node == self.me or node in reachable)
        return 2 * count > len(self.nodes)

    def _save(self) -> None:
        replace_durably(str(self._path), json.dumps(self.nodes, sort_keys=True).encode())
