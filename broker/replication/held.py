"""The copies this node holds for other nodes, and what it took over from them.

Everything is a record appended to one disk queue (``replication/`` in the data directory),
msgpack arrays replayed in order at start:

- ``["A", origin, topic, holders, [id, ...], entries]`` copies added; ``entries`` is the
  msgpack array of their entries (see :mod:`.wire`), kept as the origin packed it
- ``["F", origin, topic, channel, [id, ...]]``     a channel of ``origin`` finished them
- ``["D", origin, topic, [id, ...]]``              copies dropped
- ``["C", origin, topic, [channel, ...]]``         ``origin``'s channels of the topic
- ``["T", origin, topic, [id, ...]]``              this node took these over from ``origin``

Memory holds, per copy, its holders and the channels that finished it, never its body: a
takeover reads the bodies back from the log. (A compacted ``A`` record has a seventh item:
the channels that had finished each copy.) When the log holds four times more records
than live copies (and more than :data:`COMPACT_MIN`), it is rewritten with only what is
still needed: the new log is written and synced in ``replication.new`` beside it, then
replaces it (a start finds at most one whole log and finishes an interrupted swap).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from broker.core.durability.groupcommit import GroupCommit
from broker.replication.wire import (
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

__all__ = ["TopicCopies", "HeldCopies", "COMPACT_MIN"]

log = logging.getLogger("pynsqd.replication")

#: Fewest records a log holds before it may be compacted.
COMPACT_MIN = 20_000
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
    """The copies held for every origin node, replayed from ``<data>/replication`` (see the module docstring)."""

    def __init__(self, data_path: Path, *, durable: bool, max_record: int):
        self.path = data_path / "replication"
        self._new_path = data_path / "replication.new"
        self._max_record = max_record
        self._durable = durable
        #: origin -> topic -> its copies
        self.origins: dict[str, dict[str, TopicCopies]] = {}
        #: origin -> topic -> the origin's channels
        self.channels: dict[str, dict[str, list[str]]] = {}
        #: origin -> topic -> ids this node took over from it
        self.taken: dict[str, dict[str, set[bytes]]] = {}
        if self._new_path.exists():
            if self.path.exists():
                shutil.rmtree(self._new_path)  # a compaction that did not finish
            else:
                os.replace(self._new_path, self.path)  # one that finished all but the rename
        self.queue = self._open(self.path)
        self.commit = GroupCommit(self.queue)
        #: records of the log that could not be read back (damaged on disk), since start
        self.records_lost = 0
        #: records read back that could not be applied (not what this node writes), since start
        self.records_skipped = 0
        #: copies that were held and whose entries were not found in the log at a takeover
        self.copies_lost = 0
        depth = self.queue.depth
        records = self.queue.peek_many(depth)
        for data in records:
            try:
                record = _checked(unpack(data))
            except WireError as exc:
                self.records_skipped += 1
                log.error("REPLICATION: skipped a record of the replication log that cannot be applied: %s", exc)
                continue
            self._apply(record)
        self.damaged(depth - len(records))

    def _open(self, path: Path) -> DiskQueue:
        return DiskQueue(_QUEUE, path, max_msg_size=self._max_record, sync_every=1_000_000, logger=log)

    def damaged(self, lost: int) -> None:
        """``lost`` records of the log could not be read back: said loudly, and counted."""
        if lost > 0:
            self.records_lost += lost
            log.error("REPLICATION: the replication log in %s is damaged: %d record(s) could not be read back; "
                      "copies held for other nodes may be lost, and their messages now have fewer copies than "
                      "--replicas", self.path, lost)

    def copies(self, origin: str, topic: str) -> TopicCopies | None:
        return self.origins.get(origin, {}).get(topic)

    # ---------------------------------------------------------------- changes

    def add(self, origin: str, topic: str, holders: list[str], ids: list[bytes], entries: bytes) -> None:
        """Hold copies: ``entries`` is the msgpack array of their entries (see :mod:`.wire`)."""
        self._write(["A", origin, topic, holders, ids, entries])

    def finish(self, origin: str, topic: str, channel: str, ids: list[bytes]) -> None:
        copies = self.copies(origin, topic)
        if copies and any(msg_id in copies.holders for msg_id in ids):
            self._write(["F", origin, topic, channel, ids])

    def drop(self, origin: str, topic: str, ids: list[bytes]) -> None:
        copies = self.copies(origin, topic)
        if copies and any(msg_id in copies.holders for msg_id in ids):
            self._write(["D", origin, topic, ids])

    def set_channels(self, origin: str, topic: str, channels: list[str]) -> None:
        if self.channels.get(origin, {}).get(topic) != channels:
            self._write(["C", origin, topic, channels])

    def mark_taken(self, origin: str, topic: str, ids: list[bytes]) -> None:
        self._write(["T", origin, topic, ids])

    async def synced(self) -> None:
        """Returns once every change so far is on stable storage."""
        await self.commit.wait()

    def _write(self, record: list) -> None:
        self.queue.put(pack(record))
        self._apply(record)

    # ---------------------------------------------------------------- replay

    def _apply(self, record: list) -> None:
        kind, origin, topic = record[0], record[1], record[2]
        if kind == "A":
            copies = self.origins.setdefault(origin, {}).get(topic)
            if copies is None:
                copies = self.origins[origin][topic] = TopicCopies()
            copies.holders.update(dict.fromkeys(record[4], tuple(record[3])))
            if len(record) > 6:  # a compacted record: the channels that had finished each
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
        elif kind == "C":
            channels = list(record[3])
            self.channels.setdefault(origin, {})[topic] = channels
            if copies and channels:  # a channel gone may leave copies every other channel finished
                for msg_id in [i for i, done in copies.done.items() if done.issuperset(channels)]:
                    copies.discard(msg_id)

    def entries(self, origin: str, topic: str, ids: set[bytes]) -> Iterator[list]:
        """The entries of the copies ``ids`` of ``origin`` in ``topic``, read back from the log
        (a record that cannot be read or unpacked is skipped: see :meth:`damaged`)."""
        wanted = set(ids)
        depth = self.queue.depth
        records = self.queue.peek_many(depth)
        if len(records) < depth:
            self.damaged(depth - len(records))
        for data in records:
            try:
                record = unpack(data)
                if record[0] != "A" or record[1] != origin or record[2] != topic or wanted.isdisjoint(record[4]):
                    continue
                items = unpack_entries(record[5])
            except (WireError, LookupError, TypeError) as exc:
                log.error("REPLICATION: skipped a record of the replication log that cannot be read: %s", exc)
                continue
            for item in items:
                if item[0] in wanted:
                    wanted.discard(item[0])
                    yield item
            if not wanted:
                return

    # ---------------------------------------------------------------- size

    def live(self) -> int:
        return sum(len(copies) for topics in self.origins.values() for copies in topics.values())

    def held_for_topic(self, topic: str) -> int:
        return sum(len(topics.get(topic, ())) for topics in self.origins.values())

    def needs_compaction(self) -> bool:
        depth = self.queue.depth
        return depth > COMPACT_MIN and depth > 4 * (self.live() + 1)

    async def compact(self) -> None:
        """Rewrite the log with only what is still needed (see the module docstring)."""
        if self._new_path.exists():
            shutil.rmtree(self._new_path)
        fresh = self._open(self._new_path)
        try:
            records = [pack(["C", origin, topic, channels])
                       for origin, topics in self.channels.items() for topic, channels in topics.items()]
            records += [pack(["T", origin, topic, sorted(ids)])
                        for origin, topics in self.taken.items() for topic, ids in topics.items()]
            for origin, topics in self.origins.items():
                for topic, copies in topics.items():
                    for item in self.entries(origin, topic, set(copies.holders)):
                        msg_id = item[0]
                        done = sorted(copies.done.get(msg_id, ()))
                        entries = pack_entries([message_of(item)])
                        records.append(pack(["A", origin, topic, list(copies.holders[msg_id]), [msg_id],
                                             entries, [done]]))
            if records:
                fresh.put_many(records)
            await fresh.sync()
        except BaseException:
            await fresh.close()
            raise
        await fresh.close()
        await self.queue.close()
        shutil.rmtree(self.path)
        os.replace(self._new_path, self.path)
        before = self.queue.write_seq
        self.queue = self._open(self.path)
        self.commit = GroupCommit(self.queue)
        log.info("REPLICATION: log compacted from %d records to %d", before, len(records))

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
    "T": (check_ids,),
}


def _checked(record: object) -> list:
    """``record`` when it is one this module writes (see the module docstring); else raises
    :class:`WireError`. An ``A`` record's entries were checked when they arrived."""
    if type(record) is not list or len(record) < 3 or record[0] not in _RECORD_FIELDS:
        raise WireError(f"not a record: {record!r:.80}")
    checks = _RECORD_FIELDS[record[0]]
    rest = record[3:]
    if not (len(checks) - (1 if checks[-1] is None else 0)) <= len(rest) <= len(checks):
        raise WireError(f"a {record[0]} record with {len(record)} fields")
    check_node(record[1])
    check_topic(record[2])
    for check, value in zip(checks, rest):
        if check is bytes:
            if type(value) is not bytes:
                raise WireError("entries must be bytes")
        elif check is None:  # a compacted A record's done channels, one list per copy
            if type(value) is not list or len(value) != len(record[4]):
                raise WireError("done channels: one list per copy")
            for done in value:
                check_channels(done)
        else:
            check(value)
    return record
