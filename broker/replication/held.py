"""The copies this node holds for other nodes, and what it took over from them.

Everything is a record appended to one disk queue (``replication/`` in the data directory),
msgpack arrays replayed in order at start:

- ``["A", origin, topic, holders, [id, ...], entries]`` copies added; ``entries`` is the
  msgpack array of their entries (see :mod:`.wire`), kept as the origin packed it; a
  seventh item, when there, is the channels that had finished each copy already
- ``["F", origin, topic, channel, [id, ...]]``     a channel of ``origin`` finished them
- ``["D", origin, topic, [id, ...]]``              copies dropped (their publish failed: their
  keys are forgotten); ``["D", origin, topic, [id, ...], 1]``: dropped because another
  holder took them over (their keys stay)
- ``["K", origin, topic, [id, ...], [key, ...], expires]``  the publish keys of copies just
  added, and when their dedup window ends (nanoseconds since the epoch; one for all, or one
  each)
- ``["C", origin, topic, [channel, ...]]``         ``origin``'s channels of the topic
- ``["T", origin, topic, [id, ...], time_ns]``     this node took these over from ``origin``
  (``time_ns``, when: a takeover is remembered for :data:`TAKEN_RETENTION`)
- ``["U", origin, topic, [id, ...]]``              ``origin`` learnt of those takeovers: no
  need to say them again
- ``["H", origin, topic, holders, [id, ...]]``     these copies are held by ``holders`` now
  (``origin`` made copies again elsewhere: see :mod:`.recopy`)
- ``["S", origin, topic, channel, [id, ...], attempts, due_ns]`` where these copies stand in
  ``origin``'s channel (an UPDATE's: delivered, or back in its queue); ``attempts`` and
  ``due_ns`` are columns as :mod:`.wire` sends them (one value for all, or one per id)

Memory holds, per copy, its holders and the channels that finished it, never its body: a
takeover reads the bodies back from the log, a batch of records at a time
(:meth:`HeldCopies.entries`), so neither a start nor a takeover holds the whole log. It also
holds, per copy and per channel that said so, the copy's attempts and due time there (the
takeover queues it in that channel as it stood), only while the copy is held and that channel
has not finished it.

The publish keys of the copies (:attr:`HeldCopies.keys`, a :class:`.heldkeys.HeldKeys`) are
kept until their dedup window ends, after their copies are finished or taken over.

When the log holds four times more records than a compaction would write (live copies,
and the channel lists, channel states and takeovers kept), and more than :data:`COMPACT_MIN`, it is
rewritten in one pass with only what is still needed: the new log is written and synced in
``replication.new`` beside it, then replaces it (a start finds at most one whole log and
finishes an interrupted swap). Records written while a compaction runs go to the new log
too, after what it copied. Channel lists of topics with no copies left are not kept: an
origin posts them again whenever its link connects.

A record that cannot be applied (not one this module writes) is logged, counted and
skipped; records the disk queue cannot read back (damage) are counted and said loudly.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing
from pathlib import Path

import trio

from broker.core.durability.groupcommit import GroupCommit
from broker.replication.compaction import compacted
from broker.replication.copyset import TopicCopies
from broker.replication.heldkeys import HeldKeys
from broker.replication.records import checked_record
from broker.replication.wire import (
    WireError,
    pack,
    packed_column,
    unpack,
    unpack_entries,
    unpacked_column,
)
from diskqueue import DiskQueue, DiskQueueError

__all__ = ["TopicCopies", "HeldCopies", "COMPACT_MIN", "SCAN_BATCH"]

log = logging.getLogger("pynsqd.replication")

#: Fewest records a log holds before it may be compacted.
COMPACT_MIN = 20_000
#: Records read back from the log in one step (other tasks run between steps).
SCAN_BATCH = 512
#: Seconds a takeover is remembered (and said in HELLO answers) when its origin never learns of
#: it: a node gone for longer comes back wiped, or has delivered what it held meanwhile.
TAKEN_RETENTION = 24 * 3600.0
#: Ids of one takeover record a compaction writes at most.
TAKEN_PIECE = 100_000
#: Ids of one ``S`` record at most (about 30 bytes each: well within a record's bound).
STATE_PIECE = 20_000
_QUEUE = "replicas"


class HeldCopies:
    """The copies held for every origin node, replayed from ``<data>/replication`` (see the
    module docstring). Made by :meth:`open`; the owner closes it with :meth:`close`."""

    def __init__(self, data_path: Path, *, durable: bool, max_record: int, max_keys: int = 1_000_000):
        self.path = data_path / "replication"
        self._new_path = data_path / "replication.new"
        self._max_record = max_record
        self._durable = durable
        #: origin -> topic -> its copies
        self.origins: dict[str, dict[str, TopicCopies]] = {}
        #: origin -> topic -> the origin's channels, and how many names that is for each origin
        self.channels: dict[str, dict[str, list[str]]] = {}
        self.channel_names: dict[str, int] = {}
        #: origin -> topic -> ids this node took over from it, and when it last took some
        self.taken: dict[str, dict[str, set[bytes]]] = {}
        self.taken_at: dict[tuple[str, str], int] = {}
        #: the publish keys of the copies (see :mod:`.heldkeys`)
        self.keys = HeldKeys(max_keys)
        #: records of the log that could not be read back (damaged on disk), since start
        self.records_lost = 0
        #: records read back that could not be applied (not what this node writes), since start
        self.records_skipped = 0
        #: copies that were held and whose entries were not found in the log at a takeover
        self.copies_lost = 0
        #: while a compaction runs: the records written meanwhile, for the new log
        self._tail: list[bytes] | None = None
        if self._new_path.exists():
            if self.path.exists():
                shutil.rmtree(self._new_path)  # a compaction that did not finish
            else:
                os.replace(self._new_path, self.path)  # one that finished all but the rename
        self.queue = self._open(self.path)
        self.commit = GroupCommit(self.queue)

    @classmethod
    async def open(cls, data_path: Path, *, durable: bool, max_record: int, max_keys: int = 1_000_000) -> HeldCopies:
        """The copies held under ``data_path``, the log replayed a batch at a time."""
        held = cls(data_path, durable=durable, max_record=max_record, max_keys=max_keys)
        try:
            depth = held.queue.depth
            read = 0
            for records in held.queue.scan(SCAN_BATCH):
                read += len(records)
                for data in records:
                    held._replay(data)
                await trio.lowlevel.checkpoint()
            held.damaged(depth - read)
        except BaseException:
            with trio.CancelScope(shield=True):
                await held.queue.close()
            raise
        return held

    def _replay(self, data: bytes) -> None:
        try:
            record = checked_record(unpack(data))
        except WireError as exc:
            self.records_skipped += 1
            log.error("REPLICATION: skipped a record of the replication log that cannot be applied: %s", exc)
            return
        self._apply(record)

    def _open(self, path: Path) -> DiskQueue:
        return DiskQueue(_QUEUE, path, max_msg_size=self._max_record, sync_every=1_000_000, logger=log)

    def damaged(self, lost: int) -> None:
        """The log came up ``lost`` records short of its depth when read back: said loudly and
        counted, once (the same damage found again counts no more)."""
        if lost > self.records_lost:
            self.records_lost = lost
            log.error("REPLICATION: the replication log in %s is damaged: %d record(s) could not be read back; "
                      "copies held for other nodes may be lost, and their messages now have fewer copies than "
                      "--replicas", self.path, lost)

    def copies(self, origin: str, topic: str) -> TopicCopies | None:
        return self.origins.get(origin, {}).get(topic)

    # ---------------------------------------------------------------- changes

    def add(self, origin: str, topic: str, holders: list[str], ids: list[bytes], entries: bytes,
            dones: list[list[str] | None] | None = None, keys: list[bytes] | None = None,
            expires: int | list[int] = 0) -> None:
        """Hold copies: ``entries`` is the msgpack array of their entries (see :mod:`.wire`);
        ``dones``: the channels that finished each already (a copy made at a takeover);
        ``keys``: their publish keys (``b""``: none), remembered until ``expires``."""
        record = ["A", origin, topic, holders, ids, entries]
        if dones is not None and any(dones):
            record.append([done or [] for done in dones])
        self._write(record)
        if keys is not None and any(keys):
            if all(keys):
                self._write(["K", origin, topic, ids, keys, expires])
            else:
                each = expires if isinstance(expires, list) else [expires] * len(ids)
                kept = [i for i, key in enumerate(keys) if key]
                self._write(["K", origin, topic, [ids[i] for i in kept], [keys[i] for i in kept],
                             [each[i] for i in kept]])

    def finish(self, origin: str, topic: str, channel: str, ids: list[bytes]) -> None:
        copies = self.copies(origin, topic)
        if copies and any(msg_id in copies.holders for msg_id in ids):
            self._write(["F", origin, topic, channel, ids])

    def drop(self, origin: str, topic: str, ids: list[bytes], *, by: str | None = None) -> None:
        """Drop copies whose publish failed (their keys are forgotten); with ``by``, those that
        ``by`` took over: only those it holds too (what it may say it took over), their keys kept."""
        copies = self.copies(origin, topic)
        if not copies:
            return
        if by is not None:
            ids = [msg_id for msg_id in ids if by in copies.holders.get(msg_id, ())]
        if any(msg_id in copies.holders for msg_id in ids):
            self._write(["D", origin, topic, ids] if by is None else ["D", origin, topic, ids, 1])

    # ---------------------------------------------------------------- keys

    def known(self, topic: str, keys: list[bytes], now_ns: int) -> list[bytes]:
        """Which of ``keys`` came with copies of ``topic`` held here, within their window."""
        return self.keys.known(topic, keys, now_ns)

    def key_of(self, origin: str, topic: str, msg_id: bytes) -> tuple[bytes, int] | None:
        """The publish key of a copy held here, and when its window ends (None: it has none)."""
        copies = self.copies(origin, topic)
        key = copies.keys.get(msg_id) if copies is not None else None
        expires = self.keys.expiry(topic, key) if key is not None else None
        return None if key is None or expires is None else (key, expires)

    def expire_keys(self, now_ns: int) -> None:
        self.keys.expire(now_ns)

    @property
    def keys_held(self) -> int:
        return self.keys.held

    @property
    def keys_evicted(self) -> int:
        return self.keys.evicted

    def update(self, origin: str, topic: str, channel: str, ids: list[bytes], attempts: list[int],
               dues: list[int]) -> None:
        """Where copies stand in ``origin``'s ``channel``: their attempts and due times there
        (those the channel finished already, or not held, are left out)."""
        copies = self.copies(origin, topic)
        if not copies:
            return
        holders, done = copies.holders, copies.done
        kept = [n for n, msg_id in enumerate(ids) if msg_id in holders and channel not in done.get(msg_id, ())]
        if len(kept) != len(ids):
            ids, attempts, dues = [ids[n] for n in kept], [attempts[n] for n in kept], [dues[n] for n in kept]
        for start in range(0, len(ids), STATE_PIECE):
            end = start + STATE_PIECE
            self._write(["S", origin, topic, channel, ids[start:end], packed_column(attempts[start:end]),
                         packed_column(dues[start:end])])

    def set_channels(self, origin: str, topic: str, channels: list[str]) -> None:
        if self.channels.get(origin, {}).get(topic) != channels:
            self._write(["C", origin, topic, channels])

    def mark_taken(self, origin: str, topic: str, ids: list[bytes]) -> None:
        self._write(["T", origin, topic, ids, time.time_ns()])

    def relist(self, origin: str, topic: str, ids: list[bytes], holders: tuple[str, ...] | None) -> list[bool]:
        """Which of ``ids`` this node holds for ``origin``; with ``holders``, those are held by
        ``holders`` from now on (written only where that changes something)."""
        copies = self.copies(origin, topic)
        known = copies.holders if copies is not None else {}
        found = [msg_id in known for msg_id in ids]
        if holders is not None:
            changed = [msg_id for msg_id in ids if known.get(msg_id, holders) != holders]
            if changed:
                self._write(["H", origin, topic, list(holders), changed])
        return found

    def held_for(self, origin: str) -> dict[str, int]:
        """How many copies this node holds for ``origin``, by topic (its topics with none left out)."""
        return {topic: len(copies) for topic, copies in self.origins.get(origin, {}).items() if len(copies)}

    def forget_taken(self, origin: str, topic: str, ids: list[bytes]) -> None:
        """``origin`` learnt that this node took ``ids`` over from it: they need not be said again."""
        taken = self.taken.get(origin, {}).get(topic)
        if taken and not taken.isdisjoint(ids):
            self._write(["U", origin, topic, ids])

    async def synced(self) -> None:
        """Returns once every change so far is on stable storage."""
        await self.commit.wait()

    def _write(self, record: list) -> None:
        data = pack(record)
        self.queue.put(data)
        if self._tail is not None:
            self._tail.append(data)
        self._apply(record)

    # ---------------------------------------------------------------- replay

    def _apply(self, record: list) -> None:
        kind, origin, topic = record[0], record[1], record[2]
        if kind == "A":
            copies = self.origins.setdefault(origin, {}).get(topic)
            if copies is None:
                copies = self.origins[origin][topic] = TopicCopies()
            copies.holders.update(dict.fromkeys(record[4], tuple(record[3])))
            if len(record) > 6:  # the channels that had finished each
                for msg_id, done in zip(record[4], record[6]):
                    if done:
                        copies.done[msg_id] = set(done)
            return
        copies = self.copies(origin, topic)
        if kind == "F":
            if copies:
                channels = self.channels.get(origin, {}).get(topic, [])
                channel = record[3]
                stated = channel in copies.state
                for msg_id in record[4]:
                    if msg_id not in copies.holders:
                        continue
                    done = copies.done.get(msg_id)
                    if done is None:
                        done = copies.done[msg_id] = set()
                    done.add(channel)
                    if stated:
                        copies.forget_state(channel, msg_id)
                    if channels and done.issuperset(channels):
                        copies.discard(msg_id)
        elif kind == "S":
            if copies:
                channel, ids = record[3], record[4]
                holders, done = copies.holders, copies.done
                if type(record[5]) is int and type(record[6]) is int:  # one state for all: one tuple
                    found = dict.fromkeys([msg_id for msg_id in ids if msg_id in holders
                                           and channel not in done.get(msg_id, ())], (record[5], record[6]))
                else:
                    found = {msg_id: (attempts, due) for msg_id, attempts, due in zip(
                        ids, unpacked_column(record[5], len(ids)), unpacked_column(record[6], len(ids)))
                        if msg_id in holders and channel not in done.get(msg_id, ())}
                if found:
                    copies.state.setdefault(channel, {}).update(found)
        elif kind in ("D", "T"):
            if copies:
                if kind == "D" and len(record) < 5:  # a publish that failed: its keys go too
                    for msg_id in record[3]:
                        key = copies.keys.get(msg_id)
                        if key is not None:
                            self.keys.forget(topic, key, origin, msg_id)
                for msg_id in record[3]:
                    copies.discard(msg_id)
            if kind == "T":
                self.taken.setdefault(origin, {}).setdefault(topic, set()).update(record[3])
                when = record[4] if len(record) > 4 else time.time_ns()
                self.taken_at[(origin, topic)] = max(self.taken_at.get((origin, topic), 0), when)
        elif kind == "U":
            topics = self.taken.get(origin, {})
            taken = topics.get(topic)
            if taken is not None:
                taken.difference_update(record[3])
                if not taken:
                    del topics[topic]
                    self.taken_at.pop((origin, topic), None)
                    if not topics:
                        del self.taken[origin]
        elif kind == "H":
            if copies:
                now_held_by = tuple(record[3])
                for msg_id in record[4]:
                    if msg_id in copies.holders:
                        copies.holders[msg_id] = now_held_by
        elif kind == "K":
            now = time.time_ns()
            expires = record[5]
            for index, (msg_id, key) in enumerate(zip(record[3], record[4])):
                expiry = expires if type(expires) is int else expires[index]
                if expiry <= now:
                    continue
                self.keys.remember(origin, topic, key, expiry, msg_id)
                if copies is not None and msg_id in copies.holders:
                    copies.keys[msg_id] = key
            self.keys.expire(now)
        elif kind == "C":
            channels = list(record[3])
            lists = self.channels.setdefault(origin, {})
            self.channel_names[origin] = self.channel_names.get(origin, 0) + len(channels) - len(lists.get(topic, ()))
            lists[topic] = channels
            if copies and channels:  # a channel gone may leave copies every other channel finished
                for msg_id in [i for i, done in copies.done.items() if done.issuperset(channels)]:
                    copies.discard(msg_id)

    async def entries(self, wanted: Mapping[tuple[str, str], set[bytes]]) -> AsyncIterator[tuple[str, str, list]]:
        """``(origin, topic, entry)`` for each copy ``wanted`` names by ``(origin, topic)``, read back
        from the log in one pass, a batch of records at a time (other tasks run between
        batches). A record that cannot be read back or unpacked is skipped (see :meth:`damaged`)."""
        left = {key: set(ids) for key, ids in wanted.items() if ids}
        depth = self.queue.depth
        read = 0
        for records in self.queue.scan(SCAN_BATCH):
            read += len(records)
            for data in records:
                try:
                    record = unpack(data)
                    ids = left.get((record[1], record[2])) if record[0] == "A" else None
                    if ids is None or ids.isdisjoint(record[4]):
                        continue
                    items = unpack_entries(record[5])
                except (WireError, LookupError, TypeError, ValueError) as exc:
                    log.error("REPLICATION: skipped a record of the replication log that cannot be read: %s", exc)
                    continue
                for item in items:
                    if item[0] in ids:
                        ids.discard(item[0])
                        yield record[1], record[2], item
                if not ids:
                    del left[(record[1], record[2])]
            if not left:
                return
            await trio.lowlevel.checkpoint()
        self.damaged(depth - read)

    # ---------------------------------------------------------------- size

    def live(self) -> int:
        return sum(len(copies) for topics in self.origins.values() for copies in topics.values())

    def held_for_topic(self, topic: str) -> int:
        return sum(len(topics.get(topic, ())) for topics in self.origins.values())

    def _kept(self) -> int:
        """Records a compaction would write besides the copies: channel lists of topics with
        copies, channel states, and takeovers."""
        channels = sum(1 for origin, topics in self.channels.items() for topic in topics
                       if self.copies(origin, topic))
        states = sum(len(ids) // STATE_PIECE + 1 for topics in self.origins.values() for copies in topics.values()
                     for ids in copies.state.values())
        return (channels + states + sum(len(ids) // TAKEN_PIECE + 1 for topics in self.taken.values()
                                        for ids in topics.values())
                + self.keys.records(TAKEN_PIECE))

    def needs_compaction(self) -> bool:
        depth = self.queue.depth
        return depth > COMPACT_MIN and depth > 4 * (self.live() + self._kept() + 1)

    async def compact(self) -> None:
        """Rewrite the log in one pass with only what is still needed (see the module docstring)."""
        if self._new_path.exists():
            shutil.rmtree(self._new_path)
        fresh = self._open(self._new_path)
        self._tail = []
        written = 0
        try:
            self._forget_old_takeovers()
            records = compacted(self.origins, self.channels, self.taken, self.taken_at, self.keys,
                                self.queue.scan(SCAN_BATCH), taken_piece=TAKEN_PIECE, state_piece=STATE_PIECE)
            async with aclosing(records):
                async for record in records:
                    fresh.put(record)
                    written += 1
            fresh.put_many(self._tail)  # what was written meanwhile, in its order
            written += len(self._tail)
            self._tail = None
            await fresh.sync()
        except BaseException:
            self._tail = None
            with trio.CancelScope(shield=True):
                await fresh.close()
            raise
        with trio.CancelScope(shield=True):
            await fresh.close()
            await self.queue.close()
            shutil.rmtree(self.path)
            os.replace(self._new_path, self.path)
        before = self.queue.write_seq
        self.queue = self._open(self.path)
        self.commit = GroupCommit(self.queue)
        log.info("REPLICATION: log compacted from %d records to %d", before, written)

    def _forget_old_takeovers(self) -> None:
        """Forget the takeovers of more than :data:`TAKEN_RETENTION` ago (compaction writes the rest)."""
        oldest = time.time_ns() - int(TAKEN_RETENTION * 1e9)
        for (origin, topic), when in list(self.taken_at.items()):
            if when < oldest:
                del self.taken_at[(origin, topic)]
                topics = self.taken.get(origin, {})
                topics.pop(topic, None)
                if not topics:
                    self.taken.pop(origin, None)

    async def close(self) -> None:
        try:
            await self.queue.sync()
        except DiskQueueError as exc:
            log.error("REPLICATION: sync at close failed: %s", exc)
        await self.queue.close()
