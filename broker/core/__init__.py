"""The domain: topics, channels, messages and the broker's registry, with no I/O of their own.

The core imports nothing above it (no storage, server, HTTP or metrics): what it
needs from its owner comes in at construction as the narrow interfaces of
:mod:`broker.core.host`, so a :class:`Topic` or :class:`Channel` can be built
alone with fakes and run on Trio's mock clock.
"""

from broker.core.broker import Broker
from broker.core.channel import Channel
from broker.core.host import BrokerStorage, CoreHost, MetadataStore, QueueStore, Subscriber
from broker.core.message import Message
from broker.core.spill import SpillQueue
from broker.core.topic import Topic

__all__ = ["Broker", "BrokerStorage", "Channel", "CoreHost", "Message", "MetadataStore", "QueueStore",
           "SpillQueue", "Subscriber", "Topic"]
