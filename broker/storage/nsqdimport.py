"""Starting on the data directory of an nsqd: its disk queues become pynsqd's, backlog included.

nsqd 1.3.0 (go-diskqueue v1.1.0) names its queue files as pynsqd does, in another format::

    <name>.diskqueue.NNNNNN.dat   records: [length u32 big-endian][nsqd's message layout]
    <name>.diskqueue.meta.dat     text "<depth>\\n<readFileNum>,<readPos>\\n<writeFileNum>,<writePos>\\n"

``<name>`` is the topic, or ``<topic>:<channel>``: the same names pynsqd gives its topic
and channel queues, and nsqd's message layout is pynsqd's plain record. nsqd resumes
reading at the read cursor and reads every segment from there to the write file, each to
its end (a write file longer than the cursor says is read whole, as nsqd salvages it).

:func:`import_nsqd_queues` runs at start-up, with the directory locked and before any
queue opens. Every step can be interrupted (``kill -9``, power loss) and is redone or
finished by the next start, so every message from the read cursor on ends up in pynsqd's
queue exactly once:

1. *Claim.* A queue whose checkpoint in the data directory is nsqd's text is moved into
   ``nsqd-import/``: its segment files first, then the checkpoint, then both directories
   are fsynced. While the checkpoint is still in the data directory the claim is redone
   (moving what is left); once it has moved, no nsqd file of that name is in the data
   directory, so pynsqd's queue of that name starts with no files, its records numbered from 0.
2. *Copy.* For each checkpoint in ``nsqd-import/``, pynsqd's queue of that name is opened
   and its records are counted (its write sequence number). They are the first messages
   of the nsqd queue, copied by an interrupted earlier run: that many readable nsqd records
   are skipped and the rest appended. The queue's own files are the progress marker: a
   record appended is, after a kill, either wholly there or cut off by the queue's
   recovery, never half, and the count always matches what was appended, so no separate
   marker has to be kept in step with it. The queue is then synced and closed (data fsync,
   checkpoint replaced atomically).
3. *Retire.* The nsqd checkpoint in ``nsqd-import/`` is removed and the directory fsynced:
   from then on the queue counts as imported. Then its segment files are removed, and
   damaged ones moved back to the data directory as ``.bad``. Segment files found in
   ``nsqd-import/`` without a checkpoint are leftovers of an interrupted retirement and are
   retired the same way.

Damage gets nsqd's treatment: a record of impossible size, a record cut short by the end of
the file, or a missing or unreadable segment ends that segment: what was read before it is
kept, the segment is renamed ``.bad`` (in ``nsqd-import/`` at once, so a re-run reads the same
records, and into the data directory at retirement) and reading goes on with the next one;
it is logged as a warning, never raised. A record nsqd could not have written (its
timestamp negative) is logged and skipped. Files the OS refuses to move or remove stop the
start with ``OSError``, nothing lost.
"""

from __future__ import annotations

import logging
import mmap
import os
import re
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from broker.core.host import QueueStore
from broker.core.message import RECORD_OVERHEAD
from diskqueue.checkpoint import fsync_path
from diskqueue.format import SEGMENT_MAGIC, meta_filename, segment_filename, segment_number

__all__ = ["IMPORT_DIRECTORY", "ImportedQueue", "NsqdCursor", "import_nsqd_queues", "parse_nsqd_meta"]

log = logging.getLogger("pynsqd.import")

#: The folder (inside the data directory) that holds nsqd's queue files while they are imported.
IMPORT_DIRECTORY = "nsqd-import"
#: Records appended to pynsqd's queue per call.
_BATCH = 4096
_META_SUFFIX = ".diskqueue.meta.dat"
_BAD = ".bad"
_NSQD_META = re.compile(rb"(-?\d+)\n(\d+),(\d+)\n(\d+),(\d+)\n?")
_LENGTH_SIZE = 4
#: A plain record's first byte is below this (its timestamp is not negative); pynsqd's
#: prefixed records start with 0xFE or 0xFF.
_PREFIX_MARK = 0xFE


@dataclass(frozen=True, slots=True)
class NsqdCursor:
    """nsqd's checkpoint of one queue: where reading resumes and where writing stopped."""

    depth: int
    read_file: int
    read_pos: int
    write_file: int
    write_pos: int


@dataclass(slots=True)
class ImportedQueue:
    """What importing one nsqd queue did: messages appended now and by an interrupted earlier run."""

    name: str
    appended: int = 0
    resumed: int = 0
    damaged: list[str] = field(default_factory=list)

    @property
    def messages(self) -> int:
        """Messages of the nsqd queue now in pynsqd's queue."""
        return self.appended + self.resumed


def parse_nsqd_meta(data: bytes) -> NsqdCursor | None:
    """nsqd's checkpoint in ``data``, or None when it is not one (pynsqd's msgpack checkpoint, garbage)."""
    found = _NSQD_META.fullmatch(data)
    if found is None:
        return None
    depth, rf, rp, wf, wp = (int(g) for g in found.groups())
    return NsqdCursor(depth, rf, rp, wf, wp)


async def import_nsqd_queues(data_path: Path, queues: QueueStore, max_msg_size: int) -> list[ImportedQueue]:
    """Import every nsqd queue of ``data_path`` into pynsqd's queues of the same names (see the module docstring).

    ``queues`` opens pynsqd's queues; ``max_msg_size`` is ``--max-msg-size`` (nsqd's bound on a
    record is that plus 26). Logs one line per queue imported. Blocking file I/O runs inline:
    nothing else runs this early. Raises ``OSError`` when files cannot be moved or removed,
    ``DiskQueueError`` when pynsqd's queue cannot be written or synced; a restart carries on.
    """
    staging = data_path / IMPORT_DIRECTORY
    claimed = _claim(data_path, staging)
    if not claimed and not staging.is_dir():
        return []
    done = []
    for name in _staged_names(staging):
        done.append(await _copy(staging, name, queues, max_msg_size))
        _retire(data_path, staging, name, forget_meta=True)
    for name in _leftover_names(staging):
        _retire(data_path, staging, name, forget_meta=False)
    try:
        staging.rmdir()
    except OSError as exc:
        log.warning("nsqd import: %s is not empty, left in place (%s)", staging, exc.strerror)
    else:
        fsync_path(str(data_path))
    return done


# ------------------------------------------------------------------------------------------- claim

def _claim(data_path: Path, staging: Path) -> bool:
    """Step 1 for every nsqd queue in the data directory; whether there was one."""
    entries = os.listdir(data_path)
    names = [e[:-len(_META_SUFFIX)] for e in entries if e.endswith(_META_SUFFIX) and _is_nsqd_meta(data_path / e)]
    if not names:
        return False
    staging.mkdir(exist_ok=True)
    fsync_path(str(data_path))
    for name in sorted(names):
        for entry in entries:
            if segment_number(name, entry) is not None and not _is_pynsqd_segment(data_path / entry):
                os.rename(data_path / entry, staging / entry)
        fsync_path(str(staging))  # the segments are there before the checkpoint that names them
        os.rename(data_path / meta_filename(name), staging / meta_filename(name))
        log.info("nsqd import: claimed nsqd queue %s", name)
    fsync_path(str(staging))
    fsync_path(str(data_path))
    return True


def _is_nsqd_meta(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return parse_nsqd_meta(f.read(256)) is not None
    except OSError:
        return False


def _is_pynsqd_segment(path: Path) -> bool:
    """Whether the file starts with pynsqd's segment header (an nsqd segment starts with a record's
    length, which is never as large as those four bytes read as a number)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(SEGMENT_MAGIC)) == SEGMENT_MAGIC
    except OSError:
        return False


def _staged_names(staging: Path) -> list[str]:
    return sorted(e[:-len(_META_SUFFIX)] for e in os.listdir(staging) if e.endswith(_META_SUFFIX))


def _leftover_names(staging: Path) -> list[str]:
    """Queues with segment files but no checkpoint left in ``nsqd-import/`` (an interrupted retirement)."""
    if not staging.is_dir():
        return []
    infix = ".diskqueue."
    return sorted({e[:e.rfind(infix)] for e in os.listdir(staging) if e.rfind(infix) > 0})


# -------------------------------------------------------------------------------------------- copy

async def _copy(staging: Path, name: str, queues: QueueStore, max_msg_size: int) -> ImportedQueue:
    """Step 2 for the queue ``name``: append what pynsqd's queue does not hold yet, sync, close."""
    with open(staging / meta_filename(name), "rb") as f:
        cursor = parse_nsqd_meta(f.read())
    result = ImportedQueue(name)
    target = queues.open(name)
    try:
        skip = result.resumed = target.write_seq
        batch: list[bytes] = []
        for record in _records(staging, name, cursor, max_msg_size, result):
            if skip:
                skip -= 1
                continue
            batch.append(record)
            if len(batch) >= _BATCH:
                target.put_many(batch)
                result.appended += len(batch)
                batch = []
        if batch:
            target.put_many(batch)
            result.appended += len(batch)
        if skip:
            log.warning("nsqd import: queue %s holds %d more messages than the nsqd queue has; "
                        "they were left as they are", name, skip)
            result.resumed -= skip
    finally:
        await target.close()
    if result.resumed:
        log.info("nsqd import: queue %s: imported %d messages (%d of them before an interruption)",
                 name, result.messages, result.resumed)
    else:
        log.info("nsqd import: queue %s: imported %d messages", name, result.messages)
    return result


def _records(staging: Path, name: str, cursor: NsqdCursor | None, max_msg_size: int,
             result: ImportedQueue) -> Iterator[bytes]:
    """The payloads of nsqd's queue ``name`` from its read cursor on, read past damage as nsqd does."""
    if cursor is None:
        log.warning("nsqd import: queue %s: its checkpoint is no longer readable; nothing imported", name)
        return
    largest = max_msg_size + RECORD_OVERHEAD
    for number in range(cursor.read_file, cursor.write_file + 1):
        start = cursor.read_pos if number == cursor.read_file else 0
        path, damaged = _segment_path(staging, name, number)
        if path is None:
            if number < cursor.write_file or cursor.write_pos > 0:
                _damage(result, name, number, "segment file is missing")
            continue
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size <= start:
                    continue
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                    problem = yield from _segment_records(data, start, size, largest, name, number)
        except OSError as exc:
            problem = f"read error: {exc.strerror}"
        if problem is not None:
            if not damaged:
                os.rename(path, str(path) + _BAD)  # a re-run reads the same records from there
                fsync_path(str(staging))
            _damage(result, name, number, problem)


def _segment_records(data: mmap.mmap, pos: int, size: int, largest: int, name: str,
                     number: int) -> Generator[bytes, None, str | None]:
    """The records of one segment from ``pos``; returns what ended it early, or None."""
    while pos < size:
        if size - pos < _LENGTH_SIZE:
            return f"record length cut short at offset {pos}"
        length = int.from_bytes(data[pos:pos + _LENGTH_SIZE], "big", signed=True)
        if length < RECORD_OVERHEAD or length > largest:
            return f"invalid message read size ({length}) at offset {pos}"
        end = pos + _LENGTH_SIZE + length
        if end > size:
            return f"record of {length} bytes at offset {pos} cut short by the end of the file"
        record = data[pos + _LENGTH_SIZE:end]
        if record[0] >= _PREFIX_MARK:
            log.warning("nsqd import: queue %s: segment %06d offset %d: skipping a message with a negative "
                        "timestamp", name, number, pos)
        else:
            yield record
        pos = end
    return None


def _segment_path(staging: Path, name: str, number: int) -> tuple[Path | None, bool]:
    """The segment file, or its ``.bad`` rename by an earlier run (then True); (None, False) if neither."""
    path = staging / segment_filename(name, number)
    if path.is_file():
        return path, False
    bad = Path(str(path) + _BAD)
    if bad.is_file():
        return bad, True
    return None, False


def _damage(result: ImportedQueue, name: str, number: int, problem: str) -> None:
    where = segment_filename(name, number)
    result.damaged.append(f"{where}: {problem}")
    log.warning("nsqd import: queue %s: %s: %s; kept the messages before it, skipping to the next file "
                "(saved as %s.bad)", name, where, problem, where)


# ------------------------------------------------------------------------------------------ retire

def _retire(data_path: Path, staging: Path, name: str, *, forget_meta: bool) -> None:
    """Step 3 for the queue ``name``: its checkpoint first, then its segments."""
    if forget_meta:
        os.unlink(staging / meta_filename(name))
        fsync_path(str(staging))
    for entry in os.listdir(staging):
        if segment_number(name, entry) is not None:
            os.unlink(staging / entry)
        elif entry.endswith(_BAD) and segment_number(name, entry[:-len(_BAD)]) is not None:
            target = data_path / entry
            if target.exists():
                target = data_path / f"{entry[:-len(_BAD)]}.{time.time_ns()}{_BAD}"
            os.rename(staging / entry, target)
            log.warning("nsqd import: queue %s: damaged nsqd file kept as %s", name, target)
    fsync_path(str(staging))
    fsync_path(str(data_path))
