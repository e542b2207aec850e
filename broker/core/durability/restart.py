"""After a crash: which records of a durable channel's queue stand for a message, and which are left over.

Every move of a message in durable mode writes its new record before the old
one is committed away (see :mod:`broker.core.durability.ledger`), so a crash
in between leaves both, and a restart reads every record past the committed
cursor again. Records say where they come from (the origin prefix of
:mod:`broker.core.message`), and the queue's checkpoint lists the records
past the committed cursor that were done (:func:`encode_done`), so that the
records on disk at the start (numbered from the committed cursor up to the
end of the queue) can be sorted out as they are read:

* a record the checkpoint lists as done is dropped: its message was finished,
  or its replacement stands for it;
* a record whose message the deferred store held at the start, with at least
  as many attempts, is dropped: the deferral stands, even once the deferred
  copy is due and back in the queue (one released before the crash is not
  counted: its record in the queue stands for it, see below);
* a record that names the record it replaces (REQ, timeout) or the record
  its deferral replaced (a release) is dropped when that record was on disk
  at the start and not done: it is read first and stands for the message;
* of the records that name a record committed before the start, the first
  read of each message stands for it: a record dropped in an earlier run was
  retired then, not committed, so a later crash can bring it back beside the
  record that continued the message in that run.

Records written since the start are never dropped, nor anything once damage
found in the queue makes record numbers uncertain.
"""

from __future__ import annotations

import logging
from bisect import bisect_right

import msgpack

from broker.core.message import COPIED, Message, Origin, origin
from diskqueue import DiskQueue

__all__ = ["Leftovers", "decode_done", "encode_done", "newest_copy", "record_origin"]

log = logging.getLogger("pynsqd.channel")

_END = 1 << 63


class Leftovers:
    """What one durable channel knows of the records its queue held when it was opened; owned by its retention.

    ``queue`` is the channel's queue, just opened. Once every record from
    before the start has been read, it knows nothing more and costs nothing.
    """

    __slots__ = ("_queue", "_commit", "_end", "_done", "_restored", "_continued")

    def __init__(self, queue: DiskQueue):
        self._queue = queue
        self._commit = queue.read_seq
        self._end = queue.statistics().records_written
        self._done = decode_done(queue.note, self._commit)
        self._restored: dict[bytes, int] = {}  # the deferred store at the start: message id -> attempts
        self._continued: set[bytes] = set()  # messages read from a record naming a committed one

    def pending(self, first: int) -> bool:
        """Whether records numbered from ``first`` on may still be leftovers."""
        return first < self._end

    def deferred_at_start(self, msgs: list[Message]) -> None:
        """The deferred store held ``msgs`` (the newest record of each) when the channel started."""
        if self._end > self._commit:
            self._restored = {m.id: m.attempts for m in msgs}

    def released_before(self, msgs: list[Message]) -> None:
        """Deferred ``msgs`` had been released into the queue before the crash: their record there stands."""
        for msg in msgs:
            self._restored.pop(msg.id, None)

    def done_since(self, read: int) -> list[tuple[int, int]]:
        """The runs listed done at the start that lie past record ``read`` (not read again yet)."""
        return [(max(a, read), b) for a, b in self._done if b > read]

    def drop(self, records: list[bytes], msgs: list[Message | None], first: int) -> None:
        """Set to None the entries of ``msgs`` (decoded from ``records``, numbered from ``first``)
        that are leftovers (see the module docstring)."""
        if self._queue.damage_found:
            self.forget()
            return
        restored = self._restored
        seen = self._continued
        done = self._done
        for i, record in enumerate(records):
            number = first + i
            if number >= self._end:
                self.forget()  # every record from before the start has been read
                break
            msg = msgs[i]
            if msg is None:
                continue
            if done and _within(done, number):
                msgs[i] = None
                continue
            if restored and restored.get(msg.id, -1) >= msg.attempts:
                msgs[i] = None
            if record[:1] != b"\xfe":
                continue
            mark = record_origin(record)
            if mark is None or mark.kind == COPIED:
                continue
            if mark.replaces >= self._commit and not (done and _within(done, mark.replaces)):
                msgs[i] = None
                continue
            if msg.id in seen:
                msgs[i] = None
            seen.add(msg.id)

    def forget(self) -> None:
        """Drop nothing more (every record from before the start was read, or numbers are uncertain)."""
        self._end = 0
        self._restored.clear()
        self._continued.clear()
        self._done = []


def newest_copy(queue: DiskQueue) -> int:
    """The topic record number the newest copied record of ``queue`` carries
    (:data:`~broker.core.message.COPIED`), or -1; -1 too when damage was found in the queue."""
    if queue.damage_found:
        return -1
    for records in queue.newest_records():
        for record in reversed(records):
            if record[:1] == b"\xfe":
                mark = record_origin(record)
                if mark is not None and mark.kind == COPIED:
                    return -1 if queue.damage_found else mark.source
    return -1


def record_origin(record: bytes) -> Origin | None:
    """Where ``record`` comes from; None also for a damaged prefix (the record is then read as it is)."""
    try:
        return origin(record)
    except ValueError:
        return None


def encode_done(ranges: list[tuple[int, int]]) -> bytes:
    """Runs of record numbers ``[(first, end), ...]`` (sorted, apart) as a queue's note: gap, length, ..."""
    if not ranges:
        return b""
    flat: list[int] = []
    previous = 0
    for first, end in ranges:
        flat += (first - previous, end - first)
        previous = end
    return msgpack.packb(flat)


def decode_done(note: bytes, floor: int) -> list[tuple[int, int]]:
    """The runs of :func:`encode_done` that end past ``floor``; none from a note that is not one."""
    if not note:
        return []
    try:
        flat = msgpack.unpackb(note)
        ranges = []
        previous = 0
        for gap, length in zip(flat[0::2], flat[1::2], strict=True):
            if type(gap) is not int or type(length) is not int or gap < 0 or length <= 0:
                raise ValueError(f"bad run {gap!r}, {length!r}")
            first = previous + gap
            previous = first + length
            if previous > floor:
                ranges.append((max(first, floor), previous))
        return ranges
    except Exception as exc:  # msgpack raises a zoo of types on garbage
        log.warning("ignoring an unreadable note of done records (%r): some may be delivered again", exc)
        return []


def _within(ranges: list[tuple[int, int]], number: int) -> bool:
    """Whether ``number`` lies in one of the sorted runs ``ranges``."""
    i = bisect_right(ranges, (number, _END)) - 1
    return i >= 0 and ranges[i][0] <= number < ranges[i][1]
