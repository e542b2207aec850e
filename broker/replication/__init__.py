"""Replication (``--replicas=N``): every message is held by N nodes before its publish is
acknowledged, Disque's model over nsqlookupd.

- :mod:`.wire` — what nodes send each other inside ``REPL`` (msgpack).
- :mod:`.held` — the copies this node holds for others, kept in a log on disk.
- :mod:`.links` — this node's connections to its peers.
- :mod:`.replicator` — the publishing side, the holding side, and the takeover of the
  copies of a node that is gone.
"""

from broker.replication.replicator import Replicator

__all__ = ["Replicator"]
