"""Starting on the data directory of an nsqd: its disk queues become pynsqd's, backlog included.

nsqd 1.3.0 names its queue files as pynsqd does, in another format (see
:mod:`broker.storage.nsqdreader`): ``<name>.diskqueue.NNNNNN.dat`` segments and a text
checkpoint ``<name>.diskqueue.meta.dat``. ``<name>`` is the topic, or
``<topic>:<channel>``: the same names pynsqd gives its topic and channel queues, and
nsqd's message layout is pynsqd's plain record. Each queue gets exactly the messages nsqd
would deliver from its files, read as nsqd reads them (:class:`NsqdQueueRead`).

:func:`import_nsqd_queues` runs at start-up, with the directory locked and before any
queue opens. Every step can be interrupted (``kill -9``, power loss) and is redone or
finished by the next start, so every message nsqd would deliver ends up in pynsqd's
queue exactly once:

1. *Claim.* Every queue whose checkpoint is nsqd's text is renamed out of the way of
   pynsqd's queue of the same name: ``<name>.diskqueue.NNNNNN.dat`` becomes
   ``<name>.nsqd-import.NNNNNN.dat`` for every queue, the directory is fsynced, then the
   checkpoints become ``<name>.nsqd-import.meta.dat`` (fsynced again). While an nsqd
   checkpoint still has its old name its claim is redone (renaming what is left); once it
   is renamed, no nsqd file of that queue has a name of pynsqd's, so pynsqd's queue of that
   name starts with no files, its records numbered from 0.
2. *Copy.* The claimed queues are copied side by side (:data:`IMPORT_CONCURRENCY` at a
   time; large files are read in worker threads). For each, pynsqd's queue of that name
   counts its records (its write sequence number): they are the first messages of the
   nsqd queue, copied by an interrupted earlier run, so that many are skipped and the rest
   appended. The queue's own files are the progress marker: a record appended is, after a
   kill, either wholly there or cut off by the queue's recovery, and the count always
   matches what was appended. Nothing reads the queue before step 3, so its depth equals
   its count; when it does not (a power cut lost copied records whose successors
   survived), the queue is deleted and the copy starts over. The queue is then synced and
   closed. A queue with nothing to copy gets no files at all.
3. *Retire*, once every queue is copied. First the files nsqd would not have read to
   their end are renamed ``<name>.nsqd-import.NNNNNN.dat.unread`` and the damaged ones
   ``...dat.bad`` (directory fsynced); then the claimed checkpoints are removed (fsynced):
   from then on the queues count as imported. Then the claimed files become nsqd's names
   plus ``.unread`` or ``.bad``, or are removed when they were read whole (fsynced).
   Claimed files without a claimed checkpoint are leftovers of an interrupted retirement
   and are retired the same way; the replay of a queue does not change when its files are
   renamed within the claimed names, so a copy started again reads the same records.

A file that cannot be read (damaged, a directory, gone) gets nsqd's treatment and a
warning, never an exception: the messages before the damage are kept, the file set
aside. A checkpoint nsqd would misread is read as nsqd reads it, with a warning. Files
the OS refuses to move or remove stop the start with ``OSError``, nothing lost (a queue
left half imported must not be written by a running broker). Every change goes through
``diskqueue.fileops``, as the disk queues' do, so the power-cut simulation of the tests
covers it.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import trio

from broker.core.host import QueueStore
from broker.core.message import RECORD_OVERHEAD
from broker.storage.nsqdreader import META_READ_MAX, NsqdQueueRead, looks_like_nsqd_meta, nsqd_number
from diskqueue import DiskQueue, DiskQueueError, fileops
from diskqueue.checkpoint import fsync_path
from diskqueue.format import SEGMENT_MAGIC, meta_filename, segment_filename

__all__ = ["CLAIMED_INFIX", "IMPORT_CONCURRENCY", "ImportedQueue", "NsqdImportError", "import_nsqd_queues"]

log = logging.getLogger("pynsqd.import")

#: What a claimed nsqd file has in its name in place of ``.diskqueue.``: pynsqd's queues
#: (and their directory listing) never see it.
CLAIMED_INFIX = ".nsqd-import."
_QUEUE_INFIX = ".diskqueue."
_META = "meta.dat"
#: What a claimed file's name ends with once set aside: damaged (nsqd's own word), or not
#: reached by nsqd's reader.
_BAD = ".bad"
_UNREAD = ".unread"
#: Queues copied at once: their final syncs overlap (a file system commits the fsyncs of
#: many files together), and their large files are read in worker threads side by side.
IMPORT_CONCURRENCY = 16
#: A queue whose files hold more than this is read in a worker thread: reading waits on
#: the disk without holding the event loop; a smaller one is read at once (a thread's
#: round trip costs more than the read).
THREAD_READ_BYTES = 256 * 1024
#: Bytes of records appended to pynsqd's queue per call (and read per worker thread's turn).
_BATCH_BYTES = 64 * 1024
#: Seconds between progress lines while queues are copied.
PROGRESS_INTERVAL = 5.0
_MB = 1024 * 1024


class NsqdImportError(RuntimeError):
    """pynsqd's queue could not take the messages of nsqd's (a disk error); the start fails and the
    next one carries on."""


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


class _Found:
    """One queue's files in the directory: nsqd's, and those claimed by the import."""

    __slots__ = ("nsqd_meta", "nsqd_segments", "claimed_meta", "claimed", "meta")

    def __init__(self) -> None:
        self.nsqd_meta = False  # a checkpoint with nsqd's name (nsqd's or pynsqd's)
        self.meta: bytes | None = None  # nsqd's checkpoint, once read
        self.nsqd_segments: dict[int, str] = {}  # number -> file name
        self.claimed_meta = False
        self.claimed: dict[int, str] = {}  # number -> file name, with its suffix ("", .bad, .unread)


def _claimed_segment(name: str, number: int, suffix: str = "") -> str:
    return f"{name}{CLAIMED_INFIX}{number:06d}.dat{suffix}"


def _claimed_meta(name: str) -> str:
    return f"{name}{CLAIMED_INFIX}{_META}"


def _suffix(entry: str) -> str:
    return _BAD if entry.endswith(_BAD) else _UNREAD if entry.endswith(_UNREAD) else ""


def _group(entries: list[str]) -> dict[str, _Found]:
    """The files of ``entries`` (a directory listing) that the import looks at, by queue name."""
    found: dict[str, _Found] = {}
    for entry in entries:
        for infix in (_QUEUE_INFIX, CLAIMED_INFIX):
            at = entry.rfind(infix)
            if at <= 0:
                continue
            name, rest = entry[:at], entry[at + len(infix):]
            claimed = infix == CLAIMED_INFIX
            if rest == _META:
                queue = found.setdefault(name, _Found())
                if claimed:
                    queue.claimed_meta = True
                else:
                    queue.nsqd_meta = True
                continue
            suffix = _suffix(rest) if claimed else ""
            body = rest[:len(rest) - len(suffix)]
            number = nsqd_number(body[:-4]) if body.endswith(".dat") else None
            if number is not None:
                queue = found.setdefault(name, _Found())
                (queue.claimed if claimed else queue.nsqd_segments)[number] = entry
    return found


async def import_nsqd_queues(data_path: Path, queues: QueueStore, max_msg_size: int, *,
                             concurrency: int = IMPORT_CONCURRENCY) -> list[ImportedQueue]:
    """Import every nsqd queue of ``data_path`` into pynsqd's queues of the same names (see the module docstring).

    ``queues`` opens pynsqd's queues (its listing of the directory is made here, after the
    claim); ``max_msg_size`` is ``--max-msg-size`` (nsqd's bound on a record is that plus
    26). Logs what it does: a line per queue, progress every :data:`PROGRESS_INTERVAL`
    seconds, the totals. Raises ``OSError`` when files cannot be renamed or removed,
    ``DiskQueueError`` when pynsqd's queue cannot be written or synced; a restart carries on.
    Returns what was imported, by queue name.
    """
    started = time.monotonic()
    directory = str(data_path)
    found = _group(fileops.listdir(directory))
    _claim(directory, found)
    if not any(q.claimed_meta or q.claimed for q in found.values()):
        return []  # the usual start: one listing of the directory, one read per checkpoint
    names = sorted(name for name, q in found.items() if q.claimed_meta)
    copied: list[tuple[ImportedQueue, NsqdQueueRead]] = []
    if names:
        queues.list_directory()
        copied = await _Copier(directory, found, queues, max_msg_size).run(names, concurrency)
    set_aside = _retire(directory, found, copied)
    if names:
        log.info("nsqd import: imported %d message(s) of %d nsqd queue(s) in %.2f s%s",
                 sum(result.messages for result, _ in copied), len(names), time.monotonic() - started,
                 f"; {set_aside} nsqd file(s) set aside (see the warnings above)" if set_aside else "")
    return [result for result, _ in copied]


# ------------------------------------------------------------------------------------------- claim

def _claim(directory: str, found: dict[str, _Found]) -> None:
    """Step 1 for every queue whose checkpoint is nsqd's."""
    for name, queue in found.items():
        if queue.nsqd_meta:
            meta = _read_meta(os.path.join(directory, meta_filename(name)))
            if meta is not None and looks_like_nsqd_meta(meta):  # else pynsqd's own queue's
                queue.meta = meta
            if queue.meta is not None and queue.claimed_meta:  # never over an import not finished
                log.warning("nsqd import: queue %s: %s is left as it is until the import of the queue's claimed "
                            "files is finished", name, meta_filename(name))
                queue.meta = None
    names = sorted(name for name, q in found.items() if q.meta is not None)
    for name in names:
        queue = found[name]
        for number, entry in sorted(queue.nsqd_segments.items()):
            path = os.path.join(directory, entry)
            if _is_pynsqd_segment(path):
                continue
            if number in queue.claimed:  # left by an earlier import: never overwritten
                log.warning("nsqd import: queue %s: %s is left as it is: %s holds file %06d already", name, entry,
                            queue.claimed[number], number)
                continue
            claimed = _claimed_segment(name, number)
            fileops.rename(path, os.path.join(directory, claimed))
            queue.claimed[number] = claimed
            del queue.nsqd_segments[number]
    if not names:
        return
    fsync_path(directory)  # the segments' new names are durable before the checkpoints' that count on them
    for name in names:
        fileops.rename(os.path.join(directory, meta_filename(name)), os.path.join(directory, _claimed_meta(name)))
        found[name].nsqd_meta = False
        found[name].claimed_meta = True
    fsync_path(directory)
    log.info("nsqd import: found %d queue(s) of nsqd in %s", len(names), directory)


def _read_meta(path: str) -> bytes | None:
    """The start of the checkpoint at ``path`` (all nsqd reads of one), None when it cannot be read."""
    try:
        fd = fileops.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return fileops.pread(fd, META_READ_MAX, 0)
    except OSError:  # a directory
        return None
    finally:
        fileops.close(fd)


def _is_pynsqd_segment(path: str) -> bool:
    """Whether the file starts with pynsqd's segment header (an nsqd segment starts with a record's
    length, which is never as large as those four bytes read as a number)."""
    try:
        fd = fileops.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        return fileops.pread(fd, len(SEGMENT_MAGIC), 0) == SEGMENT_MAGIC
    except OSError:
        return False
    finally:
        fileops.close(fd)


# -------------------------------------------------------------------------------------------- copy

class _Copier:
    """Step 2 for the claimed queues, side by side, with the progress the log shows."""

    def __init__(self, directory: str, found: dict[str, _Found], queues: QueueStore, max_msg_size: int):
        self.directory = directory
        self.found = found
        self.queues = queues
        self.max_msg_size = max_msg_size
        self.done = 0
        self.messages = 0
        self.read_bytes = 0
        self.total_bytes = 0
        self.started = 0.0

    async def run(self, names: list[str], concurrency: int) -> list[tuple[ImportedQueue, NsqdQueueRead]]:
        """Copy the queues ``names``; raises the first error any of them met (the others stop)."""
        self.started = time.monotonic()
        readers = {name: self._reader(name) for name in names}
        self.total_bytes = sum(reader.total_bytes for reader in readers.values())
        files = sum(len(self.found[name].claimed) for name in names)
        log.info("nsqd import: importing %d nsqd queue(s) (%d file(s), %.1f MB), %d at a time", len(names), files,
                 self.total_bytes / _MB, concurrency)
        results: dict[str, ImportedQueue] = {}
        failures: list[BaseException] = []
        limiter = trio.CapacityLimiter(concurrency)
        async with trio.open_nursery() as outer:
            outer.start_soon(self._report_progress, len(names))
            async with trio.open_nursery() as copies:
                for name in names:
                    await limiter.acquire_on_behalf_of(name)
                    if failures:
                        limiter.release_on_behalf_of(name)
                        break
                    copies.start_soon(self._copy_one, name, readers[name], results, failures, limiter, copies)
            outer.cancel_scope.cancel()
        if failures:
            raise failures[0]
        return [(results[name], readers[name]) for name in names]

    def _reader(self, name: str) -> NsqdQueueRead:
        queue = self.found[name]
        files = {number: os.path.join(self.directory, entry) for number, entry in queue.claimed.items()}
        meta = queue.meta if queue.meta is not None else _read_meta(os.path.join(self.directory, _claimed_meta(name)))
        return NsqdQueueRead(name, files, meta, RECORD_OVERHEAD, self.max_msg_size + RECORD_OVERHEAD)

    async def _copy_one(self, name: str, reader: NsqdQueueRead, results: dict[str, ImportedQueue],
                        failures: list[BaseException], limiter: trio.CapacityLimiter, copies: trio.Nursery) -> None:
        try:
            results[name] = await self._copy(name, reader)
            self.done += 1
        except (DiskQueueError, OSError) as exc:
            failures.append(exc)
            copies.cancel_scope.cancel()
        finally:
            limiter.release_on_behalf_of(name)

    async def _copy(self, name: str, reader: NsqdQueueRead) -> ImportedQueue:
        """Append what pynsqd's queue ``name`` does not hold yet of what nsqd would deliver, sync, close."""
        if reader.scan.error is not None:
            log.warning("nsqd import: queue %s: nsqd cannot read its checkpoint whole (%s); reading it as nsqd "
                        "does: %s", name, reader.scan.error, reader.describe_cursor())
        result = ImportedQueue(name)
        target: DiskQueue | None = None
        skip = 0
        try:
            if self.queues.exists(name):  # an interrupted import copied some already
                target = self._resume(name)
                skip = result.resumed = target.write_seq
            batches = reader.records(_BATCH_BYTES)
            in_thread = reader.total_bytes > THREAD_READ_BYTES
            try:
                while True:
                    batch = await trio.to_thread.run_sync(next, batches, None) if in_thread else next(batches, None)
                    if batch is None:
                        break
                    self.read_bytes += sum(map(len, batch))
                    if skip:
                        dropped = min(skip, len(batch))
                        skip -= dropped
                        batch = batch[dropped:]
                    if batch:
                        if target is None:
                            target = self.queues.open(name)
                        target.put_many(batch)
                        result.appended += len(batch)
                        self.messages += len(batch)
                    await trio.lowlevel.checkpoint()
            finally:
                batches.close()
            if skip:
                log.warning("nsqd import: queue %s holds %d more messages than the nsqd queue has; "
                            "they were left as they are", name, skip)
                result.resumed -= skip
        finally:
            if target is not None:
                await target.close()
        self.messages += result.resumed
        self._report_damage(name, reader, result)
        if result.resumed:
            log.info("nsqd import: queue %s: imported %d messages (%d of them before an interruption)",
                     name, result.messages, result.resumed)
        else:
            log.info("nsqd import: queue %s: imported %d messages", name, result.messages)
        return result

    def _resume(self, name: str) -> DiskQueue:
        target = self.queues.open(name)
        if target.damage_found or target.depth != target.write_seq:
            # Records copied before a power cut went missing from pynsqd's queue, so its count no
            # longer says how far the copy got. Nothing has read the queue yet: start it over.
            log.warning("nsqd import: queue %s: what an interrupted import had copied is damaged; copying again", name)
            target.delete()
            target = self.queues.open(name)
        return target

    @staticmethod
    def _report_damage(name: str, reader: NsqdQueueRead, result: ImportedQueue) -> None:
        for first, last in reader.missing:
            where = reader.file_name(first)
            what = "segment file is missing"
            if last != first:
                where += f" to {reader.file_name(last)}"
                what = "segment files are missing"
            result.damaged.append(f"{where}: {what}")
            log.warning("nsqd import: queue %s: %s: %s; skipping to the next file, as nsqd does", name, where, what)
        for number, problem in sorted(reader.bad.items()):
            where = reader.file_name(number)
            result.damaged.append(f"{where}: {problem}")
            log.warning("nsqd import: queue %s: %s: %s; kept the messages before it, skipping to the next file "
                        "(saved as %s.bad)", name, where, problem, where)
        if reader.endless:
            log.warning("nsqd import: queue %s: nsqd's reader would look for one missing file after another for "
                        "ever (%s) and deliver nothing more", name, reader.describe_cursor())

    async def _report_progress(self, total: int) -> None:
        while True:
            await trio.sleep(PROGRESS_INTERVAL)
            log.info("nsqd import: %d of %d queue(s) imported, %d message(s), %.1f of %.1f MB read (%.0f s)",
                     self.done, total, self.messages, self.read_bytes / _MB, self.total_bytes / _MB,
                     time.monotonic() - self.started)


# ------------------------------------------------------------------------------------------ retire

def _retire(directory: str, found: dict[str, _Found], copied: list[tuple[ImportedQueue, NsqdQueueRead]]) -> int:
    """Step 3 for the queues copied, and for the leftovers of an interrupted retirement;
    returns how many nsqd files were set aside (damaged or unread)."""
    renamed = False
    for result, reader in copied:  # marked by their names before the checkpoints that explain them go
        queue = found[result.name]
        unread = reader.unread()
        for number, entry in sorted(queue.claimed.items()):
            suffix = _BAD if number in reader.bad else _UNREAD if number in unread else ""
            if number in unread:
                log.warning("nsqd import: queue %s: %s not imported: %s", result.name, reader.file_name(number),
                            unread[number])
            if _suffix(entry) != suffix:
                wanted = _claimed_segment(result.name, number, suffix)
                fileops.rename(os.path.join(directory, entry), os.path.join(directory, wanted))
                queue.claimed[number] = wanted
                renamed = True
    if renamed:
        fsync_path(directory)
    for result, _ in copied:
        fileops.unlink(os.path.join(directory, _claimed_meta(result.name)))
        found[result.name].claimed_meta = False
    if copied:
        fsync_path(directory)
    changed = False
    set_aside = 0
    for name, queue in sorted(found.items()):
        if queue.claimed_meta:
            continue
        for number, entry in sorted(queue.claimed.items()):
            path = os.path.join(directory, entry)
            suffix = _suffix(entry)
            if not suffix:
                fileops.unlink(path)
            else:
                set_aside += 1
                target = os.path.join(directory, segment_filename(name, number) + suffix)
                if fileops.exists(target):
                    target = f"{target[:-len(suffix)]}.{time.time_ns()}{suffix}"
                fileops.rename(path, target)
                log.warning("nsqd import: queue %s: %s nsqd file kept as %s", name,
                            "damaged" if suffix == _BAD else "unread", target)
            changed = True
        queue.claimed.clear()
    if changed:
        fsync_path(directory)
    return set_aside
