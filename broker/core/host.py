"""What the core needs from its owner, as narrow interfaces handed over at construction.

Topics and channels never see the broker, the server or the storage package:
a :class:`CoreHost` gives them the options, the :class:`QueueStore` their disk
queues come from, and the three callbacks they report to (a failed disk
write, a metadata change, waiting for the metadata file). Channels see their
consumers only as :class:`Subscriber` (the server's client connection
satisfies it). Whoever creates a topic or channel also passes the callback
run when an ephemeral one becomes empty, as nsqd passes ``deleteCallback``.
The broker itself receives its data directory as a :class:`BrokerStorage`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from broker.config.options import Options
from broker.core.latency import LatencyStream

if TYPE_CHECKING:
    from broker.core.message import Message
    from diskqueue import DiskQueue

__all__ = ["BrokerStorage", "Copies", "CopiesRefused", "CoreHost", "Fence", "MetadataStore", "NoCopies",
           "OPEN", "OpenFence", "PeerState", "QueueStore", "RegistryChange", "RegistryListener", "Subscriber"]


class Subscriber(Protocol):
    """A consumer subscribed to a channel, as the channel uses it.

    The channel puts messages in flight with :meth:`send_messages` (which
    counts them in ``in_flight_count``), keeps the counters up to date as they
    are finished, requeued or time out, and calls :meth:`wake_writer` once per
    dispatch so the frames go out together. It gives a subscriber no more
    frames at once than :meth:`output_room` allows.
    """

    rdy: int
    in_flight_count: int
    msg_timeout: float
    sample_rate: int
    finish_count: int
    requeue_count: int
    timeout_count: int
    #: The lease token negotiated in IDENTIFY (None: messages belong to the connection).
    lease: str | None

    @property
    def lease_owner(self) -> str:
        """Who the subscriber is, for its leases: a lease is settled only by its owner
        (the AUTH identity with auth servers configured, else "" for every subscriber)."""
        ...

    def send_messages(self, msgs: list[Message]) -> None: ...

    def wake_writer(self) -> None: ...

    def ready_for_more(self) -> bool: ...

    def output_room(self) -> int:
        """Bytes of message frames the subscriber's output buffer takes before it is full."""
        ...

    def unsent(self, msgs: list[Message]) -> list[Message]:
        """Those of ``msgs`` whose frames were never wholly handed to the socket: not an attempt."""
        ...

    def close_soon(self) -> None: ...


class QueueStore(Protocol):
    """Where disk queues live; names are chosen by the core (``topic``, ``topic:channel``, ``...#buried``)."""

    def open(self, name: str, *, auto_commit: bool = True, min_record: int = ...) -> DiskQueue:
        """The disk queue ``name``, recovered from any existing files; ``min_record``: the shortest
        record it holds (a message's by default)."""
        ...

    def exists(self, name: str) -> bool:
        """Whether the disk queue ``name`` has files."""
        ...

    def list_directory(self) -> None:
        """List the directory once, before start-up opens every queue at once: queues opened
        (and stashes taken) from then on find their files in that listing."""
        ...

    def take_stash(self, name: str) -> list[bytes]:
        """The records :meth:`stash` saved under ``name`` by the previous run, removed from disk ([] if none)."""
        ...

    async def stash(self, name: str, records: list[bytes]) -> None:
        """Shutdown: write ``records`` under ``name`` for :meth:`take_stash` at the next start."""
        ...

    def drop_stash(self, name: str) -> None:
        """Remove whatever is stashed under ``name``."""
        ...


class MetadataStore(Protocol):
    """The metadata file (which topics and channels exist); ``entries`` builds its content when written."""

    def load(self) -> list[dict]: ...

    def changed(self) -> None: ...

    async def wait_persisted(self) -> None: ...

    async def persist(self, entries: Callable[[], list[dict]]) -> None: ...

    async def run(self, entries: Callable[[], list[dict]], on_error: Callable[[str], None]) -> None: ...


class BrokerStorage(Protocol):
    """The broker's data directory: held locked while the broker runs, holding its queues and metadata file."""

    @property
    def path(self) -> Path: ...

    @property
    def queues(self) -> QueueStore: ...

    @property
    def metadata(self) -> MetadataStore: ...

    def lock(self) -> None: ...

    async def import_nsqd_queues(self) -> None:
        """Bring the queue files an nsqd left in the directory into the broker's own queues
        (after :meth:`lock`, before any queue opens)."""
        ...

    def unlock(self) -> None: ...


class RegistryChange(NamedTuple):
    """A topic (``channel`` None) or a channel was created or deleted (nsqd's ``Notify``)."""

    topic: str
    channel: str | None
    created: bool


class PeerState(NamedTuple):
    """One remote registry a :class:`RegistryListener` keeps informed, as ``/metrics`` shows it."""

    address: str
    connected: bool


class RegistryListener(Protocol):
    """Something the broker keeps informed of its topics and channels (e.g. nsqlookupd peers).

    Methods are called from the broker's task and must not block; ``channels_for`` runs
    before a new topic starts delivering, so its answer decides which channels get the
    topic's first messages.
    """

    def registry_changed(self, change: RegistryChange) -> None: ...

    def options_changed(self, options: Options) -> None: ...

    async def channels_for(self, topic: str) -> list[str]: ...

    def peer_states(self) -> list[PeerState]: ...


#: The most nodes a topic's messages can be held by (``POST /topic/create?replicas=``).
MAX_REPLICAS = 64


class CopiesRefused(Exception):
    """A publish could not be stored on as many nodes as its topic's replicas; the message says how many took it."""


class Copies(Protocol):
    """Replication as the core sees it (``--replicas``, :mod:`broker.replication`), chosen when
    the broker is made: :class:`NoCopies` for one replica.

    A publish to a topic with more than one replica waits for :meth:`store` (its messages,
    ids given, held by that many nodes) before it is queued here; :meth:`abandon` takes
    back the copies of messages that were then not queued. Channels report what they
    finished, so that the other holders can drop their copies, and what they delivered or
    requeued, so that a takeover queues each message with its attempts and due time.
    """

    def replicas(self, topic: str) -> int: ...

    def configure(self, topic: str, replicas: int | None) -> None:
        """Give ``topic`` a number of replicas of its own (None: the node's ``--replicas``).
        Raises ValueError for more than one where this node keeps no copies."""
        ...

    async def store(self, topic: str, messages: list[Message], *, keys: list[bytes] | None = None,
                    expires: int = 0) -> set[bytes]:
        """Returns once every copy is held; raises :class:`CopiesRefused`. With ``keys`` (one per
        message, ``b""``: none; the window ends at ``expires``): returns those of them another
        node, or this one's copies of others' messages, knows (their messages are duplicates)."""
        ...

    def abandon(self, topic: str, messages: list[Message]) -> None: ...

    def finished(self, topic: str, channel: str, messages: list[Message]) -> None:
        """The channel finished ``messages`` (the other holders drop their copies)."""
        ...

    def confirm(self, topic: str, send: Callable[[], None], back: Callable[[], None]) -> None:
        """A channel of ``topic`` (with more than one replica) chose messages for a subscriber:
        ``send`` writes them, once a majority of the cluster hears this node, or ``back`` puts
        them back in its queue (they must not be delivered: a node that does not hear this one
        may take them over)."""
        ...

    def delivered(self, topic: str, channel: str, messages: list[Message]) -> None:
        """The channel delivered ``messages`` (their attempts counted): should this node die
        before they are finished, they come back with that attempt counted, as a timeout here
        would count it."""
        ...

    def requeued(self, topic: str, channel: str, messages: list[Message]) -> None:
        """``messages`` went back to the channel's queue (REQ, a timeout, a kick), ready or
        deferred: their attempts and due times as they are now."""
        ...

    def counters(self, topic: str) -> tuple[int, int, int, int, int, int] | None:
        """For ``/stats``: replicas, copies held for other nodes, copies waiting for
        confirmation, messages taken over, publishes refused, copies missing (None: no
        replication)."""
        ...

    def node_stats(self) -> dict | None:
        """For ``/stats``: the node's id, its peers and the copies it holds, as JSON values
        (None: no replication)."""
        ...

    def forget_member(self, node: str) -> bool:
        """An operator says ``node`` is gone for good: it no longer counts in the cluster's
        majorities. False when it is not a member (this node never is)."""
        ...


class NoCopies:
    """The :class:`Copies` of a node without replication (``--replicas=1``): every topic has one
    replica, so nothing is stored elsewhere and nothing is reported."""

    __slots__ = ()

    def replicas(self, topic: str) -> int:
        return 1

    def configure(self, topic: str, replicas: int | None) -> None:
        if replicas is not None and replicas > 1:
            raise ValueError("this node keeps no copies: start it with --replicas or --replication-secret-file")

    async def store(self, topic: str, messages: list[Message], *, keys: list[bytes] | None = None,
                    expires: int = 0) -> set[bytes]:
        raise AssertionError("a topic with one replica stores no copies")

    def abandon(self, topic: str, messages: list[Message]) -> None:
        pass

    def finished(self, topic: str, channel: str, messages: list[Message]) -> None:
        pass

    def confirm(self, topic: str, send: Callable[[], None], back: Callable[[], None]) -> None:
        send()

    def delivered(self, topic: str, channel: str, messages: list[Message]) -> None:
        pass

    def requeued(self, topic: str, channel: str, messages: list[Message]) -> None:
        pass

    def counters(self, topic: str) -> None:
        return None

    def node_stats(self) -> None:
        return None

    def forget_member(self, node: str) -> bool:
        return False


class Fence(Protocol):
    """Whether a topic's channels may deliver now (``--replicas``); chosen when the broker is
    made: :data:`OPEN` for one replica."""

    def holds(self, topic: str) -> bool: ...


class OpenFence:
    """The :class:`Fence` of a node without replication: never holds."""

    __slots__ = ()

    def holds(self, topic: str) -> bool:
        return False


#: The fence of every node without replication.
OPEN = OpenFence()


def _nobody_listens(change: RegistryChange) -> None:
    pass


@dataclass(frozen=True, slots=True)
class CoreHost:
    """Everything a topic or channel receives from its owner."""

    options: Options
    queues: QueueStore
    #: a disk write or sync failed: reported (``/ping``) until a write succeeds
    disk_failed: Callable[[Exception], None]
    #: the set of topics and channels or a channel's setting changed
    metadata_changed: Callable[[], None]
    #: returns once the metadata file reflects every change made before the call
    wait_metadata_persisted: Callable[[], Awaitable[None]]
    #: a topic or channel was created or deleted
    registry_changed: Callable[[RegistryChange], None] = _nobody_listens
    #: the channels that may have in-flight or deferred messages (each adds itself when one
    #: of its timer heaps gets an entry; the owner's scanner removes those that have none)
    timed: set[Any] = field(default_factory=set)
    #: replication (``--replicas``): channels report their finished messages to it
    copies: Copies = field(default_factory=NoCopies)
    #: whether channels may deliver (replication holds them while this node may be taken for gone)
    fence: Fence = OPEN

    def latency_stream(self) -> LatencyStream:
        """A new end-to-end latency stream as the options configure it."""
        opts = self.options
        return LatencyStream(tuple(opts.e2e_processing_latency_percentiles), opts.e2e_processing_latency_window_time)
