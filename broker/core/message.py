"""The message record and its binary layouts.

On the wire (inside a message frame) and on disk a message is nsqd's layout::

    +----------------+-------------+----------------------+-----------+
    | timestamp i64  | attempts u16| id (16 ASCII hex)    | body ...  |
    +----------------+-------------+----------------------+-----------+
      ns since epoch   big-endian

A deferred message is written to disk with a versioned prefix so that its due
time survives a restart (nsqd writes it without the deferral)::

    +------+---------+----------------+--------------------------------+
    | 0xFF | version | due i64 (ns,   | nsqd layout as above           |
    |      | u8 = 1  | unix epoch)    |                                |
    +------+---------+----------------+--------------------------------+

In durable mode some records also say where they come from, so that after a
crash the records that an interrupted move left twice can be told apart::

    +------+---------+----------------+------------------+-----------------------------+
    | 0xFE | kind u8 | source i64     | replaces i64     | the record (plain or        |
    |      |         |                |                  | deferred, as above)         |
    +------+---------+----------------+------------------+-----------------------------+

    COPIED (1)    the last record of a batch a topic copied into a channel's queue or
                  deferred store; source: the topic's record number (its disk queue
                  sequence number) of the batch's last record; replaces: -1
    REPLACES (2)  a channel's new record for a message requeued, timed out or deferred;
                  replaces: the number, in the channel's queue, of the record it replaces
    RELEASED (3)  the record a deferred message gets in the channel's queue once due;
                  source: the number of its record in the deferred store (-1 if not
                  known); replaces: the queue record its deferral replaced, or -1

A message published with a priority (see :mod:`broker.core.ranking`) carries it
in the innermost prefix, just before nsqd's layout (after a due time)::

    +------+---------+----------------+-----------------------------+
    | 0xFD | version | priority u32   | nsqd layout as above        |
    |      | u8 = 1  |                |                             |
    +------+---------+----------------+-----------------------------+

A message without one (``priority`` None) is written without it, as before.

A plain record can never start with 0xFF, 0xFE or 0xFD: that would be a negative timestamp.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Iterable
from typing import Any, NamedTuple

__all__ = ["Message", "encode", "decode", "decode_each", "decode_all", "is_deferred_record", "now_ns", "record_rank",
           "Origin", "mark_origin", "origin", "COPIED", "REPLACES", "RELEASED", "MIN_RECORD_SIZE",
           "RECORD_OVERHEAD", "MAX_PREFIXES"]

_HEADER = struct.Struct(">qH")
_DEFERRED = struct.Struct(">BBq")
_DEFERRED_MARK = 0xFF
_DEFERRED_VERSION = 1
_ORIGIN = struct.Struct(">BBqq")
_ORIGIN_MARK = 0xFE
_PRIORITY = struct.Struct(">BBI")
_PRIORITY_MARK = 0xFD
_PRIORITY_VERSION = 1
#: The lowest first byte of a prefix: every plain record starts below it.
_PREFIX_MARK = _PRIORITY_MARK
#: Kinds of origin prefix (see the module docstring).
COPIED = 1
REPLACES = 2
RELEASED = 3

#: timestamp + attempts + id: the smallest valid plain record, and what a body adds to.
RECORD_OVERHEAD = _HEADER.size + 16
_ID_START, _BODY_START = _HEADER.size, RECORD_OVERHEAD
MIN_RECORD_SIZE = RECORD_OVERHEAD
#: What the prefixes (a due time, an origin) may add to a record at most.
MAX_PREFIXES = _DEFERRED.size + _ORIGIN.size + _PRIORITY.size


class Message:
    """One message as a topic or channel holds it.

    ``due_ns`` is the wall-clock time (``time.time_ns()``) before which a deferred
    message must not be delivered, or 0. ``client``, ``deadline`` and
    ``delivered_at`` describe the current in-flight delivery, if any; deadlines
    are Trio clock times. ``ticket`` identifies the disk record the message was
    read from while that record is not yet committed (see
    :mod:`broker.core.durability.ackfloor`), or is -1.

    A message a topic hands to several channels is the same object in each
    (``shared``): id, body and timestamp never change, and a channel that
    delivers it, defers it or keeps it takes its own :meth:`copy` first, so a
    fan-out costs a reference per channel, not an object.
    """

    __slots__ = (
        "id",
        "body",
        "timestamp",
        "attempts",
        "due_ns",
        "client",
        "deadline",
        "delivered_at",
        "ticket",
        "shared",
        "priority",
    )

    def __init__(self, msg_id: bytes, body: bytes, timestamp: int, attempts: int = 0, due_ns: int = 0,
                 priority: int | None = None):
        self.id = msg_id
        self.body = body
        self.timestamp = timestamp
        self.attempts = attempts
        self.due_ns = due_ns
        self.client: Any = None  # the Subscriber holding it in flight
        self.deadline = 0.0
        self.delivered_at = 0.0
        self.ticket = -1
        self.shared = False
        #: 0 (most urgent) to 2**32-1, or None: the broker's --default-priority
        self.priority = priority

    def copy(self) -> Message:
        """A fresh copy for another channel: same id, body, timestamp, attempts, due time and priority."""
        return Message(self.id, self.body, self.timestamp, self.attempts, self.due_ns, self.priority)

    def __repr__(self) -> str:
        return f"Message(id={self.id!r}, attempts={self.attempts}, len={len(self.body)})"


def encode(msg: Message) -> bytes:
    """The disk record for ``msg``: nsqd's layout, prefixed with its priority if it has one and
    with the due time if deferred."""
    head = _HEADER.pack(msg.timestamp, msg.attempts)
    if msg.priority is not None:
        head = _PRIORITY.pack(_PRIORITY_MARK, _PRIORITY_VERSION, msg.priority) + head
    if msg.due_ns:
        return b"".join((_DEFERRED.pack(_DEFERRED_MARK, _DEFERRED_VERSION, msg.due_ns), head, msg.id, msg.body))
    return b"".join((head, msg.id, msg.body))


def decode(record: bytes) -> Message:
    """Parse a disk record written by :func:`encode` (or by nsqd).

    Raises ``ValueError`` for a record too short to hold a message or of an
    unknown version.
    """
    due_ns = 0
    offset = 0
    priority = None
    if record and record[0] >= _PREFIX_MARK:  # 0xFD to 0xFF: a prefix (a plain record starts below)
        offset, due_ns, priority = _skip_prefixes(record)
    if len(record) - offset < RECORD_OVERHEAD:
        raise ValueError(f"record too short ({len(record)} bytes)")
    timestamp, attempts = _HEADER.unpack_from(record, offset)
    start = offset + _HEADER.size
    return Message(record[start:start + 16], record[start + 16:], timestamp, attempts, due_ns, priority)


def _skip_prefixes(record: bytes) -> tuple[int, int, int | None]:
    """Where nsqd's layout starts in a prefixed record, its due time (0 if none) and its
    priority (None if none)."""
    offset = 0
    due_ns = 0
    priority = None
    if record[0] == _ORIGIN_MARK:
        origin(record)  # raises for a short record or an unknown kind
        offset = _ORIGIN.size
    if len(record) > offset and record[offset] == _DEFERRED_MARK:
        if len(record) - offset < _DEFERRED.size + RECORD_OVERHEAD:
            raise ValueError(f"deferred record too short ({len(record)} bytes)")
        _mark, version, due_ns = _DEFERRED.unpack_from(record, offset)
        if version != _DEFERRED_VERSION:
            raise ValueError(f"unknown record version {version}")
        offset += _DEFERRED.size
    if len(record) > offset and record[offset] == _PRIORITY_MARK:
        if len(record) - offset < _PRIORITY.size + RECORD_OVERHEAD:
            raise ValueError(f"prioritised record too short ({len(record)} bytes)")
        _mark, version, priority = _PRIORITY.unpack_from(record, offset)
        if version != _PRIORITY_VERSION:
            raise ValueError(f"unknown priority version {version}")
        offset += _PRIORITY.size
    return offset, due_ns, priority


def decode_each(records: Iterable[bytes], log: logging.Logger, where: str) -> list[Message | None]:
    """Decode every record; an unreadable one is logged (``<where>: skipping ...``) and yields None.

    Callers that track records one by one (tickets) keep the positions; others use :func:`decode_all`.
    """
    out: list[Message | None] = []
    append = out.append
    unpack = _HEADER.unpack_from
    for record in records:
        if len(record) >= RECORD_OVERHEAD and record[0] < _PREFIX_MARK:
            # a plain record, decoded as decode() does without the call: a consumer of a
            # backlog on disk reads every message this way
            timestamp, attempts = unpack(record)
            append(Message(record[_ID_START:_BODY_START], record[_BODY_START:], timestamp, attempts))
            continue
        try:
            append(decode(record))
        except ValueError as exc:
            log.error("%s: skipping unreadable record: %s", where, exc)
            append(None)
    return out


def record_rank(record: bytes, default: int) -> tuple[int, bytes] | None:
    """The (priority, id) of a plain or prioritised record without decoding it (``default`` for
    a record without a priority); None for any other record (decode it)."""
    first = record[0] if record else _PREFIX_MARK
    if first < _PREFIX_MARK:
        return (default, record[_ID_START:_BODY_START]) if len(record) >= RECORD_OVERHEAD else None
    if first == _PRIORITY_MARK and record[1:2] == b"\x01" and len(record) >= _PRIORITY.size + RECORD_OVERHEAD:
        start = _PRIORITY.size + _ID_START
        return _PRIORITY.unpack_from(record)[2], record[start:start + 16]
    return None


def decode_all(records: Iterable[bytes], log: logging.Logger, where: str) -> list[Message]:
    """The readable records of ``records`` as messages, in order; unreadable ones are logged and skipped."""
    return [msg for msg in decode_each(records, log, where) if msg is not None]


class Origin(NamedTuple):
    """Where a record comes from (see the module docstring)."""

    kind: int
    source: int
    replaces: int


def mark_origin(record: bytes, kind: int, *, source: int = 0, replaces: int = -1) -> bytes:
    """``record`` prefixed with where it comes from (``COPIED``, ``REPLACES`` or ``RELEASED``)."""
    return _ORIGIN.pack(_ORIGIN_MARK, kind, source, replaces) + record


def origin(record: bytes) -> Origin | None:
    """Where a record written by :func:`mark_origin` comes from, or None for any other record.

    Raises ``ValueError`` for a prefixed record that is too short or of an unknown kind.
    """
    if record[:1] != b"\xfe":
        return None
    if len(record) < _ORIGIN.size + RECORD_OVERHEAD:
        raise ValueError(f"record too short ({len(record)} bytes)")
    _mark, kind, source, replaces = _ORIGIN.unpack_from(record, 0)
    if kind not in (COPIED, REPLACES, RELEASED):
        raise ValueError(f"unknown record origin {kind}")
    return Origin(kind, source, replaces)


def is_deferred_record(record: bytes) -> bool:
    """Whether ``record`` carries a due time (without decoding it)."""
    return record[:1] == b"\xff"


def now_ns() -> int:
    """Wall-clock nanoseconds, the unit of message timestamps and due times.

    The core's one wall clock; deadlines and timeouts use Trio's clock, so tests run them on a mock clock.
    """
    return time.time_ns()
