"""What a snapshot reads from the running broker, as structural types.

The broker, its topics, channels and client connections are defined in the core and the
server; observe only reads some of their attributes, named here, so it depends on no
server module and a test can hand it plain objects.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence, Sized
from typing import Any, Protocol, SupportsInt

from broker.config.options import Options
from broker.core.host import RegistryListener

__all__ = ["LatencySource", "ClientSource", "QueueSource", "ChannelSource", "TopicSource", "BrokerSource"]


class LatencySource(Protocol):
    """An e2e latency stream: the quantiles it keeps and its current result."""

    @property
    def percentiles(self) -> tuple[float, ...]: ...

    def snapshot(self) -> dict[str, Any]:
        """``{"count": n, "percentiles": [{"quantile": q, "value": ns}, ...] | None}``."""
        ...


class ClientSource(Protocol):
    """A V2 client connection (``deflate``, ``snappy``, ``tls``, ``tls_version``,
    ``tls_cipher_suite``, ``authed``, ``auth_identity`` and ``auth_identity_url`` are read
    when present)."""

    @property
    def number(self) -> int: ...
    @property
    def client_id(self) -> str: ...
    @property
    def hostname(self) -> str: ...
    @property
    def remote_address(self) -> str: ...
    @property
    def user_agent(self) -> str: ...
    @property
    def state(self) -> SupportsInt: ...
    @property
    def rdy(self) -> int: ...
    @property
    def in_flight_count(self) -> int: ...
    @property
    def message_count(self) -> int: ...
    @property
    def finish_count(self) -> int: ...
    @property
    def requeue_count(self) -> int: ...
    @property
    def connect_ts(self) -> float: ...
    @property
    def sample_rate(self) -> int: ...
    @property
    def pub_counts(self) -> Mapping[str, int]: ...


class QueueSource(Protocol):
    """What topics and channels both report: name, queued messages, counters, pause, latency."""

    @property
    def name(self) -> str: ...
    @property
    def depth(self) -> int: ...
    @property
    def backend_depth(self) -> int: ...
    @property
    def message_count(self) -> int: ...
    @property
    def paused(self) -> bool: ...
    @property
    def e2e(self) -> LatencySource | None: ...


class ChannelSource(QueueSource, Protocol):
    """A channel (``fin_latency``, a ``LatencyHistogram``, is read when present)."""

    @property
    def in_flight(self) -> Sized: ...
    @property
    def deferred(self) -> Sized: ...
    @property
    def buried(self) -> Sized: ...
    @property
    def bury_after(self) -> int: ...
    @property
    def requeue_count(self) -> int: ...
    @property
    def timeout_count(self) -> int: ...
    @property
    def ranked(self) -> bool: ...
    def priority_levels(self) -> list[tuple[int, int]]: ...
    @property
    def clients(self) -> Collection[Any]:
        """The channel's subscribers: the core knows them only as ``Subscriber``; each is a
        server connection, which has every attribute of :class:`ClientSource`."""
        ...


class KeysSource(Protocol):
    """A topic's keyed publishes: the keys it remembers, and its counters."""

    @property
    def held(self) -> Sized: ...
    @property
    def received(self) -> int: ...
    @property
    def duplicates(self) -> int: ...


class KeyStoreSource(Protocol):
    """The broker's publish keys over all topics."""

    @property
    def held(self) -> int: ...
    @property
    def evicted(self) -> int: ...


class TopicSource(QueueSource, Protocol):
    """A topic and its channels by name."""

    @property
    def message_bytes(self) -> int: ...
    @property
    def channels(self) -> Mapping[str, ChannelSource]: ...
    @property
    def keys(self) -> KeysSource | None: ...


class BrokerSource(Protocol):
    """The broker: its options, health, topics by name and connected clients."""

    @property
    def options(self) -> Options: ...
    @property
    def health_error(self) -> str | None: ...
    @property
    def start_time(self) -> int: ...
    @property
    def topics(self) -> Mapping[str, TopicSource]: ...
    @property
    def clients(self) -> Collection[ClientSource]: ...
    @property
    def listeners(self) -> Sequence[RegistryListener]: ...
    @property
    def keys(self) -> KeyStoreSource: ...
