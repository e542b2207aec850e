"""Reading a data directory without changing it: listing segments, verifying their records.

Shared by recovery (which then repairs what it found) and ``check()`` (which only reports).
All functions here block on file I/O.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .format import (
    HEADER_SIZE,
    SegmentHeader,
    decode_header,
    decode_records,
    next_record_size,
    segment_filename,
    segment_pattern,
)

__all__ = ["SCAN_CHUNK", "SegmentScan", "list_segments", "read_header", "scan_segment"]

SCAN_CHUNK = 4 << 20
_ALL = 1 << 62  # "as many records as there are"


def list_segments(data_path: str, name: str) -> list[int]:
    """Numbers of the segment files of queue ``name`` in ``data_path``, ascending."""
    pattern = segment_pattern(name)
    found = []
    for entry in os.listdir(data_path):
        match = pattern.fullmatch(entry)
        if match:
            found.append(int(match.group(1)))
    found.sort()
    return found


def read_header(path: str, number: int) -> tuple[SegmentHeader | None, int, str | None]:
    """``(header or None, file size, problem)`` for the segment file at ``path``.

    A missing file is reported as a problem, not raised.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None, 0, "segment file is missing"
    try:
        size = os.fstat(fd).st_size
        header, problem = decode_header(os.pread(fd, HEADER_SIZE, 0), number)
    finally:
        os.close(fd)
    return header, size, problem


@dataclass(slots=True)
class SegmentScan:
    """What verifying one segment found.

    ``records`` valid records lie in ``[start, end)``. ``problem`` is None when the valid
    data reaches the end of the file; otherwise it names what is wrong at ``end``, and
    ``torn`` says whether the invalid rest looks like an interrupted write (a record cut
    short by the end of the file, or nothing but zero bytes) rather than damage in the
    middle of data.
    """

    number: int
    size: int
    start: int
    records: int
    end: int
    problem: str | None = None
    torn: bool = False


def scan_segment(
    data_path: str, name: str, number: int, start: int, min_size: int, max_size: int
) -> SegmentScan:
    """Verify every record of segment ``number`` from byte ``start`` to the end of the file."""
    path = os.path.join(data_path, segment_filename(name, number))
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        result = SegmentScan(number, size, start, 0, start)
        if start > size:
            result.problem = f"file is {size} bytes, shorter than offset {start}"
            result.end = size
            result.torn = True
            return result
        pos = start
        chunk = SCAN_CHUNK
        while pos < size:
            buf = os.pread(fd, min(chunk, size - pos), pos)
            payloads, off, problem = decode_records(buf, 0, _ALL, min_size, max_size)
            result.records += len(payloads)
            pos += off
            if problem is None and pos < size:
                need, problem = next_record_size(buf, off, max_size)
                if problem is None:
                    if pos + need > size:
                        result.problem = "record extends past the end of the file"
                        result.torn = True
                        break
                    chunk = max(SCAN_CHUNK, need)
                    continue
            if problem is not None:
                result.problem = problem
                result.torn = _only_zeros(fd, pos, size)
                break
        result.end = pos
        return result
    finally:
        os.close(fd)


def _only_zeros(fd: int, pos: int, size: int) -> bool:
    while pos < size:
        block = os.pread(fd, min(SCAN_CHUNK, size - pos), pos)
        if not block:
            break
        if block.strip(b"\0"):
            return False
        pos += len(block)
    return True
