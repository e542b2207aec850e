"""Reading a data directory without changing it: listing segments, verifying their records.

Shared by recovery (which then repairs what it found) and ``check()`` (which only reports).
All functions here block on file I/O.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

from . import fileops
from .errors import describe_os_error
from .format import (
    HEADER_SIZE,
    RECORD,
    RECORD_HEADER_SIZE,
    SegmentHeader,
    decode_header,
    decode_records,
    find_record,
    next_record_size,
    record_end,
    segment_filename,
    segment_number,
)

__all__ = ["RESYNC_HOPS", "SCAN_CHUNK", "SegmentScan", "list_segments", "read_header", "resync", "scan_segment"]

SCAN_CHUNK = 4 << 20
RESYNC_HOPS = 64  # damaged records in a row skipped by following their length fields
_ALL = 1 << 62  # "as many records as there are"


def list_segments(data_path: str, name: str, entries: list[str] | None = None) -> list[int]:
    """Numbers of the segment files of queue ``name`` in ``data_path``, ascending.

    ``entries`` are file names already listed (see ``listing.py``); None lists the directory.
    """
    found = []
    for entry in fileops.listdir(data_path) if entries is None else entries:
        number = segment_number(name, entry)
        if number is not None:
            found.append(number)
    found.sort()
    return found


def read_header(path: str, number: int) -> tuple[SegmentHeader | None, int, str | None]:
    """``(header or None, file size, problem)`` for the segment file at ``path``.

    A missing file, something else than a regular file in its place (a directory) and a
    read error are reported as problems, not raised.
    """
    try:
        fd = fileops.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None, 0, "segment file is missing"
    try:
        info = fileops.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None, 0, "not a regular file"
        header, problem = decode_header(fileops.pread(fd, HEADER_SIZE, 0), number)
    except OSError as exc:
        return None, 0, f"header unreadable: {describe_os_error('read', path, exc)}"
    finally:
        fileops.close(fd)
    return header, info.st_size, problem


def resync(fd: int, pos: int, limit: int, min_size: int, max_size: int) -> int | None:
    """Where reading can resume after the invalid record at ``pos``, before ``limit``; None if nowhere.

    When the record's length is plausible and the record after it is valid, that is just
    past it: only the damaged record is skipped; the same goes for a run of up to
    ``RESYNC_HOPS`` damaged records whose lengths are intact. Otherwise the first offset past
    ``pos`` where ``find_record`` finds a record. A length that leads exactly to ``limit`` has
    no record after it to vouch for it (a damaged length can happen to, and would skip the
    valid records it covers): the scan comes first then, and ``limit`` is the answer only when
    it finds nothing. Reads the file in windows of ``SCAN_CHUNK`` plus room for two records of
    ``max_size``. Returns None when no valid record follows or the file cannot be read.
    """
    try:
        at = pos
        ends_at_limit = False
        for _ in range(RESYNC_HOPS):
            head = fileops.pread(fd, RECORD_HEADER_SIZE, at)
            if len(head) < RECORD_HEADER_SIZE:
                break
            length, _ = RECORD.unpack(head)
            after = at + RECORD_HEADER_SIZE + length
            if not min_size <= length <= max_size or after > limit:
                break
            if after == limit:
                ends_at_limit = True
                break
            probe = fileops.pread(fd, min(limit - after, RECORD_HEADER_SIZE + max_size), after)
            if record_end(probe, 0, min_size, max_size) >= 0:
                return after
            at = after
        slack = 2 * (RECORD_HEADER_SIZE + max_size)
        start = pos + 1
        while start < limit:
            window = fileops.pread(fd, min(limit - start, SCAN_CHUNK + slack), start)
            if not window:
                return None
            at_end = start + len(window) >= limit
            stop = len(window) if at_end else SCAN_CHUNK
            found = find_record(window, 0, stop, min_size, max_size, at_end)
            if found >= 0:
                return start + found
            start += stop
    except OSError:
        return None
    return limit if ends_at_limit else None


@dataclass(slots=True)
class SegmentScan:
    """What verifying one segment found.

    ``records`` valid records lie in ``[start, end)``. ``skipped`` lists the damaged spans
    read past by resynchronising: ``(offset, resumed at, problem)``. ``problem`` is None
    when the valid data reaches the end of the file; otherwise it names what is wrong at
    ``end``, and ``torn`` says whether the invalid rest looks like an interrupted write (a
    record cut short by the end of the file, or nothing but zero bytes) rather than damage
    in the middle of data. ``before_mark`` counts the valid records starting before the
    ``mark`` offset the scan was given.
    """

    number: int
    size: int
    start: int
    records: int
    end: int
    problem: str | None = None
    torn: bool = False
    skipped: list[tuple[int, int, str]] = field(default_factory=list)
    before_mark: int = 0


def scan_segment(
    data_path: str, name: str, number: int, start: int, min_size: int, max_size: int,
    *, resync_until: int = 0, mark: int = 0,
) -> SegmentScan:
    """Verify every record of segment ``number`` from byte ``start`` to the end of the file.

    Damage found before offset ``resync_until`` is read past when a valid record follows
    (see ``resync``); damage at or after it ends the scan, as it does when nothing valid
    follows.
    """
    path = os.path.join(data_path, segment_filename(name, number))
    fd = fileops.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = fileops.fstat(fd).st_size
        result = SegmentScan(number, size, start, 0, start)
        if start > size:
            result.problem = f"file is {size} bytes, shorter than offset {start}"
            result.end = size
            result.torn = True
            return result
        pos = start
        chunk = SCAN_CHUNK
        while pos < size:
            buf = fileops.pread(fd, min(chunk, size - pos), pos)
            payloads, off, problem = decode_records(buf, 0, _ALL, min_size, max_size)
            result.records += len(payloads)
            if pos < mark:
                result.before_mark += _starting_before(payloads, pos, mark)
            pos += off
            if problem is None and pos < size:
                need, problem = next_record_size(buf, off, max_size)
                if problem is None:
                    if pos + need > size:
                        problem = "record extends past the end of the file"
                        resume = resync(fd, pos, size, min_size, max_size) if pos < resync_until else None
                        if resume is None:
                            result.problem = problem
                            result.torn = True
                            break
                        result.skipped.append((pos, resume, problem))
                        pos = resume
                        continue
                    chunk = max(SCAN_CHUNK, need)
                    continue
            if problem is not None:
                # nothing but zero bytes to the end (a preallocated rest, or data that never
                # landed) holds no record to resynchronise on
                zeros = _only_zeros(fd, pos, size)
                resume = resync(fd, pos, size, min_size, max_size) if pos < resync_until and not zeros else None
                if resume is None:
                    result.problem = problem
                    result.torn = zeros
                    break
                result.skipped.append((pos, resume, problem))
                pos = resume
        result.end = pos
        return result
    finally:
        fileops.close(fd)


def _starting_before(payloads: list[bytes], pos: int, mark: int) -> int:
    """How many of ``payloads``, read back to back from ``pos``, start before ``mark``."""
    count = 0
    for payload in payloads:
        if pos >= mark:
            break
        count += 1
        pos += RECORD_HEADER_SIZE + len(payload)
    return count


def _only_zeros(fd: int, pos: int, size: int) -> bool:
    while pos < size:
        block = fileops.pread(fd, min(SCAN_CHUNK, size - pos), pos)
        if not block:
            break
        if block.strip(b"\0"):
            return False
        pos += len(block)
    return True
