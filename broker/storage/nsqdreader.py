"""How nsqd 1.3.0 reads one of its disk queues at start-up, replayed: what it delivers, what it keeps.

nsqd's disk queue is go-diskqueue v1.1.0 (``diskqueue.go``). Its files::

    <name>.diskqueue.NNNNNN.dat   records: [length i32 big-endian][nsqd's message layout]
    <name>.diskqueue.meta.dat     text "<depth>\\n<readFileNum>,<readPos>\\n<writeFileNum>,<writePos>\\n"

``NNNNNN`` is Go's ``%06d`` of the file number (``-00001`` for -1). The import delivers
exactly what nsqd would, so it follows nsqd's code rather than its intent:

* ``retrieveMetaData`` reads the checkpoint with ``fmt.Fscanf(f, "%d\\n%d,%d\\n%d,%d\\n",
  &depth, &readFileNum, &readPos, &writeFileNum, &writePos)``: numbers may carry a sign,
  spaces may stand before them and before a newline. A number that does not scan (or
  overflows int64) stops the scan: the cursor fields scanned before it keep their values,
  the others stay 0, and the write file is not checked. When the whole text scans, a write
  file longer than ``writePos`` (or a negative ``writePos``) moves writing to the next file
  number, so the reader reads the old write file to its end.
* ``ioLoop`` reads while ``readFileNum < writeFileNum || readPos < writePos``. ``readOne``
  opens ``readFileNum`` (a missing file is a read error), seeks to ``readPos`` only when it
  is positive, and counts positions from ``readPos`` even when it is negative. A file
  before the write file is finished once the count reaches its size (it is then removed);
  from the write file on, reading stops once the count reaches ``writePos``.
* A length outside ``[minMsgSize, maxMsgSize]``, a record or length cut short by the end
  of the file, or any read error (a directory: ``EISDIR``) ends the file: ``handleReadError``
  renames it ``.bad`` and goes on with the next file number (when it was the write file,
  writing moves on too, which ends the reading).

A read cursor behind a run of missing files walks through them one number at a time; the
replay skips to the next file that exists, which changes nothing but the time. A read
file number past the write file with ``readPos < writePos`` makes nsqd look for one
missing file after another for ever: the replay stops there. Files the replay does not
read to their end are *unread*: nsqd keeps them (or would overwrite them later) and
never delivers them; the import keeps them too.

Deviations, each on the side of keeping data: nsqd removes a file it skips with
``skipToNextRWFile`` even when it was not read to the end, and the import keeps it; a
FIFO or device file is a read error here (nsqd would block on a FIFO); and records whose
first byte marks them as pynsqd's prefixed records (a negative timestamp, which no
message nsqd writes has) are skipped with a warning, as pynsqd's queues could not tell
them from its own.
"""

from __future__ import annotations

import bisect
import logging
import os
import re
import stat
from collections.abc import Generator, Iterator
from typing import NamedTuple

from diskqueue import fileops

__all__ = ["META_READ_MAX", "MetaScan", "NsqdQueueRead", "looks_like_nsqd_meta", "nsqd_number", "scan_nsqd_meta"]

log = logging.getLogger("pynsqd.import")

_INT64 = 1 << 63
#: The most of a checkpoint read: five numbers and separators fit many times over, and a
#: number longer than this overflows int64 whatever follows.
META_READ_MAX = 4096
#: Go's unicode.IsSpace as fmt's scanner sees it (fmt/scan.go's ``space`` table).
_GO_SPACE = frozenset("\t\n\v\f\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | frozenset(
    chr(c) for c in range(0x2000, 0x200B))
_DIGITS = frozenset("0123456789")
#: What a checkpoint of nsqd's can start with; pynsqd's (msgpack) starts with a map's byte.
_NSQD_META_START = frozenset(b"+-0123456789 \t\r\n\v\f")
_NUMBER = re.compile(r"-?\d+")
_LENGTH_SIZE = 4
#: A plain record's first byte is below this (its timestamp is not negative); pynsqd's
#: prefixed records start with 0xFE or 0xFF.
_PREFIX_MARK = 0xFE
#: Bytes read from a segment per system call (a whole small segment in one).
_READ_CHUNK = 1 << 20


class MetaScan(NamedTuple):
    """nsqd's checkpoint as ``Fscanf`` leaves the queue's fields: ``depth`` only when the
    whole text scanned (``error`` None), the cursor fields as far as they scanned."""

    depth: int
    read_file: int
    read_pos: int
    write_file: int
    write_pos: int
    error: str | None


def nsqd_number(text: str) -> int | None:
    """The file number in ``text`` when it is exactly Go's ``%06d`` of it, else None."""
    if _NUMBER.fullmatch(text) is None:
        return None
    number = int(text)
    return number if f"{number:06d}" == text else None


def looks_like_nsqd_meta(head: bytes) -> bool:
    """Whether a checkpoint starting with ``head`` is nsqd's text (pynsqd's starts with a msgpack map)."""
    return bool(head) and head[0] in _NSQD_META_START


class _GoScanError(Exception):
    pass


class _Scanner:
    """The part of Go's ``fmt`` scanner that ``Fscanf(f, "%d\\n%d,%d\\n%d,%d\\n", ...)`` runs."""

    def __init__(self, text: str):
        self.text = text
        self.pos = 0

    def _rune(self) -> str:
        if self.pos >= len(self.text):
            return ""
        self.pos += 1
        return self.text[self.pos - 1]

    def skip_space(self) -> None:
        while True:
            r = self._rune()
            if not r:
                return
            if r == "\r" and self.text.startswith("\n", self.pos):
                continue
            if r == "\n":
                raise _GoScanError("unexpected newline")
            if r not in _GO_SPACE:
                self.pos -= 1
                return

    def integer(self) -> int:
        self.skip_space()
        if self.pos >= len(self.text):
            raise _GoScanError("unexpected EOF")
        start = self.pos
        if self.text[self.pos] in "+-":
            self.pos += 1
        digits = self.pos
        while self.pos < len(self.text) and self.text[self.pos] in _DIGITS:
            self.pos += 1
        if self.pos == digits:
            raise _GoScanError("expected integer")
        token = self.text[start:self.pos]
        value = int(token)
        if not -_INT64 <= value < _INT64:
            raise _GoScanError(f'strconv.ParseInt: parsing "{token}": value out of range')
        return value

    def newline(self) -> None:
        r = self._rune()
        while r and r in _GO_SPACE and r != "\n":
            r = self._rune()
        if r and r != "\n":
            raise _GoScanError("newline in format does not match input")

    def literal(self, char: str) -> None:
        r = self._rune()
        if not r:
            raise _GoScanError("unexpected EOF")
        if r != char:
            raise _GoScanError("input does not match format")


def scan_nsqd_meta(data: bytes) -> MetaScan:
    """nsqd's checkpoint ``data`` as ``retrieveMetaData``'s ``Fscanf`` reads it (see the module docstring)."""
    scanner = _Scanner(data[:META_READ_MAX].decode("utf-8", "replace"))
    fields = [0, 0, 0, 0, 0]
    steps = (0, "\n", 1, ",", 2, "\n", 3, ",", 4, "\n")
    try:
        for step in steps:
            if step == "\n":
                scanner.newline()
            elif step == ",":
                scanner.literal(",")
            else:
                assert isinstance(step, int)
                fields[step] = scanner.integer()
    except _GoScanError as exc:
        return MetaScan(0, fields[1], fields[2], fields[3], fields[4], str(exc))
    return MetaScan(fields[0], fields[1], fields[2], fields[3], fields[4], None)


class _Segment:
    """One file of the queue as the replay found it."""

    __slots__ = ("path", "info", "opened", "read_to")

    def __init__(self, path: str):
        self.path = path
        self.info: os.stat_result | OSError | None = None  # what stat said, once asked
        self.opened = False
        self.read_to = 0  # the offset reading got to

    def stat(self) -> os.stat_result:
        """The file's status (looked up once); raises the ``OSError`` stat raised."""
        if self.info is None:
            try:
                self.info = fileops.stat(self.path)
            except OSError as exc:
                self.info = exc
        if isinstance(self.info, OSError):
            raise self.info
        return self.info

    @property
    def size(self) -> int:
        """The size stat gives (0 when it fails)."""
        try:
            return self.stat().st_size
        except OSError:
            return 0


class NsqdQueueRead:
    """The replay of nsqd reading the queue ``name`` from its files (see the module docstring).

    ``files`` maps each file number to the file's path now (nsqd's file, under whatever name
    the import gave it); ``meta`` is the checkpoint's text (None when it cannot be read:
    nsqd then reads with every field 0). :meth:`records` yields the payloads nsqd delivers,
    in order; afterwards :attr:`bad` holds the files nsqd renames ``.bad`` (number: what was
    wrong), :attr:`consumed` the files read to their end, and :meth:`unread` the rest with
    why. Reads files only; changes nothing. The replay is the same for the same files, so
    a run interrupted and started again reads the same records.
    """

    __slots__ = ("name", "scan", "cursor", "min_size", "max_size", "bad", "consumed", "missing",
                 "endless", "skipped", "_segments")

    def __init__(self, name: str, files: dict[int, str], meta: bytes | None, min_size: int, max_size: int):
        self.name = name
        self.scan = scan_nsqd_meta(meta) if meta is not None else MetaScan(0, 0, 0, 0, 0, "its checkpoint is unreadable")
        self.min_size = min_size
        self.max_size = max_size
        self.bad: dict[int, str] = {}
        self.consumed: set[int] = set()
        self.missing: list[tuple[int, int]] = []  # runs of file numbers nsqd opens and does not find
        self.endless = False  # nsqd would look for missing files for ever
        self.skipped = 0  # records with a negative timestamp
        self._segments = {number: _Segment(path) for number, path in files.items()}
        self.cursor = self._retrieve()

    @property
    def total_bytes(self) -> int:
        """The size of the queue's regular files (0 for the others)."""
        total = 0
        for segment in self._segments.values():
            try:
                info = segment.stat()
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                total += info.st_size
        return total

    def _retrieve(self) -> tuple[int, int, int, int]:
        s = self.scan
        read_file, read_pos, write_file, write_pos = s.read_file, s.read_pos, s.write_file, s.write_pos
        if s.error is None:
            segment = self._segments.get(write_file)
            try:
                size = segment.stat().st_size if segment is not None else None
            except OSError:
                size = None
            if size is not None and write_pos < size:
                write_file, write_pos = write_file + 1, 0
        return read_file, read_pos, write_file, write_pos

    def file_name(self, number: int) -> str:
        """nsqd's name of file ``number`` of the queue."""
        return f"{self.name}.diskqueue.{number:06d}.dat"

    def describe_cursor(self) -> str:
        """The checkpoint's cursor as nsqd reads it, for log lines."""
        s = self.scan
        return f"read {s.read_file},{s.read_pos}, write {s.write_file},{s.write_pos}"

    def records(self, max_bytes: int = _READ_CHUNK) -> Generator[list[bytes], None, None]:
        """The payloads nsqd delivers, in order, in lists of about ``max_bytes``."""
        read_file, read_pos, write_file, write_pos = self.cursor
        numbers = sorted(self._segments)
        batch: list[bytes] = []
        batch_bytes = 0
        while read_file < write_file or read_pos < write_pos:
            segment = self._segments.get(read_file)
            if segment is None:  # readOne cannot open it: handleReadError moves on to the next number
                if read_file == write_file:
                    self._missing(read_file, read_file)
                    write_file, write_pos = write_file + 1, 0  # which ends the reading
                    read_file, read_pos = read_file + 1, 0
                    continue
                at = bisect.bisect_right(numbers, read_file)
                found = numbers[at] if at < len(numbers) else None
                if read_file < write_file:  # every missing number up to the next file is passed alike
                    following = write_file if found is None else min(found, write_file)
                    self._missing(read_file, following - 1)
                    read_file, read_pos = following, 0
                    continue
                self._missing(read_file, read_file)
                read_file, read_pos = read_file + 1, 0
                if read_pos >= write_pos:
                    continue  # skipToNextRWFile: the reading ends
                if found is None:
                    self.endless = True  # nsqd would look for the next missing file for ever
                    break
                self._missing(read_file, found - 1)
                read_file = found
                continue
            finished = read_file < write_file  # read to its size, then removed; else read up to writePos
            count = read_pos
            problem = None
            segment.opened = True
            try:
                for record in self._file_records(read_file, segment, read_pos):
                    count += _LENGTH_SIZE + len(record)
                    if record[0] >= _PREFIX_MARK:
                        self.skipped += 1
                        log.warning("nsqd import: queue %s: %s offset %d: skipping a message with a negative "
                                    "timestamp", self.name, self.file_name(read_file),
                                    segment.read_to - _LENGTH_SIZE - len(record))
                    else:
                        batch.append(record)
                        batch_bytes += len(record)
                        if batch_bytes >= max_bytes:
                            yield batch
                            batch, batch_bytes = [], 0
                    if count >= (segment.size if finished else write_pos):
                        break
                else:  # nsqd's reader wanted another record here: binary.Read's EOF
                    problem = f"end of file at offset {segment.read_to}, where nsqd's reader expects another record"
            except _ReadError as exc:
                problem = str(exc)
            if problem is not None:
                self.bad[read_file] = problem
                if read_file == write_file:
                    write_file, write_pos = write_file + 1, 0
                read_file, read_pos = read_file + 1, 0
                continue
            if segment.read_to >= segment.size:
                self.consumed.add(read_file)
            if not finished:
                break  # the count reached writePos (or passed it: skipToNextRWFile): the reading ends
            read_file, read_pos = read_file + 1, 0
        if batch:
            yield batch

    def _missing(self, first: int, last: int) -> None:
        if last < first:
            return
        if self.missing and self.missing[-1][1] == first - 1:
            first = self.missing.pop()[0]
        self.missing.append((first, last))

    def _file_records(self, number: int, segment: _Segment, read_pos: int) -> Iterator[bytes]:
        """The records of one file from ``read_pos`` (nsqd seeks only to a positive one) for as
        long as the caller asks; returns at the end of the file, raises :class:`_ReadError` at
        damage or a read error."""
        name = self.file_name(number)
        try:
            info = segment.stat()
        except OSError as exc:
            raise _ReadError(f"open {name}: {_reason(exc)}") from None
        if stat.S_ISDIR(info.st_mode):
            raise _ReadError(f"read {name}: is a directory")
        if not stat.S_ISREG(info.st_mode):
            raise _ReadError(f"{name} is not a regular file")
        try:
            fd = fileops.open(segment.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise _ReadError(f"open {name}: {_reason(exc)}") from None
        try:
            pos = segment.read_to = max(read_pos, 0)
            buf, at = b"", 0  # buf[at:] is the file from pos on, as far as read
            while True:
                if len(buf) - at < _LENGTH_SIZE:
                    buf, at = buf[at:] + _read_at(fd, _READ_CHUNK, pos + len(buf) - at), 0
                    if not buf:
                        return
                    if len(buf) < _LENGTH_SIZE:
                        raise _ReadError(f"record length cut short by the end of the file at offset {pos}")
                length = int.from_bytes(buf[at:at + _LENGTH_SIZE], "big", signed=True)
                if length < self.min_size or length > self.max_size:
                    raise _ReadError(f"invalid message read size ({length}) at offset {pos}")
                end = at + _LENGTH_SIZE + length
                if len(buf) < end:
                    buf = buf[at:] + _read_at(fd, max(_READ_CHUNK, end - len(buf)), pos + len(buf) - at)
                    end -= at
                    at = 0
                    if len(buf) < end:
                        raise _ReadError(f"record of {length} bytes at offset {pos} cut short by the end of the file")
                record = buf[at + _LENGTH_SIZE:end]
                at = end
                pos = segment.read_to = pos + _LENGTH_SIZE + length
                yield record
        except OSError as exc:
            raise _ReadError(f"read error at offset {segment.read_to}: {_reason(exc)}") from None
        finally:
            fileops.close(fd)

    def unread(self) -> dict[int, str]:
        """The files nsqd would keep without delivering (all or part of) them, with why."""
        found = {}
        for number in sorted(self._segments):
            if number in self.bad or number in self.consumed:
                continue
            segment = self._segments[number]
            if segment.opened:
                found[number] = (f"nsqd stops reading it at offset {segment.read_to} of {segment.size}, "
                                 "where its checkpoint's write position is")
            else:
                found[number] = f"nsqd's checkpoint ({self.describe_cursor()}) never leads its reader to it"
        return found


class _ReadError(Exception):
    """What ends the reading of one file early (nsqd's readOne error)."""


def _reason(exc: OSError) -> str:
    return (exc.strerror or str(exc)).lower()


def _read_at(fd: int, size: int, offset: int) -> bytes:
    """Up to ``size`` bytes of the file at ``offset``: fewer only at its end."""
    data = fileops.pread(fd, size, offset)
    while 0 < len(data) < size:
        more = fileops.pread(fd, size - len(data), offset + len(data))
        if not more:
            break
        data += more
    return data
