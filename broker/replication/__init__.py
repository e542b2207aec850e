"""Replication (``--replicas=N``, or a topic's own ``replicas``): every message is held by N
nodes before its publish is acknowledged, Disque's model over nsqlookupd.

Who imports whom (each only those below it):

- :mod:`.replicator` — the node's replication, made before the broker and run beside it:
  discovery through nsqlookupd, and what runs in the background.
- :mod:`.recopy` (copies made again when a holder is gone, of what :mod:`.unfinished` reads)
  and :mod:`.takeover` (the copies of a node that is gone), over the sending side
  :mod:`.copies` (the core's ``Copies``: ADD, KEYS, FIN and UPDATE to the holders); the
  holding side :mod:`.holder` (the REPL requests other nodes send);
- :mod:`.confirm` (a delivery waits until a majority answered that it hears this node) and
  :mod:`.refused` (a refused publish settles with the holders that may have its copies);
- :mod:`.fence` (when channels hold delivery) and :mod:`.quorum` (majorities of the
  :mod:`.members` of the cluster);
- :mod:`.peers` and :mod:`.links` (this node's connections to the others) and :mod:`.notice`
  (warnings a peer can cause, rate-limited);
- :mod:`.held` (the copies held for others, a log on disk) with :mod:`.copyset`,
  :mod:`.heldkeys`, :mod:`.records` and :mod:`.compaction`;
- :mod:`.wire` (the typed requests inside ``REPL``, msgpack) and :mod:`.answers` (the answers
  that carry data).
"""

from broker.replication.replicator import Replicator

__all__ = ["Replicator"]
