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

1. *Claim.* A queue whose checkpoint is nsqd's text is renamed out of the way of pynsqd's
   queue of the same name: ``<name>.diskqueue.NNNNNN.dat`` becomes
   ``<name>.nsqd-import.NNNNNN.dat``, the directory is fsynced, then the checkpoint becomes
   ``<name>.nsqd-import.meta.dat`` (fsynced again). While nsqd's checkpoint still has its old name the claim
   is redone (renaming what is left); once it is renamed, no nsqd file has a name of
   pynsqd's, so pynsqd's queue of that name starts with no files, its records numbered from 0.
2. *Copy.* For each claimed checkpoint, pynsqd's queue of that name is opened
   and its records are counted (its write sequence number). They are the first messages
   of the nsqd queue, copied by an interrupted earlier run: that many readable nsqd records
   are skipped and the rest appended. The queue's own files are the progress marker: a
   record appended is, after a kill, either wholly there or cut off by the queue's
   recovery, never half, and the count always matches what was appended, so no separate
   marker has to be kept in step with it. Nothing reads the queue before step 3, so its
   depth equals its count; when it does not (a power cut lost copied records whose
   successors survived), the queue is deleted and the copy starts over. The queue is then
   synced and closed (data fsync, checkpoint replaced atomically).
3. *Retire.* The claimed checkpoint is removed and the directory fsynced: from then on
   the queue counts as imported. Then its claimed segment files are removed, and damaged
   ones renamed back to nsqd's name plus ``.bad``. Claimed segment files without a claimed
   checkpoint are leftovers of an interrupted retirement and are retired the same way.

Damage gets nsqd's treatment: a record of impossible size, a record cut short by the end of
the file, or a read error ends that segment: what was read before it is kept, the segment
is renamed ``.bad`` (its claimed name at once, so a re-run reads the same records, and
nsqd's name at retirement) and reading goes on with the next one; a missing segment is
skipped. Each is logged as a warning, never raised. A record nsqd could not have written (its
timestamp negative) is logged and skipped. Files the OS refuses to move or remove stop the
start with ``OSError``, nothing lost. Every change goes through ``diskqueue.fileops``, as
the disk queues' do, so the power-cut simulation of the tests covers it.
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
from typing import NamedTuple

from broker.core.host import QueueStore
from broker.core.message import RECORD_OVERHEAD
from diskqueue import fileops
from diskqueue.checkpoint import fsync_path
from diskqueue.format import SEGMENT_MAGIC, meta_filename, segment_filename, segment_number

__all__ = ["CLAIMED_INFIX", "ImportedQueue", "NsqdCursor", "NsqdImportError", "import_nsqd_queues", "parse_nsqd_meta"]

log = logging.getLogger("pynsqd.import")

#: What a claimed nsqd file has in its name in place of ``.diskqueue.``: pynsqd's queues
#: (and their directory listing) never see it.
CLAIMED_INFIX = ".nsqd-import."
_QUEUE_INFIX = ".diskqueue."
_META = "meta.dat"
#: Records appended to pynsqd's queue per call.
_BATCH = 4096
_BAD = ".bad"
_NSQD_META = re.compile(rb"(-?\d+)\n(\d+),(\d+)\n(\d+),(\d+)\n?")
#: nsqd's checkpoint: five decimal numbers of at most 20 characters each, and separators.
_NSQD_META_MAX = 5 * 20 + 5
_NSQD_META_START = frozenset(b"-0123456789"[i:i + 1] for i in range(11))
_LENGTH_SIZE = 4
#: A plain record's first byte is below this (its timestamp is not negative); pynsqd's
#: prefixed records start with 0xFE or 0xFF.
_PREFIX_MARK = 0xFE


class NsqdImportError(RuntimeError):
    """pynsqd's queue could not take the messages of nsqd's (a disk error); the start fails and the
    next one carries on."""


class NsqdCursor(NamedTuple):
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


def _claimed_segment(name: str, number: int) -> str:
    return f"{name}{CLAIMED_INFIX}{number:06d}.dat"


def _claimed_meta(name: str) -> str:
    return f"{name}{CLAIMED_INFIX}{_META}"


def _split(entry: str, infix: str) -> tuple[str, str] | None:
    """``(queue name, rest)`` of a file name ``<name><infix><rest>``, None for another file."""
    at = entry.rfind(infix)
    return (entry[:at], entry[at + len(infix):]) if at > 0 else None


async def import_nsqd_queues(data_path: Path, queues: QueueStore, max_msg_size: int) -> list[ImportedQueue]:
    """Import every nsqd queue of ``data_path`` into pynsqd's queues of the same names (see the module docstring).

    ``queues`` opens pynsqd's queues; ``max_msg_size`` is ``--max-msg-size`` (nsqd's bound on a
    record is that plus 26). Logs one line per queue imported. Blocking file I/O runs inline:
    nothing else runs this early. Raises ``OSError`` when files cannot be renamed or removed,
    ``DiskQueueError`` when pynsqd's queue cannot be written or synced; a restart carries on.
    """
    directory = str(data_path)
    entries = fileops.listdir(directory)
    if _claim(directory, entries):
        entries = fileops.listdir(directory)
    elif not any(CLAIMED_INFIX in e for e in entries):
        return []  # the usual start: one listing of the directory, one read per checkpoint
    done = []
    claimed = sorted(split[0] for e in entries
                     if (split := _split(e, CLAIMED_INFIX)) is not None and split[1] == _META)
    for name in claimed:
        done.append(await _copy(directory, name, queues, max_msg_size))
        _retire(directory, name, forget_meta=True)
    leftovers = {split[0] for e in fileops.listdir(directory) if (split := _split(e, CLAIMED_INFIX)) is not None}
    for name in sorted(leftovers):
        _retire(directory, name, forget_meta=False)
    return done


# ------------------------------------------------------------------------------------------- claim

def _claim(directory: str, entries: list[str]) -> bool:
    """Step 1 for every nsqd queue among ``entries``, the directory's files; whether there was one."""
    names = sorted(split[0] for e in entries if (split := _split(e, _QUEUE_INFIX)) is not None
                   and split[1] == _META and _is_nsqd_meta(os.path.join(directory, e)))
    for name in names:
        for entry in entries:
            number = segment_number(name, entry)
            if number is not None and not _is_pynsqd_segment(os.path.join(directory, entry)):
                fileops.rename(os.path.join(directory, entry), os.path.join(directory, _claimed_segment(name, number)))
        fsync_path(directory)  # the segments' new names are durable before the checkpoint's that counts on them
        fileops.rename(os.path.join(directory, meta_filename(name)), os.path.join(directory, _claimed_meta(name)))
    if names:
        fsync_path(directory)
        log.info("nsqd import: found %d queue(s) of nsqd in %s", len(names), directory)
    return bool(names)


def _is_nsqd_meta(path: str) -> bool:
    """Whether the checkpoint at ``path`` is nsqd's text. A start opens every queue's checkpoint
    here: one byte tells pynsqd's (msgpack, starting with a map's byte) from nsqd's (a digit)."""
    try:
        fd = fileops.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        data = fileops.pread(fd, _NSQD_META_MAX, 0)
    except OSError:
        return False
    finally:
        fileops.close(fd)
    return data[:1] in _NSQD_META_START and parse_nsqd_meta(data) is not None


def _is_pynsqd_segment(path: str) -> bool:
    """Whether the file starts with pynsqd's segment header (an nsqd segment starts with a record's
    length, which is never as large as those four bytes read as a number)."""
    try:
        fd = fileops.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return fileops.pread(fd, len(SEGMENT_MAGIC), 0) == SEGMENT_MAGIC
    except OSError:
        return False
    finally:
        fileops.close(fd)


# -------------------------------------------------------------------------------------------- copy

async def _copy(directory: str, name: str, queues: QueueStore, max_msg_size: int) -> ImportedQueue:
    """Step 2 for the queue ``name``: append what pynsqd's queue does not hold yet, sync, close."""
    cursor = parse_nsqd_meta(fileops.read_file(os.path.join(directory, _claimed_meta(name))))
    result = ImportedQueue(name)
    target = queues.open(name)
    if target.damage_found or target.depth != target.write_seq:
        # Records copied before a power cut went missing from pynsqd's queue, so its count no
        # longer says how far the copy got. Nothing has read the queue yet: start it over.
        log.warning("nsqd import: queue %s: what an interrupted import had copied is damaged; copying again", name)
        target.delete()
        target = queues.open(name)
    try:
        skip = result.resumed = target.write_seq
        batch: list[bytes] = []
        for record in _records(directory, name, cursor, max_msg_size, result):
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


def _records(directory: str, name: str, cursor: NsqdCursor | None, max_msg_size: int,
             result: ImportedQueue) -> Iterator[bytes]:
    """The payloads of nsqd's queue ``name`` from its read cursor on, read past damage as nsqd does."""
    if cursor is None:
        log.warning("nsqd import: queue %s: its checkpoint is no longer readable; nothing imported", name)
        return
    largest = max_msg_size + RECORD_OVERHEAD
    for number in range(cursor.read_file, cursor.write_file + 1):
        start = cursor.read_pos if number == cursor.read_file else 0
        path = os.path.join(directory, _claimed_segment(name, number))
        damaged = not os.path.isfile(path)
        if damaged:
            path += _BAD  # set aside by an earlier run, which read the records before the damage
            if not os.path.isfile(path):
                if number < cursor.write_file or cursor.write_pos > 0:
                    _damage(result, name, number, "segment file is missing")
                continue
        try:
            problem = yield from _file_records(path, start, largest, name, number)
        except OSError as exc:
            problem = f"read error: {exc.strerror}"
        if problem is not None:
            if not damaged:
                fileops.rename(path, path + _BAD)  # a re-run reads the same records from there
                fsync_path(directory)
            _damage(result, name, number, problem)


def _file_records(path: str, start: int, largest: int, name: str,
                  number: int) -> Generator[bytes, None, str | None]:
    """The records of one segment file from offset ``start``; returns what ended it early, or None."""
    fd = fileops.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = fileops.fstat(fd).st_size
        if size <= start:
            return None
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as data:
            return (yield from _segment_records(data, start, size, largest, name, number))
    finally:
        fileops.close(fd)


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


def _damage(result: ImportedQueue, name: str, number: int, problem: str) -> None:
    where = segment_filename(name, number)
    result.damaged.append(f"{where}: {problem}")
    log.warning("nsqd import: queue %s: %s: %s; kept the messages before it, skipping to the next file "
                "(saved as %s.bad)", name, where, problem, where)


# ------------------------------------------------------------------------------------------ retire

def _retire(directory: str, name: str, *, forget_meta: bool) -> None:
    """Step 3 for the queue ``name``: its claimed checkpoint first, then its claimed segments."""
    if forget_meta:
        fileops.unlink(os.path.join(directory, _claimed_meta(name)))
        fsync_path(directory)
    prefix = name + CLAIMED_INFIX
    for entry in fileops.listdir(directory):
        if not entry.startswith(prefix):
            continue
        rest = entry[len(prefix):]
        if rest.endswith(".dat") and rest[:-4].isdecimal():
            fileops.unlink(os.path.join(directory, entry))
        elif rest.endswith(".dat" + _BAD) and rest[:-8].isdecimal():
            target = os.path.join(directory, segment_filename(name, int(rest[:-8])) + _BAD)
            if fileops.exists(target):
                target = f"{target[:-len(_BAD)]}.{time.time_ns()}{_BAD}"
            fileops.rename(os.path.join(directory, entry), target)
            log.warning("nsqd import: queue %s: damaged nsqd file kept as %s", name, target)
    fsync_path(directory)
