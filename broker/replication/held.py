"""The copies this node holds for other nodes, and what it took over from them.

Everything is a record appended to one disk queue (``replication/`` in the data directory),
msgpack arrays replayed in order at start:

- ``["A", origin, topic, holders, [id, ...], entries]`` copies added; ``entries`` is the
  msgpack array of their entries (see :mod:`.wire`), kept as the origin packed it; a
  seventh item, when there, is the channels that had finished each copy already
- ``["F", origin, topic, channel, [id, ...]]``     a channel of ``origin`` finished them
- ``["D", origin, topic, [id, ...]]``              copies dropped
- ``["C", origin, topic, [channel, ...]]``         ``origin``'s channels of the topic
- ``["T", origin, topic, [id, ...], time_ns]``     this node took these over from ``origin``
  (``time_ns``, when: a takeover is remembered for :data:`TAKEN_RETENTION`)
- ``["U", origin, topic, [id, ...]]``              ``origin`` learnt of those takeovers: no
  need to say them again
- ``["H", origin, topic, holders, [id, ...]]``     these copies are held by ``holders`` now
  (``origin`` made copies again elsewhere: see :mod:`.recopy`)

Memory holds, per copy, its holders and the channels that finished it, never its body: a
takeover reads the bodies back from the log, a batch of records at a time
(:meth:`HeldCopies.entries`), so neither a start nor a takeover holds the whole log.

When the log holds four times more records than a compaction would write (live copies,
and the channel lists and takeovers kept), and more than :data:`COMPACT_MIN`, it is
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
from pathlib import Path

import trio

from broker.core.durability.groupcommit import GroupCommit
from broker.replication.wire import (
    MAX_ANSWER_IDS,
    WireError,
    check_channel,
    check_channels,
    check_holders,
    check_ids,
    check_node,
    check_topic,
    message_of,
    pack,
    pack_entries,
    unpack,
    unpack_entries,
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
_QUEUE = "replicas"


class TopicCopies:
    """The copies of one topic held for one origin: each id's holders (one tuple shared by a
    whole ADD) and, for those some channel finished, which channels did."""

    __slots__ = ("holders", "done")

    def __init__(self) -> None:
        self.holders: dict[bytes, tuple[str, ...]] = {}
        self.done: dict[bytes, set[str]] = {}

    def __len__(self) -> int:
        return len(self.holders)

    def discard(self, msg_id: bytes) -> None:
        if self.holders.pop(msg_id, None) is not None:
            self.done.pop(msg_id, None)


class HeldCopies:
    """The copies held for every origin node, replayed from ``<data>/replication`` (see the
    module docstring). Made by :meth:`open`; the owner closes it with :meth:`close`."""

    def __init__(self, data_path: Path, *, durable: bool, max_record: int):
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
    async def open(cls, data_path: Path, *, durable: bool, max_record: int) -> HeldCopies:
        """The copies held under ``data_path``, the log replayed a batch at a time."""
        held = cls(data_path, durable=durable, max_record=max_record)
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
            record = _checked(unpack(data))
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
            dones: list[list[str] | None] | None = None) -> None:
        """Hold copies: ``entries`` is the msgpack array of their entries (see :mod:`.wire`);
        ``dones``: the channels that finished each already (a copy made at a takeover)."""
        record = ["A", origin, topic, holders, ids, entries]
        if dones is not None and any(dones):
            record.append([done or [] for done in dones])
        self._write(record)

    def finish(self, origin: str, topic: str, channel: str, ids: list[bytes]) -> None:
        copies = self.copies(origin, topic)
        if copies and any(msg_id in copies.holders for msg_id in ids):
            self._write(["F", origin, topic, channel, ids])

    def drop(self, origin: str, topic: str, ids: list[bytes], *, by: str | None = None) -> None:
        """Drop copies; with ``by``, only those ``by`` holds too (what it may say it took over)."""
        copies = self.copies(origin, topic)
        if not copies:
            return
        if by is not None:
            ids = [msg_id for msg_id in ids if by in copies.holders.get(msg_id, ())]
        if any(msg_id in copies.holders for msg_id in ids):
            self._write(["D", origin, topic, ids])

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
                for msg_id in record[4]:
                    if msg_id not in copies.holders:
                        continue
                    done = copies.done.get(msg_id)
                    if done is None:
                        done = copies.done[msg_id] = set()
                    done.add(channel)
                    if channels and done.issuperset(channels):
                        copies.discard(msg_id)
        elif kind in ("D", "T"):
            if copies:
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
                holders = tuple(record[3])
                for msg_id in record[4]:
                    if msg_id in copies.holders:
                        copies.holders[msg_id] = holders
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
        copies, and takeovers."""
        channels = sum(1 for origin, topics in self.channels.items() for topic in topics
                       if self.copies(origin, topic))
        return channels + sum(len(ids) // TAKEN_PIECE + 1 for topics in self.taken.values() for ids in topics.values())

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
            for origin, lists in self.channels.items():
                for topic, channels in lists.items():
                    if self.copies(origin, topic):
                        fresh.put(pack(["C", origin, topic, channels]))
                        written += 1
            self._forget_old_takeovers()
            for origin, taken in self.taken.items():
                for topic, ids in taken.items():
                    when = self.taken_at.get((origin, topic), time.time_ns())
                    ordered = sorted(ids)
                    for start in range(0, len(ordered), TAKEN_PIECE):  # each record within the log's bound
                        fresh.put(pack(["T", origin, topic, ordered[start:start + TAKEN_PIECE], when]))
                        written += 1
            for records in self.queue.scan(SCAN_BATCH):
                for data in records:
                    written += self._copy_live(data, fresh)
                await trio.lowlevel.checkpoint()
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

    def _copy_live(self, data: bytes, fresh: DiskQueue) -> int:
        """Copy the live copies of an ``A`` record to ``fresh``, with the channels that finished
        each; 1 if a record was written."""
        try:
            record = unpack(data)
            copies = self.copies(record[1], record[2]) if record[0] == "A" else None
            if not copies:
                return 0
            ids = [msg_id for msg_id in record[4] if msg_id in copies.holders]
            if not ids:
                return 0
            items = {item[0]: item for item in unpack_entries(record[5]) if item[0] in copies.holders}
        except (WireError, LookupError, TypeError, ValueError):
            return 0  # what cannot be read back now could not be taken over either
        kept = [msg_id for msg_id in ids if msg_id in items]
        if not kept:
            return 0
        holders = {copies.holders[msg_id] for msg_id in kept}
        written = 0
        for group in holders:  # one record per holder list (a record carries one)
            group_ids = [msg_id for msg_id in kept if copies.holders[msg_id] == group]
            entries = pack_entries([message_of(items[msg_id]) for msg_id in group_ids])
            dones = [sorted(copies.done.get(msg_id, ())) for msg_id in group_ids]
            fresh.put(pack(["A", record[1], record[2], list(group), group_ids, entries, dones]))
            written += 1
        return written

    async def close(self) -> None:
        try:
            await self.queue.sync()
        except DiskQueueError as exc:
            log.error("REPLICATION: sync at close failed: %s", exc)
        await self.queue.close()


#: Each kind of record: how to check the fields after the kind, origin and topic.
_RECORD_FIELDS = {
    "A": (check_holders, check_ids, bytes, None),
    "F": (check_channel, check_ids),
    "D": (check_ids,),
    "C": (check_channels,),
    "T": (lambda ids: check_ids(ids, MAX_ANSWER_IDS), int),
    "U": (lambda ids: check_ids(ids, MAX_ANSWER_IDS),),
    "H": (check_holders, check_ids),
}


def _checked(record: object) -> list:
    """``record`` when it is one this module writes (see the module docstring); else raises
    :class:`WireError`. An ``A`` record's entries were checked when they arrived."""
    if type(record) is not list or len(record) < 3 or record[0] not in _RECORD_FIELDS:
        raise WireError(f"not a record: {record!r:.80}")
    checks = _RECORD_FIELDS[record[0]]
    rest = record[3:]
    optional = 1 if checks[-1] in (None, int) else 0  # an A record's done channels, a T record's time
    if not len(checks) - optional <= len(rest) <= len(checks):
        raise WireError(f"a {record[0]} record with {len(record)} fields")
    check_node(record[1])
    check_topic(record[2])
    for check, value in zip(checks, rest):
        if check is bytes:
            if type(value) is not bytes:
                raise WireError("entries must be bytes")
        elif check is int:
            if type(value) is not int:
                raise WireError("a takeover's time must be an integer")
        elif check is None:  # an A record's done channels, one list per copy
            if type(value) is not list or len(value) != len(record[4]):
                raise WireError("done channels: one list per copy")
            for done in value:
                check_channels(done)
        else:
            check(value)
    return record
