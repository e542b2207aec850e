"""One topic's publish keys and their journal: the record format, and what is written when.

A non-ephemeral topic writes its keys to the disk queue ``<topic>#keys``. A record holds a
key's expiry (ns since the epoch; 0 cancels an earlier record of the key), the record number
and the id its message got in the topic's disk queue (-1 and zeros: not known) and the key.

With ``--durable`` a publish writes its keys' records just before its messages' records,
with no other task between (:meth:`TopicKeys.journal_before`), and is answered once both are
synced. Read back at start (:meth:`TopicKeys.read_back`), a record counts only when its
message's record number is below the topic queue's next one: a crash between the two writes
leaves a key whose message never was, and a retry of it is stored. When the topic's queue
was found damaged (a power cut tore or lost writes that were not synced, and records after
them may be numbered wrongly), a key counts only if its message was committed already or
its id is among the records on disk. The other way round, a message whose key record was
lost (a power cut before the journal's sync) is stored again by a retry: a duplicate, never
a loss. Without ``--durable`` the keys are written when the broker stops
(:meth:`TopicKeys.write_live`). At start every journal is read whole, the expired and
cancelled records are dropped, and a durable topic writes the live ones again and commits
the rest; while it runs, records whose keys have expired are committed
(:meth:`TopicKeys.commit_expired`; a segment goes once all of its records are), so a journal
holds about one window of keys.
"""

from __future__ import annotations

import logging
import struct

from broker.core.durability.groupcommit import GroupCommit
from broker.core.message import Message, decode_each
from diskqueue import DiskQueue, DiskQueueError

__all__ = ["KEY_RECORD_MIN", "NO_ID", "TopicKeys", "journal_name", "encode_record", "decode_record",
           "record_expiry"]

log = logging.getLogger("pynsqd.broker")

#: A journal record's head: the key's expiry in nanoseconds since the epoch (0: the record
#: cancels an earlier one of the key), the record number of its message in the topic's disk
#: queue (-1: not known, a record written at shutdown) and the message's id (zeros: not known).
_HEAD = struct.Struct(">qq16s")
NO_ID = bytes(16)
#: The shortest journal record: its head and a one-byte key.
KEY_RECORD_MIN = _HEAD.size + 1


def journal_name(topic: str) -> str:
    """The disk queue of ``topic``'s keys; '#' appears in names only as '#ephemeral', and an
    ephemeral topic has no journal, so this never collides with a topic's or channel's queue."""
    return f"{topic}#keys"


def encode_record(expires_ns: int, message_seq: int, key: bytes, message_id: bytes = NO_ID) -> bytes:
    return _HEAD.pack(expires_ns, message_seq, message_id) + key


def decode_record(record: bytes) -> tuple[int, int, bytes, bytes]:
    """``(expires_ns, message_seq, message_id, key)``; raises ValueError for a record too short
    to hold a key."""
    if len(record) < KEY_RECORD_MIN:
        raise ValueError(f"key record of {len(record)} bytes")
    expires, seq, message_id = _HEAD.unpack_from(record)
    return expires, seq, message_id, record[_HEAD.size:]


def record_expiry(record: bytes) -> int:
    """The expiry of a journal record (0 for one too short to be a record: read past as expired)."""
    return _HEAD.unpack_from(record)[0] if len(record) >= KEY_RECORD_MIN else 0


class TopicKeys:
    """One topic's keys (``held``), counters, and its journal (None for an ephemeral topic) with,
    in durable mode, the journal's shared syncs (``commit``)."""

    __slots__ = ("held", "pending", "journal", "commit", "received", "duplicates")

    def __init__(self, journal: DiskQueue | None, commit: GroupCommit | None = None):
        self.held: set[bytes] = set()
        #: keys of ``held`` whose publish waits for its copies on other nodes (``--replicas``)
        self.pending: set[bytes] = set()
        self.journal = journal
        self.commit = commit
        #: keyed messages published to the topic, and how many of them were duplicates
        self.received = 0
        self.duplicates = 0


    # ---------------------------------------------------------------- the journal

    def read_back(self, written: int, name: str) -> dict[bytes, tuple[int, int, bytes]]:
        """The live records of the journal, read whole at start: ``{key: (expires_ns, record
        number, message id)}`` for each key whose message's record number is below ``written``
        (the topic queue's next one) and that no later record cancels. ``name``: the topic's,
        for the log."""
        journal = self.journal
        assert journal is not None
        found: dict[bytes, tuple[int, int, bytes]] = {}
        while journal.depth:
            records = journal.read_many(4096)
            if not records:
                break
            for record in records:
                try:
                    expires, seq, message_id, key = decode_record(record)
                except ValueError:
                    log.warning("TOPIC(%s): skipping a damaged record of its publish keys", name)
                    continue
                if not expires:
                    found.pop(key, None)
                elif seq < written:
                    found[key] = (expires, seq, message_id)
        return found

    @staticmethod
    def drop_keys_of_lost_messages(found: dict[bytes, tuple[int, int, bytes]], backend: DiskQueue,
                                   name: str) -> None:
        """The topic's queue ``backend`` was found damaged (a power cut tore or lost unsynced
        writes, and the records after them may be numbered wrongly): keep a key of ``found``
        only if its message was committed before (consumed: it was there) or its id is among
        the records on disk. A key dropped here belongs to a publish that was never answered:
        a retry of it is stored, once or, if its message did survive, twice; never dropped for
        nothing."""
        committed = backend.commit_seq
        on_disk: set[bytes] = set()
        for records in backend.newest_records():
            on_disk.update(m.id for m in decode_each(records, log, f"TOPIC({name})") if m is not None)
        for key, (_, seq, message_id) in list(found.items()):
            if seq >= committed and message_id not in on_disk:
                del found[key]

    def write_live(self, live_keys: list[tuple[int, bytes]]) -> None:
        """Write ``(expires_ns, key)`` of every live key (at start in durable mode, after the
        journal's older records were committed; at shutdown without ``--durable``)."""
        assert self.journal is not None
        self.journal.put_many([encode_record(expires, -1, key) for expires, key in live_keys])

    def journal_before(self, keys: list[bytes], messages: list[Message], first_seq: int, expires: int) -> bool:
        """Durable mode, just before a piece of a keyed publish is written to the topic's queue,
        whose next record number is ``first_seq``: the journal records of its keys, each naming
        the record number its message is about to get, and its id. Returns whether anything was
        written (:meth:`cancel` undoes it if the piece fails)."""
        assert self.journal is not None
        records = [encode_record(expires, first_seq + index, key, message.id)
                   for index, (key, message) in enumerate(zip(keys, messages)) if key]
        if records:
            self.journal.put_many(records)
        return bool(records)

    def cancel(self, keys: list[bytes], name: str) -> None:
        """The piece whose keys :meth:`journal_before` wrote was not stored: cancel their records."""
        assert self.journal is not None
        try:
            self.journal.put_many([encode_record(0, -1, key) for key in keys if key])
        except DiskQueueError as exc:
            log.error("TOPIC(%s): could not cancel the keys of a failed publish: %s", name, exc)

    def commit_expired(self, now_ns: int) -> None:
        """Commit the journal's oldest records whose keys have expired by ``now_ns`` (a segment
        goes once all of its records are). Raises :class:`DiskQueueError`."""
        journal = self.journal
        if journal is None or not journal.depth:
            return
        while True:
            records = journal.peek_many(1024)
            done = 0
            for record in records:
                if record_expiry(record) > now_ns:
                    break
                done += 1
            if done:
                journal.read_many(done)
                journal.commit(done)
            if done < 1024:
                return
