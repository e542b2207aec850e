"""A batch of records framed once, to be appended to any number of queues.

A broker that gives the same messages to several queues (a topic spilling into
each of its channels' queues) pays for the framing (lengths, checksums, one
joined buffer) once per batch instead of once per queue: each queue then costs
one ``pwrite`` of the same bytes. A batch that does not fit in what is left of a
segment is split there; only that queue frames its parts again.
"""

from __future__ import annotations

from .format import RECORD_HEADER_SIZE, frame_records

__all__ = ["RecordBatch"]


class RecordBatch:
    """Payloads with their lengths, framed and joined on first use (``parts``, ``joined``).

    Immutable once built: the same batch may be appended to many queues.
    """

    __slots__ = ("payloads", "lengths", "shortest", "longest", "size", "_parts", "_joined")

    def __init__(self, payloads: list[bytes]) -> None:
        self.payloads = payloads
        self.lengths = list(map(len, payloads))
        self.shortest = min(self.lengths, default=0)
        self.longest = max(self.lengths, default=0)
        #: bytes the batch takes in a segment, record headers included
        self.size = sum(self.lengths) + RECORD_HEADER_SIZE * len(payloads)
        self._parts: list[bytes] | None = None
        self._joined: bytes | None = None

    def __len__(self) -> int:
        return len(self.payloads)

    @property
    def parts(self) -> list[bytes]:
        """The record frames as a list of parts (header, payload, header, ...)."""
        if self._parts is None:
            self._parts = frame_records(self.payloads, self.lengths)
        return self._parts

    def joined(self) -> bytes:
        """Every record frame in one buffer, as one write appends it."""
        if self._joined is None:
            self._joined = b"".join(self.parts)
        return self._joined
