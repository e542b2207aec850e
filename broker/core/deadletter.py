"""A channel's dead letters: messages that used up their delivery attempts.

nsqd re-delivers a message forever and leaves giving up to the client
(nsqio/nsq#591, #974). A channel with a maximum number of attempts instead
moves a message that would be delivered once more than that into its *buried*
set (beanstalkd's word), where it waits untouched until an operator kicks it
back to the ready queue (with its attempts reset, so it gets a fresh series
of deliveries) or deletes it. The set survives restarts: it is mirrored in a
:class:`~broker.core.durability.parked.ParkedStore` named ``<topic>:<channel>#buried``
(ephemeral channels keep theirs in memory only).

:class:`DeadLetterCommands`, a base class of the channel, is what an operator
does to it (``/channel/max_attempts``, ``/channel/kick``, ``/channel/delete_buried``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from broker.config.options import Options
from broker.core.durability.parked import ParkedStore
from broker.core.host import CoreHost

if TYPE_CHECKING:
    from broker.core.message import Message

__all__ = ["BuriedSet", "DeadLetterCommands"]


class BuriedSet:
    """Buried messages of one channel, in the order they were buried; owned by the channel.

    Every change goes to the store at once (a page-cache write); the
    channel's retention decides when retired records are committed (its
    :class:`~broker.core.durability.ledger.CommitLedger`).
    """

    __slots__ = ("messages", "store")

    def __init__(self, store: ParkedStore | None):
        self.messages: dict[bytes, Message] = {}
        self.store = store

    def __len__(self) -> int:
        return len(self.messages)

    def restore(self) -> None:
        """Load the set a previous run left (call once, after opening the store)."""
        if self.store is None:
            return
        for msg in self.store.load():
            self._insert(msg)

    def bury(self, msgs: list[Message]) -> None:
        """Add ``msgs`` (taken out of the ready queue or in-flight).

        Raises the store's ``DiskQueueError``; the messages are buried in
        memory all the same (a restart will not know of them).
        """
        for msg in msgs:
            msg.client = None
            msg.due_ns = 0
        try:
            if self.store is not None:
                self.store.add(msgs)
        finally:
            for msg in msgs:
                self._insert(msg)
        self._maybe_compact()

    def _insert(self, msg: Message) -> None:
        old = self.messages.pop(msg.id, None)
        if old is not None and self.store is not None:
            # the same message buried twice (re-delivered after a crash): keep the newest
            self.store.remove(old)
        self.messages[msg.id] = msg

    def peek(self, n: int) -> list[Message]:
        """The ``n`` oldest buried messages, unchanged."""
        return list(itertools.islice(self.messages.values(), n))

    def take(self, msg_id: bytes | None = None, n: int = 0) -> list[Message]:
        """Remove and return the message ``msg_id``, or else the ``n`` oldest (for a kick or delete)."""
        if msg_id is not None:
            msg = self.messages.pop(msg_id, None)
            taken = [] if msg is None else [msg]
        else:
            taken = list(itertools.islice(self.messages.values(), n))
            for msg in taken:
                del self.messages[msg.id]
        if taken and self.store is not None:
            self.store.remove_many(taken)
            self._maybe_compact()
        return taken

    def _maybe_compact(self) -> None:
        if self.store is not None and self.store.wants_compaction():
            self.store.compact(list(self.messages.values()))

    def clear(self) -> None:
        """Forget every buried message and its records."""
        self.messages.clear()
        if self.store is not None:
            self.store.clear()


class _BuriedMoves(Protocol):
    """What the dead-letter commands ask of a channel's retention."""

    def kick(self, msg_id: bytes | None, n: int) -> list[Message]: ...

    def delete_buried(self, msg_id: bytes | None, n: int) -> int: ...

    async def persist_buried(self) -> None: ...


class DeadLetterCommands:
    """A channel's dead-letter commands; what they use of the channel is declared here."""

    options: Options
    topic_name: str
    name: str
    ephemeral: bool
    max_attempts: int | None
    bury_after: int
    buried: BuriedSet
    retention: _BuriedMoves
    _host: CoreHost

    dispatch: Callable[[], None]

    def set_max_attempts(self, value: int | None) -> None:
        """Set this channel's maximum attempts (0 = never bury; None = follow ``--max-attempts``)."""
        self.max_attempts = value
        self.bury_after = self.options.max_attempts if value is None else value
        if not self.ephemeral:
            self._host.metadata_changed()

    def kick(self, msg_id: bytes | None = None, n: int = 0) -> int:
        """Move the buried message ``msg_id``, or the ``n`` oldest, back to ready.

        Kicked messages start over with 0 attempts. Returns how many moved.
        """
        moved = self.retention.kick(msg_id, n)
        if moved:
            self._host.copies.requeued(self.topic_name, self.name, moved)
            self.dispatch()
        return len(moved)

    async def persist_buried(self) -> None:
        """Make a kick or delete final on disk. Raises the queues' ``DiskQueueError``."""
        await self.retention.persist_buried()

    def delete_buried(self, msg_id: bytes | None = None, n: int = 0) -> int:
        """Drop the buried message ``msg_id``, or the ``n`` oldest. Returns how many went."""
        return self.retention.delete_buried(msg_id, n)

    def peek_buried(self, n: int) -> list[Message]:
        """The ``n`` messages buried first, unchanged."""
        return self.buried.peek(n)
