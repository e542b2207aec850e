"""Where a channel keeps its messages: its *retention*, chosen once when the channel is created.

A retention owns the channel's queues and stores. The channel decides where a
message goes next (ready again, deferred, retired); its retention carries
that out and answers with what happened (moved or refused), never by calling
the channel back: what it must hold back it puts in the channel's deferred
index (:class:`~broker.core.deferred.Deferred`), which it is given instead of
the channel. So the channel imports the retentions and nothing here imports
the channel.

* :class:`MemoryRetention` (ephemeral channels): a bounded memory queue,
  messages past it are dropped; deferred and buried messages live in memory.
* :class:`SpillRetention` (the default): ready messages spill to the
  channel's disk queue; at shutdown memory and in-flight messages are
  appended to it and deferred ones stashed for the next start.
* :class:`DurableRetention` (``--durable``): every message stays on disk
  until it is finished.
"""

from __future__ import annotations

from broker.core.deferred import Deferred
from broker.core.host import CoreHost
from broker.core.retention.durable import DurableRetention
from broker.core.retention.memory import RETRY_DELAY, MemoryRetention, store_name
from broker.core.retention.spilling import SpillRetention

__all__ = ["DurableRetention", "MemoryRetention", "RETRY_DELAY", "SpillRetention", "retention_for", "store_name"]


def retention_for(where: str, host: CoreHost, deferred: Deferred, *, ephemeral: bool) -> MemoryRetention:
    """The retention of the channel ``where`` (``topic:channel``) under the broker's options."""
    if ephemeral:
        return MemoryRetention(where, host, deferred)
    if host.options.durable:
        return DurableRetention(where, host, deferred)
    return SpillRetention(where, host, deferred)
