"""The broker: the registry of topics, the metadata file, start-up and shutdown.

Start-up: lock the data directory, read ``nsqd.dat``, recreate its topics and
channels (their disk queues, deferred and buried stores recover on open) and
start the timer scanner and the metadata writer. Shutdown
(:meth:`Broker.shutdown`, after the listeners have stopped and connections
were closed): stop the pumps, write every topic's memory queue and every
channel's memory, in-flight and deferred messages to disk (in durable mode
they are on disk already: only the committed cursors move), close the queues
(each syncs), then persist metadata.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from broker.config.options import NSQD_COMPAT_VERSION, Options
from broker.core.guid import GuidFactory
from broker.core.latency import LatencyStream
from broker.core.message import RECORD_OVERHEAD, Message, now_ns
from broker.core.topic import Topic
from broker.protocol import Limits
from broker.storage import metadata
from diskqueue import DiskQueue, DiskQueueError

if TYPE_CHECKING:
    from broker.core.channel import Channel
    from broker.server.connection import Client

__all__ = ["Broker", "DataPathLocked"]

log = logging.getLogger("pynsqd.broker")

#: Room for the deferred-record prefix (see :mod:`broker.core.message`).
_DEFERRED_PREFIX = 10


class DataPathLocked(RuntimeError):
    """Another process holds the data directory."""


class Broker:
    """Owns topics, connected clients, the metadata file and the background tasks."""

    def __init__(self, options: Options):
        self.options = options
        self.data_path = Path(options.data_path or os.getcwd()).resolve()
        self.guid = GuidFactory(options.node_id)
        self.limits = Limits(
            max_msg_size=options.max_msg_size,
            max_body_size=options.max_body_size,
            max_rdy_count=options.max_rdy_count,
            max_req_timeout_ms=int(options.max_req_timeout * 1000),
        )
        self.topics: dict[str, Topic] = {}
        self.clients: set[Client] = set()
        self.exiting = False
        self.health_error: str | None = None
        self.start_time = int(time.time())
        self._nursery: trio.Nursery | None = None
        self._metadata_dirty = trio.Event()
        self._metadata_lock = trio.Lock()
        self._metadata_version = 0  # bumped by every change
        self._metadata_saved = 0  # the version the file on disk describes
        self._metadata_written = trio.Event()
        self._lock_fd: int | None = None

    # ---------------------------------------------------------------- lifecycle

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Load the data directory and run background tasks until cancelled.

        Raises :class:`DataPathLocked` if another broker uses the directory.
        """
        self.data_path.mkdir(parents=True, exist_ok=True)
        self._lock_data_path()
        try:
            entries = metadata.load(self.data_path)
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for entry in entries:
                    topic = self.get_topic(entry["name"], persist=False)
                    topic.paused = entry["paused"]
                    for ch in entry["channels"]:
                        channel = topic.get_channel(ch["name"])
                        channel.paused = bool(ch.get("paused"))
                        max_attempts = ch.get("max_attempts")
                        if type(max_attempts) is int and max_attempts >= 0:
                            channel.set_max_attempts(max_attempts)
                await self.persist_metadata()
                nursery.start_soon(self._scan_loop)
                nursery.start_soon(self._metadata_loop)
                log.info("loaded %d topics from %s", len(entries), self.data_path)
                task_status.started()
        finally:
            self._unlock_data_path()

    def _lock_data_path(self) -> None:
        fd = os.open(self.data_path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise DataPathLocked(f"--data-path={self.data_path} in use (possibly by another instance of nsqd)")
        self._lock_fd = fd

    def _unlock_data_path(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    async def shutdown(self) -> None:
        """Write everything held in memory to disk, close the queues, persist metadata.

        Call after connections are closed; cancels the background tasks.
        """
        self.exiting = True
        for topic in self.topics.values():
            topic.close()
        for topic in list(self.topics.values()):
            await topic.close_queues()
        await self.persist_metadata()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    # ---------------------------------------------------------------- topics

    def get_topic(self, name: str, *, persist: bool = True) -> Topic:
        """The topic called ``name``, created if new (the caller validated the name)."""
        topic = self.topics.get(name)
        if topic is None:
            topic = Topic(self, name)
            self.topics[name] = topic
            self._nursery.start_soon(topic.run)
            log.info("TOPIC(%s): created", name)
            if persist and not topic.ephemeral:
                self.metadata_changed()
        return topic

    def delete_topic(self, name: str) -> None:
        """Delete a topic, its channels and their files. Raises KeyError if absent."""
        topic = self.topics[name]
        for channel_name in list(topic.channels):
            topic.delete_channel(channel_name)
        topic = self.topics.pop(name)
        topic.close()
        if topic.backend is not None:
            topic.backend.delete()
        log.info("TOPIC(%s): deleted", name)
        if not topic.ephemeral:
            self.metadata_changed()

    async def publish_bodies(self, topic: Topic, bodies: list[bytes], defer_ns: int = 0) -> None:
        """Publish ``bodies`` to ``topic`` as one batch of new messages (PUB, MPUB, DPUB, ``/pub``, ``/mpub``).

        Each gets a fresh id and the current wall-clock timestamp; ``defer_ns``
        > 0 makes them deferred by that long. Raises as :meth:`publish`.
        """
        timestamp = now_ns()
        due = timestamp + defer_ns if defer_ns else 0
        ids = self.guid.next_ids(len(bodies))
        await self.publish(topic, [Message(msg_id, body, timestamp, 0, due) for msg_id, body in zip(ids, bodies)])

    async def publish(self, topic: Topic, msgs: list[Message]) -> None:
        """Queue ``msgs`` on ``topic`` as one batch.

        In durable mode this returns only once the batch is on stable storage
        (sharing one fsync with every publisher waiting at the same moment).
        Raises :class:`DiskQueueError` (after marking the broker unhealthy) if a
        disk write fails (nothing of the batch is then queued) or, in durable
        mode, if the sync fails (the batch may still be delivered).
        """
        try:
            topic.put_many(msgs)
            if topic.group is not None:
                await topic.group.wait()
                await self.wait_metadata_persisted()  # a topic created by this publish
        except DiskQueueError as exc:
            self.disk_failed(exc)
            raise
        if self.health_error is not None and topic.backend is not None:
            self.health_error = None

    def disk_failed(self, exc: Exception) -> None:
        """Record a failed disk write or sync: logged, and ``/ping`` reports it until a write succeeds."""
        self.health_error = str(exc)
        log.error("%s", exc)

    # ---------------------------------------------------------------- disk queues

    def open_backend(self, name: str, *, auto_commit: bool = True) -> DiskQueue:
        """A disk queue for a topic, a channel or a channel's store, recovered from any existing files."""
        opts = self.options
        return DiskQueue(
            name,
            self.data_path,
            max_bytes_per_file=opts.max_bytes_per_file,
            min_msg_size=RECORD_OVERHEAD,
            max_msg_size=opts.max_msg_size + RECORD_OVERHEAD + _DEFERRED_PREFIX,
            sync_every=opts.sync_every,
            sync_timeout=opts.sync_timeout,
            auto_commit=auto_commit,
            logger=logging.getLogger(f"pynsqd.diskqueue.{name}"),
        )

    @staticmethod
    def store_name(channel: Channel, kind: str) -> str:
        """The disk queue name of a channel's ``deferred`` or ``buried`` store.

        '#' can only appear in a name as '#ephemeral', and ephemeral channels
        have no files, so this never collides with a topic's or channel's queue.
        """
        return f"{channel.topic.name}:{channel.name}#{kind}"

    async def save_deferred(self, channel: Channel, records: list[bytes]) -> None:
        """Shutdown without ``--durable``: write a channel's deferred messages for the next start."""
        store = self.open_backend(self.store_name(channel, "deferred"))
        store.put_many(records)
        await store.close()

    def restore_deferred(self, channel: Channel) -> None:
        """Load deferred messages a previous run wrote at shutdown, then drop the store."""
        name = self.store_name(channel, "deferred")
        if not any(self.data_path.glob(f"{name}.diskqueue.*")):
            return
        store = self.open_backend(name)
        records = []
        while store.depth:
            batch = store.read_many(4096)
            if not batch:
                break
            records.extend(batch)
        channel.load_deferred(records)
        store.delete()
        log.info("channel %s:%s: restored %d deferred messages", channel.topic.name, channel.name, len(records))

    def delete_deferred_store(self, channel: Channel) -> None:
        """Remove a deleted channel's leftover deferred store, if any."""
        name = self.store_name(channel, "deferred")
        for path in self.data_path.glob(f"{name}.diskqueue.*"):
            path.unlink(missing_ok=True)

    def new_latency_stream(self) -> LatencyStream:
        opts = self.options
        return LatencyStream(tuple(opts.e2e_processing_latency_percentiles), opts.e2e_processing_latency_window_time)

    # ---------------------------------------------------------------- metadata

    def metadata_changed(self) -> None:
        """Schedule a rewrite of ``nsqd.dat`` (done by the metadata task)."""
        self._metadata_version += 1
        self._metadata_dirty.set()

    async def wait_metadata_persisted(self) -> None:
        """Return once ``nsqd.dat`` reflects every change made before this call."""
        target = self._metadata_version
        while self._metadata_saved < target:
            await self._metadata_written.wait()

    def metadata_entries(self) -> list[dict]:
        """Topic entries for ``nsqd.dat``: non-ephemeral topics and channels, sorted."""
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
            entries.append({"name": name, "paused": topic.paused, "channels": channels})
        return entries

    async def persist_metadata(self) -> None:
        """Write ``nsqd.dat`` now (in a worker thread).

        Writers take turns and each serializes the state current when its turn
        comes, so the file never goes back to an older state.
        """
        async with self._metadata_lock:
            version = self._metadata_version
            payload = metadata.dump(self.metadata_entries(), NSQD_COMPAT_VERSION)
            await trio.to_thread.run_sync(metadata.save, self.data_path, payload)
            self._metadata_saved = max(self._metadata_saved, version)
            written, self._metadata_written = self._metadata_written, trio.Event()
            written.set()

    async def _metadata_loop(self) -> None:
        while True:
            await self._metadata_dirty.wait()
            self._metadata_dirty = trio.Event()
            try:
                await self.persist_metadata()
            except OSError as exc:
                self.health_error = f"failed to persist metadata - {exc}"
                log.error("%s", self.health_error)
                self._metadata_dirty.set()  # retry: durable SUBs and publishes wait for it
                await trio.sleep(1)

    # ---------------------------------------------------------------- timers

    async def _scan_loop(self) -> None:
        """Requeue expired in-flight messages and release due deferred ones."""
        interval = self.options.queue_scan_interval
        while True:
            await trio.sleep(interval)
            for topic in list(self.topics.values()):
                for channel in list(topic.channels.values()):
                    channel.process_timers()
