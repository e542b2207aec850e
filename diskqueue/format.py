"""The on-disk layout: file names, the segment header and the record frame.

A queue named ``q`` in directory ``D`` is the files::

    D/q.diskqueue.000000.dat   segment 0 (numbers are zero-padded to six digits, as nsqd)
    D/q.diskqueue.000001.dat   segment 1 ...
    D/q.diskqueue.meta.dat     the checkpoint (see ``checkpoint.py``)
    D/q.diskqueue.000000.dat.bad   a segment set aside after corruption was found in it

Segment file (all integers big-endian)::

     0       4       6       8              12             16                     24      28      32
     +-------+-------+-------+--------------+--------------+----------------------+-------+-------+
     | "PDQS"|version|hdr len|segment number|   reserved   | sequence number of   | rsvd  |header |
     | magic |  u16  |  u16  |     u32      |      0       | the first record u64 |   0   |CRC u32|
     +-------+-------+-------+--------------+--------------+----------------------+-------+-------+
     | record | record | record | ...      (a new segment starts before a write would pass
     +--------+--------+--------+           max_bytes_per_file; a lone oversized record may)

Record::

     0              4              8
     +--------------+--------------+---------------------------+
     | length  u32  | CRC-32C u32  | payload (length bytes)    |
     +--------------+--------------+---------------------------+

* ``length`` counts the payload only; it must lie in ``[min_msg_size, max_msg_size]``.
* ``CRC-32C`` is the CRC-32C (Castagnoli) of the payload, except that an empty payload,
  whose CRC-32C is 0, stores ``EMPTY_PAYLOAD_CRC`` (0xFFFFFFFF): so a zero-filled region
  (a file extended by a crash before its data landed) never reads as a valid record. An
  empty record's header is still a constant that damage can forge (zero a length and flip
  the checksum's bytes, or flip a run of empty records: their flipped bytes hold the same
  header four bytes on); a queue whose ``min_msg_size`` is above 0 refuses those as
  implausible lengths (the broker's records are at least 26 bytes). The segment header's
  own checksum is zlib's CRC-32.
* ``version`` is ``FORMAT_VERSION``; a reader refuses a segment whose header checksum is
  valid but whose version is newer than it knows (``FormatVersionError``) instead of
  treating it as corrupt. ``hdr len`` lets a later version grow the header.
* The first record's sequence number lets a reader count exactly how many records were lost
  when it skips damaged data: the next segment's first sequence number minus this one's is
  how many records the segment holds, and every valid record read is one of them.
* Records carry no marker, so after damage a reader *resynchronises*: when the damaged
  record's length is plausible and the record after it checks out, only that record is
  skipped; otherwise it scans forward for the first offset where a record with a valid
  length and checksum starts and is followed by another (or ends the segment). A false
  match needs a 32-bit checksum to agree by chance.
"""

from __future__ import annotations

import re
import struct
import zlib
from itertools import repeat
from typing import NamedTuple

from .checksum import crc32c as _record_crc
from .errors import FormatVersionError

__all__ = [
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "EMPTY_PAYLOAD_CRC",
    "RECORD_HEADER_SIZE",
    "SEGMENT_MAGIC",
    "SegmentHeader",
    "decode_header",
    "decode_records",
    "encode_header",
    "find_record",
    "frame_records",
    "meta_filename",
    "next_record_size",
    "record_end",
    "segment_filename",
    "segment_number",
    "segment_pattern",
]

SEGMENT_MAGIC = b"PDQS"
FORMAT_VERSION = 1
HEADER_SIZE = 32
RECORD_HEADER_SIZE = 8
EMPTY_PAYLOAD_CRC = 0xFFFFFFFF

_HEADER = struct.Struct(">4sHHIIQI")  # everything but the trailing header CRC: 28 bytes
_HEADER_CRC = struct.Struct(">I")
RECORD = struct.Struct(">II")

_crc32 = zlib.crc32
_ZERO_HEADER = bytes(RECORD_HEADER_SIZE)
_NONZERO = re.compile(rb"[^\x00]")


def segment_filename(name: str, number: int) -> str:
    """File name (no directory) of segment ``number`` of queue ``name``."""
    return f"{name}.diskqueue.{number:06d}.dat"


def meta_filename(name: str) -> str:
    """File name (no directory) of the checkpoint of queue ``name``."""
    return f"{name}.diskqueue.meta.dat"


def segment_number(name: str, filename: str) -> int | None:
    """The segment number in ``filename`` if it names a segment file of queue ``name``, else None.

    The same test as ``segment_pattern(name).fullmatch(filename)``, without compiling a
    pattern per queue (opening thousands of queues at once would spend most of its time there).
    """
    prefix = name + ".diskqueue."
    if not (filename.startswith(prefix) and filename.endswith(".dat")):
        return None
    digits = filename[len(prefix):-4]
    return int(digits) if len(digits) >= 6 and digits.isdecimal() else None


def segment_pattern(name: str) -> re.Pattern[str]:
    """A pattern matching exactly the segment file names of queue ``name``; group 1 is the number."""
    return re.compile(re.escape(name) + r"\.diskqueue\.(\d{6,})\.dat")


class SegmentHeader(NamedTuple):
    """The decoded fixed header at the start of every segment."""

    number: int
    first_seq: int
    version: int = FORMAT_VERSION


def encode_header(number: int, first_seq: int) -> bytes:
    """The ``HEADER_SIZE`` bytes that start segment ``number``."""
    body = _HEADER.pack(SEGMENT_MAGIC, FORMAT_VERSION, HEADER_SIZE, number, 0, first_seq, 0)
    return body + _HEADER_CRC.pack(_crc32(body))


def decode_header(raw: bytes, number: int) -> tuple[SegmentHeader | None, str | None]:
    """Decode a segment header read from the file of segment ``number``.

    Returns ``(header, None)`` or ``(None, reason)`` when the bytes are not a valid header
    (short, wrong magic, bad checksum, wrong segment number). Raises ``FormatVersionError``
    for an intact header of a newer format version.
    """
    if len(raw) < HEADER_SIZE:
        return None, f"header is {len(raw)} bytes, expected {HEADER_SIZE}"
    body = raw[: _HEADER.size]
    (crc,) = _HEADER_CRC.unpack_from(raw, _HEADER.size)
    if _crc32(body) != crc:
        return None, "header checksum mismatch"
    magic, version, header_len, file_number, _, first_seq, _ = _HEADER.unpack(body)
    if magic != SEGMENT_MAGIC:
        return None, f"bad magic {magic!r}"
    if version != FORMAT_VERSION or header_len != HEADER_SIZE:
        raise FormatVersionError(
            f"segment {number:06d} has format version {version} (header {header_len} bytes); "
            f"this code reads version {FORMAT_VERSION}"
        )
    if file_number != number:
        return None, f"header names segment {file_number}, file name says {number}"
    return SegmentHeader(number, first_seq, version), None


def frame_records(payloads: list[bytes], lengths: list[int]) -> list[bytes]:
    """The record frames of ``payloads`` (of ``lengths``) as a list of parts for ``b"".join``.

    Lengths and checksums go through C-level ``map`` loops: no per-record Python bytecode
    unless a payload is empty. Sizes must have been checked by the caller.
    """
    crcs = list(map(_record_crc, payloads))
    if not all(lengths):
        crcs = [crc if n else EMPTY_PAYLOAD_CRC for crc, n in zip(crcs, lengths)]
    parts: list[bytes] = [b""] * (2 * len(payloads))
    parts[0::2] = map(RECORD.pack, lengths, crcs)
    parts[1::2] = payloads
    return parts


def decode_records(
    buf: bytes, off: int, want: int, min_size: int, max_size: int
) -> tuple[list[bytes], int, str | None]:
    """Decode up to ``want`` complete, valid records from ``buf`` starting at ``off``.

    Returns ``(payloads, next_off, problem)``. ``problem`` is None when decoding stopped
    because ``want`` records were decoded or ``buf`` ends (at a record boundary or inside a
    record: see ``next_record_size``); otherwise it says why the record at ``next_off`` is
    invalid, and ``payloads`` holds the valid records before it.
    """
    # The hot loop of every read: per record one unpack, one slice, two appends. Bounds are
    # checked once afterwards (a length running past ``buf`` only shortens its slice, and
    # the next unpack then fails), sizes and checksums in C-level passes over the batch.
    start = off
    out: list[bytes] = []
    crcs: list[int] = []
    append = out.append
    append_crc = crcs.append
    unpack = RECORD.unpack_from
    length = 0
    try:
        for _ in repeat(None, want):
            length, crc = unpack(buf, off)
            begin = off + RECORD_HEADER_SIZE
            off = begin + length
            append(buf[begin:off])
            append_crc(crc)
    except struct.error:
        pass  # fewer than RECORD_HEADER_SIZE bytes left at ``off``
    if not out:
        return out, off, None
    span = len(buf) - start
    if off - start > span:  # the last record is not all in ``buf`` yet
        out.pop()
        crcs.pop()
        off -= RECORD_HEADER_SIZE + length
        if not out:
            return out, off, None
    if (
        not all(out)  # an empty payload is checked against EMPTY_PAYLOAD_CRC, one by one
        or (min_size and min(map(len, out)) < min_size)
        or (max_size < span and max(map(len, out)) > max_size)
        or list(map(_record_crc, out)) != crcs
    ):
        return _validate_each(out, crcs, start, off, min_size, max_size)
    return out, off, None


def _validate_each(
    out: list[bytes], crcs: list[int], off: int, end: int, min_size: int, max_size: int
) -> tuple[list[bytes], int, str | None]:
    """Check a decoded batch record by record and cut it at the first invalid one.

    The slow path: taken on corruption, and for batches holding empty payloads.
    """
    for i, payload in enumerate(out):
        size = len(payload)
        if size < min_size or size > max_size:
            return out[:i], off, f"record length {size} outside [{min_size}, {max_size}]"
        if (_record_crc(payload) if size else EMPTY_PAYLOAD_CRC) != crcs[i]:
            return out[:i], off, "record checksum mismatch"
        off += size + RECORD_HEADER_SIZE
    return out, end, None


def next_record_size(buf: bytes, off: int, max_size: int) -> tuple[int, str | None]:
    """How many bytes the record starting at ``buf[off]`` needs, header included.

    Returns ``(size, None)``, or ``(0, reason)`` when its length field is already known to
    be invalid. With fewer than a header's worth of bytes in ``buf`` the size is the header.
    """
    if len(buf) - off < RECORD_HEADER_SIZE:
        return RECORD_HEADER_SIZE, None
    length, _ = RECORD.unpack_from(buf, off)
    if length > max_size:
        return 0, f"record length {length} exceeds max {max_size}"
    return RECORD_HEADER_SIZE + length, None


def record_end(buf: bytes, off: int, min_size: int, max_size: int) -> int:
    """Where the record starting at ``buf[off]`` ends when it is complete and valid, else -1."""
    if off < 0 or len(buf) - off < RECORD_HEADER_SIZE:
        return -1
    length, crc = RECORD.unpack_from(buf, off)
    begin = off + RECORD_HEADER_SIZE
    end = begin + length
    if length < min_size or length > max_size or end > len(buf):
        return -1
    if (_record_crc(buf[begin:end]) if length else EMPTY_PAYLOAD_CRC) != crc:
        return -1
    return end


def find_record(buf: bytes, start: int, stop: int, min_size: int, max_size: int, at_end: bool) -> int:
    """The first offset in ``[start, stop)`` where reading can resume after damage, or -1.

    A record must start there whose length and checksum are valid, and the next record must
    be valid too, unless the first ends ``buf`` and ``at_end`` says ``buf`` ends where the
    segment does. Candidates are skipped in C where possible: while every valid length is
    below 2**24 a record starts with a zero byte, and eight zero bytes are never a header.
    """
    leading_zero = max_size < 1 << 24
    c = start
    while c < stop:
        if leading_zero:
            c = buf.find(b"\0", c, stop)
            if c < 0:
                return -1
        if buf[c : c + RECORD_HEADER_SIZE] == _ZERO_HEADER:
            match = _NONZERO.search(buf, c, stop + RECORD_HEADER_SIZE - 1)
            if match is None:
                return -1
            c = max(c + 1, match.start() - RECORD_HEADER_SIZE + 1)
            continue
        end = record_end(buf, c, min_size, max_size)
        if end >= 0 and ((at_end and end == len(buf)) or record_end(buf, end, min_size, max_size) >= 0):
            return c
        c += 1
    return -1
