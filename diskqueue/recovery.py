"""Opening a data directory: find where reading resumes and writing continues, repair the tail.

1. Read the checkpoint. Segments numbered below its committed cursor were fully consumed
   before the last checkpoint; they are removed.
2. Trust the checkpoint when the files agree with it: every segment from the committed one
   to the written one exists with a valid header, and none is shorter than the checkpoint
   says. Then only the data written after the checkpoint (the unsynced tail) is verified,
   and the depth is the checkpoint's depth plus the records found there.
3. Otherwise count: verify every record from the committed cursor (or, without a usable
   checkpoint, from the start of the oldest segment: consumed records may come back, never
   unconsumed ones go missing) to the end. The depth is exactly the records found.
4. Either way, walking the segments:
   * records that are complete and checksum-valid are kept, checkpointed or not, and a
     segment holding such records past the checkpoint is fsynced;
   * in the newest segment, an interrupted write (a record cut short by the end of the
     file, or a zero-filled rest: a preallocated one too, see ``writer.py``) or anything
     invalid past the last checkpointed position is cut off with ``ftruncate``: it is never
     read as data, and the file ends on a record boundary (writing then continues in a new
     segment, see ``queue.py``);
   * in an older segment, a rest of nothing but zero bytes is cut off the same way when the
     next segment's first sequence number follows its last record: a preallocated rest
     whose cutting off at the roll did not reach the disk before a power cut;
   * anything else invalid is damage: reading resynchronises on the next valid record after
     it (see ``scan.resync``), or, when none follows, stops at that offset and skips to the
     next segment; the segment is renamed ``.bad`` once consumed. How many records were
     lost is the next segment's first sequence number (in the newest segment, the
     checkpointed write cursor's) minus the records counted;
   * a missing segment is skipped the same way, its records counted as lost.
5. Damage inside data a trusted checkpoint vouches for is not looked for on open (that
   would read the whole queue); the reader finds it when it gets there and handles it the
   same way, and the depth drops by exactly the records lost, counted once even across
   restarts (the checkpoint lists such segments).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

from . import fileops
from .checkpoint import TEMP_SUFFIX, Checkpoint, Cursor, fsync_path, load_checkpoint
from .format import HEADER_SIZE, SegmentHeader, meta_filename, segment_filename
from .scan import list_segments, read_header, scan_segment

__all__ = ["Recovered", "recover", "set_aside"]

_ANYWHERE = 1 << 62
_Headers = dict[int, tuple[SegmentHeader | None, int, str | None]]


@dataclass(slots=True)
class Recovered:
    """The queue state recovery settled on, and what it found on the way.

    ``bad`` maps a damaged segment to where reading it stops (its size when reading went
    past the damage); ``damaged`` lists ``(segment, offset, resumed at)`` of each damaged
    span read past.
    """

    segments: list[int]
    commit: Cursor
    write: Cursor
    write_exists: bool
    depth: int
    bad: dict[int, int] = field(default_factory=dict)
    damaged: list[tuple[int, int, int]] = field(default_factory=list)
    accounted: set[int] = field(default_factory=set)
    lost: int = 0
    lost_unknown: bool = False
    checkpoint_state: str = "missing"
    note: bytes = b""
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def report(self, log: logging.Logger, name: str) -> None:
        """Log what recovery of queue ``name`` found."""
        for note in self.notes:
            log.info("DISKQUEUE(%s): %s", name, note)
        for problem in self.problems:
            log.warning("DISKQUEUE(%s): %s", name, problem)
        if self.lost:
            log.warning("DISKQUEUE(%s): %d record(s) lost to damaged or missing files", name, self.lost)


def set_aside(path: str) -> str:
    """Rename a damaged file to ``<path>.bad`` (or a unique variant); returns the new path."""
    target = path + ".bad"
    if fileops.exists(target):
        target = f"{path}.{time.time_ns()}.bad"
    fileops.rename(path, target)
    return target


def recover(
    data_path: str,
    name: str,
    min_size: int,
    max_size: int,
    *,
    repair: bool = True,
    verify_all: bool = False,
    entries: list[str] | None = None,
) -> Recovered:
    """Work out the state of queue ``name`` in ``data_path``.

    With ``repair`` (opening a queue) the files are fixed up as the module docstring says;
    without it (``check()``) nothing is changed. ``verify_all`` verifies every record from
    the committed cursor even when the checkpoint is trusted. ``entries`` are the names of
    the queue's files from a listing of the directory (see ``listing.py``); None lists it.
    Blocking. Raises ``FormatVersionError`` for files of a newer format.
    """
    if entries is not None and not entries:  # no files: a new queue (most of a restart's queues)
        origin = Cursor(0, HEADER_SIZE, 0)
        return Recovered(segments=[], commit=origin, write=origin, write_exists=False, depth=0)
    changed_dir = False
    meta = os.path.join(data_path, meta_filename(name))
    stray = (meta_filename(name) + TEMP_SUFFIX in entries) if entries is not None else fileops.exists(meta + TEMP_SUFFIX)
    if repair and stray:
        try:
            fileops.unlink(meta + TEMP_SUFFIX)
        except IsADirectoryError:
            set_aside(meta + TEMP_SUFFIX)  # else every checkpoint written would fail on it
        changed_dir = True
    if entries is None or meta_filename(name) in entries:
        checkpoint, meta_problem = load_checkpoint(meta)
    else:
        checkpoint, meta_problem = None, None
    segments = list_segments(data_path, name, entries)
    state = Recovered(segments=[], commit=Cursor(0, HEADER_SIZE, 0), write=Cursor(0, HEADER_SIZE, 0),
                      write_exists=False, depth=0)
    if meta_problem is not None:
        state.checkpoint_state = f"unreadable: {meta_problem}"
        state.problems.append(f"checkpoint unreadable ({meta_problem}); replaying every segment on disk")
        if repair:
            set_aside(meta)
            changed_dir = True
    if checkpoint is not None:
        state.note = checkpoint.note
        consumed = [n for n in segments if n < checkpoint.commit.file]
        segments = [n for n in segments if n >= checkpoint.commit.file]
        if repair and consumed:
            for n in consumed:
                fileops.unlink(os.path.join(data_path, segment_filename(name, n)))
            changed_dir = True
            state.notes.append(f"removed {len(consumed)} consumed segment(s)")
    headers: _Headers = {n: read_header(os.path.join(data_path, segment_filename(name, n)), n) for n in segments}

    distrust = _distrust(checkpoint, segments, headers) if checkpoint is not None else None
    if checkpoint is not None and distrust is None and not verify_all:
        state.checkpoint_state = "ok"
        start = checkpoint.write
        state.commit = checkpoint.commit
        state.depth = checkpoint.depth
        state.bad = {f: e for f, e in checkpoint.bad if f >= checkpoint.commit.file}
        state.accounted = {f for f in checkpoint.accounted if f >= checkpoint.commit.file}
    else:
        if checkpoint is not None:
            state.checkpoint_state = "ok" if distrust is None else f"inconsistent: {distrust}"
            if distrust is not None:
                state.problems.append(
                    f"checkpoint does not match the files ({distrust}); counting records from the committed cursor"
                )
        start = _start_cursor(checkpoint, segments, headers, state)
        state.commit = start
    changed_dir |= _walk(data_path, name, segments, headers, start,
                         checkpoint.write if checkpoint is not None else None,
                         min_size, max_size, repair, state)
    if repair and changed_dir:
        fsync_path(data_path)
    return state


def _distrust(checkpoint: Checkpoint, segments: list[int], headers: _Headers) -> str | None:
    """Why the checkpoint does not match the files, or None when it does."""
    c, w = checkpoint.commit, checkpoint.write
    if (c.file, c.pos) > (w.file, w.pos) or c.seq > w.seq or checkpoint.depth > w.seq - c.seq:
        return "committed cursor is past the write cursor"
    if w.file - c.file > len(segments):
        return f"segments {c.file:06d}..{w.file:06d} do not all exist"
    for n in range(c.file, w.file + 1):
        if n not in headers:
            if n == w.file and w.pos == HEADER_SIZE:
                continue  # the write segment had not been created yet
            return f"segment {n:06d} is missing"
        header, size, problem = headers[n]
        if header is None:
            return f"segment {n:06d}: {problem}"
        if n == c.file and not (HEADER_SIZE <= c.pos <= size and header.first_seq <= c.seq):
            return f"segment {n:06d} does not hold the committed offset {c.pos}"
        if n == w.file and not (w.pos <= size and header.first_seq <= w.seq):
            return f"segment {n:06d} is {size} bytes, shorter than the checkpointed {w.pos}"
    return None


def _start_cursor(checkpoint: Checkpoint | None, segments: list[int], headers: _Headers,
                  state: Recovered) -> Cursor:
    """Where to start counting when the checkpoint cannot be trusted."""
    if checkpoint is not None:
        c = checkpoint.commit
        header, size, _ = headers.get(c.file, (None, 0, None))
        if header is not None and HEADER_SIZE <= c.pos <= size and header.first_seq <= c.seq:
            return c
    # The committed segment cannot be resumed (or there is no checkpoint): start at the first
    # readable segment after it. Unreadable ones before that are set aside once consumed.
    readable = [n for n in segments if headers[n][0] is not None
                and (checkpoint is None or n > checkpoint.commit.file)]
    for n in segments:
        if readable and n >= readable[0]:
            break
        state.bad[n] = HEADER_SIZE
        state.problems.append(f"segment {n:06d}: {headers[n][2] or 'does not hold the committed offset'}")
        state.lost_unknown = True
    if readable:
        header = headers[readable[0]][0]
        assert header is not None
        if checkpoint is not None and header.first_seq > checkpoint.commit.seq:
            _lose(state, header.first_seq - checkpoint.commit.seq, f"before segment {readable[0]:06d}")
        return Cursor(readable[0], HEADER_SIZE, header.first_seq)
    number = segments[-1] + 1 if segments else 0
    seq = 0
    if checkpoint is not None:
        number = max(number, checkpoint.write.file + 1)
        seq = checkpoint.commit.seq
    return Cursor(number, HEADER_SIZE, seq)


def _lose(state: Recovered, count: int, where: str) -> None:
    state.lost += count
    state.problems.append(f"{count} record(s) lost {where}")


def _walk(data_path: str, name: str, segments: list[int], headers: _Headers, start: Cursor,
          synced: Cursor | None, min_size: int, max_size: int, repair: bool, state: Recovered) -> bool:
    """Verify records from ``start`` to the end, recording findings in ``state``.

    Sets ``state.write``/``write_exists``/``segments`` and adds the records found to
    ``state.depth``. Returns whether the directory was changed.
    """
    changed = False
    seq, pos, prev = start.seq, start.pos, start.file
    todo = [n for n in segments if n >= start.file]
    kept = [n for n in segments if n < start.file]
    state.write, state.write_exists = start, start.file in headers
    for i, n in enumerate(todo):
        last = i == len(todo) - 1
        path = os.path.join(data_path, segment_filename(name, n))
        header, size, header_problem = headers[n]
        if n != start.file:
            if header is None:
                state.problems.append(f"segment {n:06d}: {header_problem}")
                state.lost_unknown = True
                if last:
                    # The newest segment is unreadable: set it aside now and write after it.
                    if repair:
                        set_aside(path)
                        changed = True
                    else:
                        kept.append(n)
                    state.write, state.write_exists = Cursor(n + 1, HEADER_SIZE, seq), False
                    break
                state.bad[n] = HEADER_SIZE
                state.accounted.add(n)
                kept.append(n)
                prev = n
                continue
            if header.first_seq > seq:
                where = (f"in segment {prev:06d}" if state.damaged and state.damaged[-1][0] == prev
                         else f"between segments {prev:06d} and {n:06d}")
                _lose(state, header.first_seq - seq, where)
                state.accounted.add(prev)
            elif header.first_seq < seq:
                state.notes.append(
                    f"segment {n:06d}: first sequence number {header.first_seq} is behind {seq}"
                )
            seq, pos = header.first_seq, HEADER_SIZE
        kept.append(n)
        # Damage is read past wherever records after it are known to have been written:
        # in any segment but the newest, and in the newest before the checkpointed end.
        # Past that it is an interrupted write, cut off below.
        resync_until, mark = _ANYWHERE, 0
        if last:
            resync_until = 0
            if synced is not None and synced.file > n:
                resync_until = _ANYWHERE
            elif synced is not None and synced.file == n:
                resync_until = mark = synced.pos
        if header is not None and pos == size:
            # Nothing after the cursor (the usual tail after a clean stop): the size read
            # with the header says so, and the segment need not be opened again.
            state.write, state.write_exists = Cursor(n, pos, seq), True
            continue
        scan = scan_segment(data_path, name, n, pos, min_size, max_size, resync_until=resync_until, mark=mark)
        first_seq = seq
        seq += scan.records
        state.depth += scan.records
        prev = n
        for at, resumed, problem in scan.skipped:
            state.problems.append(f"segment {n:06d} offset {at}: {problem}; "
                                  f"skipped {resumed - at} byte(s) to the next valid record")
            state.damaged.append((n, at, resumed))
        if scan.skipped:
            state.bad[n] = max(scan.size, state.bad.get(n, 0))  # set aside once consumed
            if last and synced is not None and synced.file == n and scan.end >= synced.pos:
                missing = synced.seq - first_seq - scan.before_mark
                if missing > 0:
                    _lose(state, missing, f"in segment {n:06d}")
                    state.accounted.add(n)
                    seq += missing
            elif last:
                state.lost_unknown = True
        if repair and scan.records and (synced is None or (n, scan.end) > (synced.file, synced.pos)):
            fsync_path(path)  # records found past the checkpoint may still be only in the page cache
        if scan.problem is None:
            state.write, state.write_exists = Cursor(n, scan.end, seq), True
            continue
        where = f"segment {n:06d} offset {scan.end}: {scan.problem}"
        if not last and scan.torn and _first_seq(headers, todo[i + 1]) == seq:
            # A preallocated rest whose cutting off at the roll did not reach the disk: only
            # zero bytes follow the records, and the next segment starts right after them.
            state.notes.append(f"{where}; cut off {scan.size - scan.end} zero byte(s) after the last record")
            if repair:
                _truncate(path, scan.end)
            continue
        if last and (scan.torn or synced is None or (n, scan.end) >= (synced.file, synced.pos)):
            cut = scan.size - scan.end
            state.notes.append(f"{where}; cut off {cut} byte(s) of interrupted write")
            if repair:
                _truncate(path, scan.end)
            state.write, state.write_exists = Cursor(n, scan.end, seq), True
            continue
        state.problems.append(f"{where}; skipping to the next segment")
        state.bad[n] = scan.end
        state.accounted.add(n)
        if last:
            resume = max(seq, synced.seq if synced is not None else seq)
            if resume > seq:
                _lose(state, resume - seq, f"after the corruption in segment {n:06d}")
            else:
                state.lost_unknown = True
            state.write, state.write_exists = Cursor(n + 1, HEADER_SIZE, resume), False
    if synced is not None and synced.seq > state.write.seq:
        _lose(state, synced.seq - state.write.seq, "from the end of the queue (files shorter than checkpointed)")
    state.segments = kept
    return changed


def _first_seq(headers: _Headers, number: int) -> int | None:
    header = headers[number][0]
    return None if header is None else header.first_seq


def _truncate(path: str, size: int) -> None:
    fd = fileops.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        fileops.ftruncate(fd, size)
        fileops.fsync(fd)
    finally:
        fileops.close(fd)
