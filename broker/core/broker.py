"""The broker: the registry of topics and clients, start-up and shutdown; publishes go through
its :class:`~broker.core.publishing.Publisher`.

Start-up: lock the data directory, import the queue files of an nsqd that
used it before (see :mod:`broker.storage.nsqdimport`), read the metadata file, recreate its topics
and channels (their disk queues, deferred and buried stores recover on open)
and start the timer scanner and the metadata writer. Shutdown
(:meth:`Broker.shutdown`, after the listeners have stopped and connections
were closed): stop the pumps, write every topic's memory queue and every
channel's memory, in-flight and deferred messages to disk (in durable mode
they are on disk already: only the committed cursors move), close the queues
(each syncs), then persist metadata.

The data directory (:class:`~broker.core.host.BrokerStorage`) is given by
the owner; topics and channels get a :class:`~broker.core.host.CoreHost`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from operator import itemgetter
from typing import Any

import trio

from broker.config.options import Options
from broker.core.channel import Channel
from broker.core.guid import GuidFactory
from broker.core.host import (
    MAX_REPLICAS,
    OPEN,
    BrokerStorage,
    Copies,
    CoreHost,
    Fence,
    NoCopies,
    RegistryChange,
    RegistryListener,
    Subscriber,
)
from broker.core.keys import KeyStore, TopicKeys
from broker.core.maybe import Maybe
from broker.core.message import Message, now_ns
from broker.core.publishing import PUBLISH_PIECE, Publisher, PublishStopped, write_seq
from broker.core.topic import Topic
from broker.gocompat import go_quote_str
from broker.protocol import MAX_ATTEMPTS, Limits, Publish, is_ephemeral, is_valid_name
from diskqueue import DiskQueueError

__all__ = ["Broker", "ShutdownIncomplete", "PublishStopped", "PUBLISH_PIECE"]

log = logging.getLogger("pynsqd.broker")

#: How much of a bad name from a peer the log shows (a peer may send megabytes).
_SHOWN_NAME_LENGTH = 100

#: The most channels named by nsqlookupd made in one go for a new topic. Making one takes
#: about 0.1 ms, so a lookupd listing 100,000 would otherwise hold every connection for 10 s.
PEER_CHANNEL_PIECE = 64


class ShutdownIncomplete(Exception):
    """A shutdown could not write everything to disk (a full disk); the details are logged."""


class Broker:
    """Owns topics, connected clients and the background tasks; ``storage`` is its data directory;
    ``copies`` and ``fence`` are the node's replication as the core sees it (none by default)."""

    def __init__(self, options: Options, storage: BrokerStorage, copies: Copies | None = None,
                 fence: Fence = OPEN):
        self.options = options
        self.guid = GuidFactory(options.node_id)
        self.limits = Limits(
            max_msg_size=options.max_msg_size,
            max_body_size=options.max_body_size,
            max_rdy_count=options.max_rdy_count,
            max_req_timeout_ms=int(options.max_req_timeout * 1000),
        )
        self.topics: dict[str, Topic] = {}
        #: the keys of keyed publishes, of every topic (see :mod:`broker.core.keys`)
        self.keys = KeyStore(round(options.dedup_window * 1_000_000_000), options.dedup_max_keys)
        self.clients: set[Any] = set()  # the server's client connections
        self.exiting = False
        self.health_error: str | None = None
        self.start_time = now_ns() // 1_000_000_000
        self._storage = storage
        self._metadata = storage.metadata
        self.host = CoreHost(options, storage.queues, self.disk_failed, self._metadata.changed,
                             self._metadata.wait_persisted, self._registry_changed,
                             copies=copies if copies is not None else NoCopies(), fence=fence)
        self.listeners: list[RegistryListener] = []
        # topics waiting for the listeners' channels before they start (publishes wait too)
        self._starting: dict[str, trio.Event] = {}
        self._nursery: trio.Nursery | None = None
        self._storage_locked = False
        self._publisher = Publisher(self.host, self.keys, self.guid, self, self.topics, self._starting)

    # ---------------------------------------------------------------- lifecycle

    def lock_storage(self) -> None:
        """Take the data directory before :meth:`run` (which then keeps it), as nsqd locks its
        data path before it opens its listeners; nothing in it is read or written yet.

        Raises the storage's error (``DataPathLocked``) if another broker uses the directory.
        If the start goes no further, :meth:`unlock_storage` gives it back.
        """
        self._storage.lock()
        self._storage_locked = True

    def unlock_storage(self) -> None:
        """Give the data directory back (a no-op if not held): :meth:`run` does when it ends."""
        self._storage_locked = False
        self._storage.unlock()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Load the data directory and run background tasks until cancelled.

        Takes the data directory first unless :meth:`lock_storage` did; raises the storage's
        error (``DataPathLocked``) if another broker uses it.
        """
        if not self._storage_locked:
            self.lock_storage()
        try:
            await self._storage.import_nsqd_queues()
            entries = self._metadata.load()
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._storage.queues.list_directory()
                self._load(entries)
                await self._load_keys()
                await self.persist_metadata()
                nursery.start_soon(self._scan_loop)
                nursery.start_soon(self._metadata.run, self.metadata_entries, self._metadata_failed)
                log.info("loaded %d topics from %s", len(entries), self._storage.path)
                task_status.started()
        finally:
            self.unlock_storage()

    def _load(self, entries: list[dict]) -> None:
        """Recreate the topics and channels of the metadata file's ``entries``."""
        for entry in entries:
            topic = self.get_topic(entry["name"], persist=False)
            topic.paused = entry["paused"]
            if entry.get("prioritised") is True:
                topic.rank()
            if "replicas" in entry:
                try:
                    self.set_replicas(topic, entry["replicas"])
                except ValueError as exc:
                    log.warning("ignoring replicas of topic %s in nsqd.dat - %s", topic.name, exc)
            for ch in entry["channels"]:
                channel = topic.get_channel(ch["name"], restored=True)
                channel.paused = bool(ch.get("paused"))
                max_attempts = ch.get("max_attempts")
                if type(max_attempts) is int and 0 <= max_attempts <= MAX_ATTEMPTS:
                    channel.set_max_attempts(max_attempts)
                elif max_attempts is not None:
                    log.warning("ignoring max_attempts of channel %s:%s in nsqd.dat - not a count "
                                "from 0 to %d", topic.name, channel.name, MAX_ATTEMPTS)

    async def _load_keys(self) -> None:
        """Read back the journals of publish keys (see :mod:`broker.core.keys.journal`): the live
        keys are remembered in expiry order over every topic; in durable mode they are written
        again and the journals' older records committed."""
        read: list[tuple[int, TopicKeys, bytes]] = []
        journals: list[TopicKeys] = []
        for topic in self.topics.values():
            try:
                topic_keys = topic.key_store(restored=True)
            except KeyError:
                continue
            journals.append(topic_keys)
            found = topic_keys.read_back(write_seq(topic), topic.name)
            if found and topic.backend is not None and topic.backend.damage_found:
                TopicKeys.drop_keys_of_lost_messages(found, topic.backend, topic.name)
            read.extend((expires, topic_keys, key) for key, (expires, _, _) in found.items())
        if not journals:
            return
        read.sort(key=itemgetter(0))
        live = self.keys.remember(read, now_ns())
        expiries = self.keys.expiries() if self.options.durable else {}
        for topic_keys in journals:
            journal = topic_keys.journal
            assert journal is not None
            journal.commit()
            live_keys = expiries.get(topic_keys)
            if live_keys:
                topic_keys.write_live(live_keys)
            await journal.sync()
        log.info("loaded %d publish keys of %d topics", live, len(journals))

    def _save_keys(self) -> None:
        """Shutdown without ``--durable``: write every topic's live keys to its journal."""
        if self.options.durable or not self.keys.held:
            return
        for topic_keys, live_keys in self.keys.expiries().items():
            if topic_keys.journal is None:  # an ephemeral topic's
                continue
            try:
                topic_keys.write_live(live_keys)
            except DiskQueueError as exc:
                log.error("%s: could not write its publish keys: %s", topic_keys.journal.name, exc)

    async def shutdown(self) -> None:
        """Write everything held in memory to disk, close the queues, persist metadata.

        Call after connections are closed; cancels the background tasks. A queue the
        disk refuses does not stop the others; raises :class:`ShutdownIncomplete` at
        the end when anything could not be written.
        """
        self.exiting = self._publisher.exiting = True
        for topic in self.topics.values():
            topic.close()
        lost = 0
        self.keys.expire(now_ns())
        self._save_keys()
        for topic in list(self.topics.values()):
            lost += await topic.close_queues()
        problems = []
        if lost:
            problems.append(f"{lost} messages could not be written to disk")
        try:
            await self.persist_metadata()
        except OSError as exc:
            log.error("writing the metadata file failed: %s", exc)
            problems.append(f"the metadata file could not be written ({exc})")
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
        if problems:
            raise ShutdownIncomplete("; ".join(problems) + " (see the errors above)")

    # ---------------------------------------------------------------- topics

    def get_topic(self, name: str, *, persist: bool = True) -> Topic:
        """The topic called ``name``, created if new (the caller validated the name)."""
        topic = self.topics.get(name)
        if topic is None:
            assert self._nursery is not None, "the broker is not running"
            topic = Topic(name, self.host, on_empty=lambda: self.delete_topic(name))
            self.topics[name] = topic
            log.info("TOPIC(%s): created", name)
            if persist and self.listeners:
                started = self._starting[name] = trio.Event()
                self._nursery.start_soon(self._start_topic, topic, started)
            else:
                self._nursery.start_soon(topic.run)
            if persist and not topic.ephemeral:
                self.metadata_changed()
            self._registry_changed(RegistryChange(name, None, created=True))
        return topic

    async def _start_topic(self, topic: Topic, started: trio.Event) -> None:
        """Create the channels the listeners know for a new topic, then start it.

        Until it starts, the topic keeps what is published to it, so every channel
        known elsewhere in the cluster gets its first messages (as nsqd does).
        """
        try:
            for listener in list(self.listeners):
                for count, channel_name in enumerate(await listener.channels_for(topic.name), 1):
                    if count % PEER_CHANNEL_PIECE == 0:
                        await trio.lowlevel.checkpoint()
                    if topic.exiting:
                        return
                    self._create_peer_channel(topic, channel_name)
        finally:
            if self._starting.get(topic.name) is started:
                del self._starting[topic.name]
            started.set()
        if not topic.exiting:
            await topic.run()

    def subscribe(self, topic_name: str, channel_name: str, client: Subscriber) -> tuple[Channel, Maybe[None]]:
        """Subscribe ``client`` to a channel (SUB), creating the topic and the channel if new.

        Returns the channel and what must be awaited before the subscription is answered,
        or None: in durable mode, the metadata naming the channel on stable storage (a
        channel a crash forgets would take its queue and dead letters with it until
        someone subscribes again). Raises ``DiskQueueError`` (reported) when the
        channel's files cannot be opened, and the channel's fatal ``E_SUB_FAILED`` errors.
        """
        try:
            channel = self.get_topic(topic_name).get_channel(channel_name)
        except DiskQueueError as exc:
            self.disk_failed(exc)
            raise
        channel.add_client(client)
        return channel, self.wait_metadata_persisted() if self.options.durable else None

    @staticmethod
    def _create_peer_channel(topic: Topic, name: str) -> None:
        """Create a channel a peer named, if the name is one a client could give.

        A name is checked as a client's is (nsqd creates whatever lookupd lists), and a
        channel whose files cannot be made is logged and left out: a peer's word never
        stops the topic, nor loses what it was given.
        """
        if not is_valid_name(name):
            shown = go_quote_str(name[:_SHOWN_NAME_LENGTH])
            if len(name) > _SHOWN_NAME_LENGTH:
                shown += f"... ({len(name)} characters)"
            log.warning("TOPIC(%s): skipping invalid channel name %s from nsqlookupd", topic.name, shown)
            return
        if is_ephemeral(name):  # nobody consumes it here yet
            return
        try:
            topic.get_channel(name)
        except DiskQueueError as exc:
            log.error("TOPIC(%s): failed to create channel %s named by nsqlookupd - %s", topic.name, name, exc)

    def listen(self, listener: RegistryListener) -> None:
        """Keep ``listener`` informed of topics and channels created and deleted, and of new options."""
        self.listeners.append(listener)

    def reconfigure(self, options: Options) -> None:
        """Replace the options (``PUT /config``) and tell the listeners."""
        self.options = options
        for listener in list(self.listeners):
            listener.options_changed(options)

    def _registry_changed(self, change: RegistryChange) -> None:
        for listener in self.listeners:
            listener.registry_changed(change)

    @property
    def keeps_copies(self) -> bool:
        """This node takes part in replication: a topic may have more than one replica."""
        return not isinstance(self.host.copies, NoCopies)

    def set_replicas(self, topic: Topic, replicas: int | None) -> None:
        """Give ``topic`` a number of replicas of its own (None: the node's ``--replicas``), used
        from its next publish on. Raises ValueError for a number out of 1 to
        :data:`MAX_REPLICAS`, or above one where this node keeps no copies."""
        if replicas is not None and not (type(replicas) is int and 1 <= replicas <= MAX_REPLICAS):
            raise ValueError(f"not a number of nodes from 1 to {MAX_REPLICAS}")
        self.host.copies.configure(topic.name, replicas)
        topic.replicas = replicas
        if not topic.ephemeral:
            self.metadata_changed()

    def delete_topic(self, name: str) -> None:
        """Delete a topic, its channels and their files. Raises KeyError if absent."""
        topic = self.topics[name]
        for channel_name in list(topic.channels):
            topic.delete_channel(channel_name)
        topic = self.topics.pop(name)
        topic.close()
        topic.delete_queues()
        self.host.copies.configure(name, None)
        log.info("TOPIC(%s): deleted", name)
        if not topic.ephemeral:
            self.metadata_changed()
        self._registry_changed(RegistryChange(name, None, created=False))

    def publish(self, topic: Topic, request: Publish) -> tuple[int, Awaitable[int | None] | None]:
        """Publish ``request`` to ``topic`` (see :meth:`Publisher.publish`): how many of its
        messages were duplicates of keys the topic stored, and what to await before the
        answer (None: nothing; it returns how many more were duplicates, or None)."""
        return self._publisher.publish(topic, request)

    async def put_taken(self, topic_name: str, channels: list[str],
                        messages: list[tuple[Message, list[str] | None]]) -> None:
        """Queue messages taken over from a node that is gone (``--replicas``): the topic and
        ``channels`` are created if missing (and so announced to nsqlookupd); a message
        given None goes through the topic to every channel, one given channel names only to
        those channels (the others had finished it, or get their own copy of it: a message
        is queued with its attempts and due time, which may differ between channels).
        Returns once they are stored as any publish is (on stable storage with ``--durable``)."""
        topic = self.get_topic(topic_name)
        for name in channels:
            topic.get_channel(name)
        whole = [msg for msg, only in messages if only is None]
        if whole:
            await self._publisher.put_in_pieces(topic, [], 0, messages=whole)
        ready: dict[Channel, list[Message]] = {}  # each channel's, put in one go
        for msg, only in messages:
            for name in only or ():
                channel = topic.get_channel(name)
                if msg.due_ns:
                    channel.put_deferred(msg.copy())
                    ready.setdefault(channel, [])
                else:
                    ready.setdefault(channel, []).append(msg.copy())
        for channel, msgs in ready.items():
            if msgs:
                channel.put_many(msgs)
        for channel in ready:
            await channel.wait_durable()

    def disk_written(self, topic: Topic, written: int) -> None:
        """Clear the health error once the disk took a write again (one to memory says nothing of it)."""
        if self.health_error is not None and topic.backend is not None and topic.backend.write_seq != written:
            self.health_error = None

    def disk_failed(self, exc: Exception) -> None:
        """Record a failed disk write or sync: logged, and ``/ping`` reports it until a write succeeds."""
        self.health_error = str(exc)
        log.error("%s", exc)

    # ---------------------------------------------------------------- metadata

    def metadata_changed(self) -> None:
        """Schedule a rewrite of the metadata file (done by its writer task)."""
        self._metadata.changed()

    async def wait_metadata_persisted(self) -> None:
        """Return once the metadata file reflects every change made before this call."""
        await self._metadata.wait_persisted()

    async def persist_metadata(self) -> None:
        """Write the metadata file now. Raises OSError."""
        await self._metadata.persist(self.metadata_entries)

    def _metadata_failed(self, error: str) -> None:
        self.health_error = error
        log.error("%s", error)

    def metadata_entries(self) -> list[dict]:
        """Topic entries for the metadata file: non-ephemeral topics and channels, sorted."""
        entries = []
        for name in sorted(self.topics):
            topic = self.topics[name]
            if topic.ephemeral:
                continue
            channels = []
            for ch_name in sorted(topic.channels):
                channel = topic.channels[ch_name]
                if channel.ephemeral:
                    continue
                entry = {"name": ch_name, "paused": channel.paused}
                if channel.max_attempts is not None:
                    entry["max_attempts"] = channel.max_attempts
                channels.append(entry)
            entry = {"name": name, "paused": topic.paused, "channels": channels}
            if topic.ranked:
                entry["prioritised"] = True
            if topic.replicas is not None:
                entry["replicas"] = topic.replicas
            entries.append(entry)
        return entries

    # ---------------------------------------------------------------- timers

    def _expire_keys(self) -> None:
        """Forget the keys whose window ended, and commit their records in the journals."""
        now = now_ns()
        self.keys.expire(now)
        for topic in list(self.topics.values()):
            if topic.keys is not None:
                try:
                    topic.keys.commit_expired(now)
                except DiskQueueError as exc:
                    self.disk_failed(exc)

    async def _scan_loop(self) -> None:
        """Requeue expired in-flight messages and release due deferred ones."""
        interval = self.options.queue_scan_interval
        timed = self.host.timed  # an idle channel is not visited: an idle broker costs nothing here
        keys_due = 0.0
        while True:
            await trio.sleep(interval)
            now = trio.current_time()
            if now >= keys_due and self.keys.held:
                keys_due = now + 1.0
                self._expire_keys()
            for channel in list(timed):
                if channel.exiting:
                    timed.discard(channel)
                    continue
                channel.process_timers()
                if not (channel.in_flight_timers or channel.deferred.timers):
                    timed.discard(channel)
