"""How a topic's messages reach its channels: the topic's *fan-out*, chosen once when the
topic is created, as a channel's retention is (:mod:`broker.core.retention`).

- :mod:`.plain` — :class:`Fanout`: memory spilling to disk, one message object for every
  channel (ephemeral topics, and every topic without ``--durable``);
- :mod:`.durable` — :class:`DurableFanout` (``--durable``): the topic's disk records move
  to each channel's queue and are committed once every channel's copy is stored.

Who imports whom: the topic imports this package; the fan-outs import the channel and the
stores below it (:mod:`broker.core.spill`, :mod:`broker.core.durability`), never the topic.
"""

from broker.core.fanout.durable import DurableFanout
from broker.core.fanout.plain import PUMP_BATCH, Fanout

__all__ = ["Fanout", "DurableFanout", "PUMP_BATCH"]
