"""The read end of the queue: large positioned reads into a buffer, records sliced out of it."""

from __future__ import annotations

import os

from . import fileops
from .format import decode_records, next_record_size

__all__ = ["READ_CHUNK", "SegmentReader"]

READ_CHUNK = 1 << 20


class SegmentReader:
    """Reads records from one segment file through a read-ahead buffer.

    One ``pread`` fills the buffer with up to ``READ_CHUNK`` bytes (more for a record that
    needs it), never past the caller's ``limit``, so the buffer holds only bytes the writer
    has finished. Records are decoded from it with ``struct.unpack_from`` and slicing; their
    checksums are verified per batch. Owns its descriptor; ``close()`` releases it.
    """

    __slots__ = ("number", "fd", "size", "_buf", "_buf_start")

    def __init__(self, path: str, number: int) -> None:
        self.number = number
        self.fd = fileops.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self.size = fileops.fstat(self.fd).st_size
        self._buf = b""
        self._buf_start = 0

    def read(
        self, pos: int, want: int, limit: int, min_size: int, max_size: int
    ) -> tuple[list[bytes], int, str | None]:
        """Up to ``want`` records starting at byte ``pos``, not reading past ``limit``.

        Returns ``(payloads, next_pos, problem)``; ``problem`` names why the record at
        ``next_pos`` is invalid (the payloads before it are valid), else None.
        """
        out: list[bytes] = []
        while want > 0 and pos < limit:
            buf = self._buf
            rel = pos - self._buf_start
            if 0 <= rel < len(buf):
                got, rel, problem = decode_records(buf, rel, want, min_size, max_size)
                if got:
                    if out:
                        out.extend(got)
                    else:
                        out = got
                    want -= len(got)
                    pos = self._buf_start + rel
                if problem is not None:
                    return out, pos, problem
                if want == 0 or pos >= limit:
                    break
            else:
                rel = len(buf)
            need, problem = next_record_size(buf, rel, max_size)
            if problem is not None:
                return out, pos, problem
            size = min(limit - pos, max(READ_CHUNK, need))
            if size < need:
                return out, pos, "record extends past the end of the segment"
            buf = fileops.pread(self.fd, size, pos)
            if len(buf) < size:
                self._buf = b""
                return out, pos, f"segment ends at {pos + len(buf)}, before {pos + size}"
            self._buf = buf
            self._buf_start = pos
        return out, pos, None

    def close(self) -> None:
        """Release the descriptor and the buffer."""
        self._buf = b""
        fileops.close(self.fd)
