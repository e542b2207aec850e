"""Publishing: how a publish request (PUB, MPUB, DPUB, ``/pub``, ``/mpub``) becomes messages
in a topic: fresh ids and timestamps, keys remembered and journaled, copies on other nodes
first (``--replicas``), large batches a piece at a time, durable ones answered once synced.

:class:`Publisher` is the broker's (:class:`~broker.core.broker.Broker` answers publishes
through it); it sees the topics it is handed and the node's keys, ids and replication, and
reports disk failures to the broker's health (:class:`Health`). Who imports whom: the broker
imports this module; it imports the topic and what is below it, never the broker.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from itertools import repeat
from typing import Protocol

import trio

from broker.core.guid import GuidFactory
from broker.core.host import Copies, CoreHost
from broker.core.keys import KeyStore, TopicKeys
from broker.core.message import Message, now_ns
from broker.core.topic import Topic
from broker.protocol import Publish
from diskqueue import DiskQueueClosed, DiskQueueError

__all__ = ["Publisher", "PublishStopped", "Health", "PUBLISH_PIECE", "write_seq"]

log = logging.getLogger("pynsqd.broker")

#: The most messages of one publish queued in one go. A larger batch (an MPUB of a million
#: one-byte bodies fits in the default --max-body-size) is queued a piece at a time, the
#: other tasks running between pieces: a piece takes about a millisecond.
PUBLISH_PIECE = 2048
_NS_PER_MS = 1_000_000


class PublishStopped(Exception):
    """A publish was not queued, or stopped part way: its topic was deleted (or is being), or the
    broker is exiting. nsqd's word for it is ``exiting``."""


class Health(Protocol):
    """Where the publisher reports its disk writes: a failure (``/ping`` says so) and a topic
    whose disk took a write again (one to memory says nothing of the disk)."""

    def disk_failed(self, exc: Exception) -> None: ...

    def disk_written(self, topic: Topic, written: int) -> None: ...


def write_seq(topic: Topic) -> int:
    """The record number the topic's disk queue writes next (0 for a topic without one)."""
    backend = topic.backend
    return backend.write_seq if backend is not None else 0


class Publisher:
    """Publishes to the topics it is given. ``topics``: the broker's registry (a topic no longer
    there was deleted); ``starting``: the topics waiting for their channels before they take
    messages (the broker's; a publish waits too); ``exiting`` is set by the broker when it
    stops (a publish in pieces stops between pieces)."""

    def __init__(self, host: CoreHost, keys: KeyStore, guid: GuidFactory, health: Health,
                 topics: dict[str, Topic], starting: dict[str, trio.Event]):
        self._host = host
        self._topics = topics
        self._keys = keys
        self._guid = guid
        self._health = health
        self._starting = starting
        self.exiting = False

    def publish(self, topic: Topic, request: Publish) -> tuple[int, Awaitable[int | None] | None]:
        """Publish ``request`` (PUB, MPUB, DPUB, ``/pub``, ``/mpub``) to ``topic`` as one batch of
        new messages: each gets a fresh id and the current wall-clock timestamp; ``defer_ms`` > 0
        makes them deferred by that long; with ``keys``, a message whose key ``topic`` stored
        within ``--dedup-window`` is not stored again. Returns how many were such duplicates,
        and None when the batch is queued already (the common case: no coroutine is made), else
        what must be awaited to finish it: in durable mode the batch is answered once on stable
        storage (sharing one fsync with every publisher waiting at the same moment); the first
        publish to a new topic once the channels the listeners know for it exist (as nsqd's); a
        publish with ``--replicas`` once its copies are held (the awaitable returns how many
        more of its messages were duplicates of keys other nodes know); a batch of more than
        :data:`PUBLISH_PIECE` bodies is queued a piece at a time, with a checkpoint between
        pieces, so that a huge MPUB does not hold the other connections (messages of other
        publishers may come between its pieces, as they can in nsqd).

        Raises (or the awaitable raises) :class:`DiskQueueError`, after marking the
        broker unhealthy, if a disk write fails (nothing of that piece is queued; the
        pieces before it stay, as nsqd keeps the messages of an MPUB put before the one
        refused) or, in durable mode, if the sync fails (the batch may still be
        delivered); :class:`PublishStopped` if the topic was deleted before the publish (an
        HTTP body read meanwhile), or it is deleted or the broker exits before a piece is
        queued; :class:`~broker.core.host.CopiesRefused` when too few nodes took a copy. A
        topic deleted while the publish waits for its sync ends the wait: the messages were
        queued before the delete, which removed them.

        ``priorities`` (one per body, see :mod:`broker.core.ranking`): the first that is not
        ``--default-priority`` makes the topic rank its channels from then on.
        """
        if topic.exiting:
            raise PublishStopped("exiting")  # a topic deleted while its publisher read the body
        defer_ns = request.defer_ms * _NS_PER_MS
        if request.keys is not None:
            return self._put_keyed(topic, request.bodies, request.keys, defer_ns, request.priorities)
        return 0, self._put(topic, request.bodies, defer_ns, request.priorities)

    def _put(self, topic: Topic, bodies: list[bytes], defer_ns: int,
             priorities: list[int] | None) -> Awaitable[int | None] | None:
        """Queue ``bodies`` (see :meth:`publish`): None when they are queued, else what to await."""
        ranks = self._ranks(topic, priorities) if priorities is not None else None
        copies = self._host.copies
        if copies.replicas(topic.name) > 1:
            return self._publish_copied(copies, topic, self._new_messages(bodies, defer_ns, ranks))
        if topic.wait_stored is not None or topic.name in self._starting or len(bodies) > PUBLISH_PIECE:
            return self.put_in_pieces(topic, bodies, defer_ns, ranks=ranks)
        written = write_seq(topic)
        try:
            topic.put_many(self._new_messages(bodies, defer_ns, ranks))
        except DiskQueueError as exc:
            self._health.disk_failed(exc)
            raise
        self._health.disk_written(topic, written)
        return None

    def _ranks(self, topic: Topic, priorities: list[int]) -> list[int | None] | None:
        """What the messages of a publish carry for ``priorities``: None for the default (each,
        or all when every one is); the topic ranks once one is not."""
        default = self._host.options.default_priority
        if all(p == default for p in priorities):
            return None
        topic.rank()
        return [None if p == default else p for p in priorities]

    def _put_keyed(self, topic: Topic, bodies: list[bytes], keys: list[bytes], defer_ns: int,
                   priorities: list[int] | None) -> tuple[int, Awaitable[int | None] | None]:
        """:meth:`_put` for messages with keys (``b""``: unkeyed): those whose key ``topic``
        stored within ``--dedup-window`` are not stored. Returns how many were such
        duplicates, and what must be awaited before the answer, as :meth:`publish` does.

        Keys are remembered before their messages are queued and forgotten again if that
        fails. With ``--durable`` each key's journal record (naming its message's record
        number) is written just before the message's own record, with no other task
        between, and the answer waits until both are on stable storage; a batch of only
        duplicates waits for the topic's sync, which covers the messages they duplicate
        (published a moment ago, perhaps). Without ``--durable`` the keys are journaled
        when the broker stops (see :mod:`broker.core.keys`).

        With ``--replicas`` the other nodes are asked too (see :meth:`_publish_copied`): until
        they answered, the new keys are pending (:attr:`TopicKeys.pending`), and a node asking
        about them meanwhile is told this node does not know them yet.
        """
        store = self._keys
        topic_keys = topic.key_store()
        stored, expires = store.admit(topic_keys, keys, now_ns())
        kept, kept_keys, kept_priorities = bodies, keys, priorities
        duplicates = 0 if stored is None else len(bodies) - sum(stored)
        if duplicates:
            assert stored is not None
            kept = [body for body, new in zip(bodies, stored) if new]
            kept_keys = [key for key, new in zip(keys, stored) if new]
            if priorities is not None:
                kept_priorities = [p for p, new in zip(priorities, stored) if new]
        copies = self._host.copies
        waiting: list[bytes] = []
        pending: Awaitable[int | None]
        if kept and copies.replicas(topic.name) > 1:
            ranks = self._ranks(topic, kept_priorities) if kept_priorities is not None else None
            messages = self._new_messages(kept, defer_ns, ranks)
            waiting = [key for key in kept_keys if key]
            topic_keys.pending.update(waiting)
            pending = self._publish_copied(copies, topic, messages, kept_keys, expires,
                                           journaled=topic_keys.commit is not None)
        elif topic_keys.commit is None:
            try:
                published = self._put(topic, kept, defer_ns, kept_priorities) if kept else None
            except BaseException:
                store.forget(topic_keys, keys, stored)
                raise
            if published is None:
                return duplicates, None
            pending = published
        elif kept:
            ranks = self._ranks(topic, kept_priorities) if kept_priorities is not None else None
            pending = self.put_in_pieces(topic, kept, defer_ns, kept_keys, expires, ranks)
        else:
            assert topic.wait_stored is not None
            pending = topic.wait_stored()
        return duplicates, self._keyed_stored(topic_keys, keys, stored, pending, waiting)

    async def _keyed_stored(self, topic_keys: TopicKeys, keys: list[bytes], stored: list[bool] | None,
                            pending: Awaitable[int | None], waiting: list[bytes]) -> int | None:
        try:
            return await pending
        except BaseException:
            self._keys.forget(topic_keys, keys, stored)
            raise
        finally:
            topic_keys.pending.difference_update(waiting)

    async def _publish_copied(self, copies: Copies, topic: Topic, messages: list[Message],
                              keys: list[bytes] | None = None, expires: int = 0, *, journaled: bool = False) -> int:
        """A publish to a topic with replicas: ``messages`` are queued here once the other
        nodes hold their copies (raises :class:`CopiesRefused` when too few do); the copies
        are taken back if queueing them fails. With ``keys``, the messages whose key another
        node knows are duplicates: not queued, their copies taken back, their keys forgotten
        here (they are the other node's); returns how many. ``journaled``: the keys of the
        rest are journaled (``--durable``)."""
        if keys is None:
            await copies.store(topic.name, messages)
            found = 0
        else:
            known = await copies.store(topic.name, messages, keys=keys, expires=expires)
            found = len(known) and self._drop_known(copies, topic, messages, keys, known)
            if found:
                messages = [msg for msg, key in zip(messages, keys) if key not in known]
                keys = [key for key in keys if key not in known]
        if not messages:
            return found
        try:
            await self.put_in_pieces(topic, [], 0, keys if journaled else None, expires, messages=messages)
        except BaseException:
            copies.abandon(topic.name, messages)
            raise
        return found

    def _drop_known(self, copies: Copies, topic: Topic, messages: list[Message], keys: list[bytes],
                    known: set[bytes]) -> int:
        """Take back the copies of the messages whose key is ``known`` elsewhere, forget their keys
        here and count them as duplicates; returns how many."""
        copies.abandon(topic.name, [msg for msg, key in zip(messages, keys) if key in known])
        topic_keys = topic.keys
        assert topic_keys is not None
        duplicates = [key for key in keys if key in known]
        self._keys.forget(topic_keys, duplicates, None)
        topic_keys.duplicates += len(duplicates)
        return len(duplicates)

    async def put_in_pieces(self, topic: Topic, bodies: list[bytes], defer_ns: int,
                                 keys: list[bytes] | None = None, expires: int = 0,
                                 ranks: list[int | None] | None = None,
                                 messages: list[Message] | None = None) -> None:
        starting = self._starting.get(topic.name)
        if starting is not None:
            await starting.wait()
        written = write_seq(topic)
        any_journaled = False
        try:
            for start in range(0, len(messages) if messages is not None else len(bodies), PUBLISH_PIECE):
                if start:
                    await trio.lowlevel.checkpoint()
                # the first piece too: the topic may have been deleted while the publish waited
                if self.exiting or topic.exiting:
                    raise PublishStopped("exiting")  # nsqd's word for a put to a topic gone
                end = start + PUBLISH_PIECE
                piece = (messages[start:end] if messages is not None else
                         self._new_messages(bodies[start:end], defer_ns, ranks[start:end] if ranks is not None else None))
                if keys is None:
                    topic.put_many(piece)
                    continue
                piece_keys = keys[start:end]
                topic_keys, backend = topic.keys, topic.backend
                assert topic_keys is not None and backend is not None
                journaled = topic_keys.journal_before(piece_keys, piece, backend.write_seq, expires)
                any_journaled = any_journaled or journaled
                try:
                    topic.put_many(piece)
                except BaseException:
                    if journaled:
                        topic_keys.cancel(piece_keys, topic.name)
                    raise
            if topic.wait_stored is not None:
                await topic.wait_stored()
                await self._host.wait_metadata_persisted()  # a topic created by this publish
            if any_journaled:
                assert topic.keys is not None and topic.keys.commit is not None
                await topic.keys.commit.wait()
        except DiskQueueError as exc:
            if isinstance(exc, DiskQueueClosed) and self._topics.get(topic.name) is not topic:
                # the topic was deleted while the publish waited for its sync: the messages were
                # queued before the delete, which removed them with the topic's files
                return
            self._health.disk_failed(exc)
            raise
        self._health.disk_written(topic, written)

    def _new_messages(self, bodies: list[bytes], defer_ns: int,
                      ranks: list[int | None] | None = None) -> list[Message]:
        timestamp = now_ns()
        due = timestamp + defer_ns if defer_ns else 0
        ids = self._guid.next_ids(len(bodies))
        if ranks is not None:
            return list(map(Message, ids, bodies, repeat(timestamp), repeat(0), repeat(due), ranks))
        return list(map(Message, ids, bodies, repeat(timestamp), repeat(0), repeat(due)))

