"""nsqd 1.3.0's data directory, written by hand: ``nsqd.dat`` and go-diskqueue v1.1.0's files.

Segments of ``[length u32 BE][timestamp i64][attempts u16][16-byte id][body]`` and the text
checkpoint ``<depth>\\n<readFileNum>,<readPos>\\n<writeFileNum>,<writePos>\\n``, as nsqd writes
them (``tests/system/test_nsqd_import.py`` has real nsqd read the same files).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

__all__ = ["nsqd_payload", "segment_bytes", "write_nsqd_metadata", "write_nsqd_queue"]

_HEADER = struct.Struct(">qH")


def nsqd_payload(i: int, tag: str) -> bytes:
    """Message ``i`` of a queue: its own id, timestamp, attempts and body (``<tag>-<i>``)."""
    return _HEADER.pack(1_700_000_000_000_000_000 + i * 1000, i % 5) + b"%016x" % (0xA000 + i) + b"%s-%d" % (
        tag.encode(), i)


def segment_bytes(payloads: list[bytes]) -> bytes:
    """A segment file holding ``payloads``, each after its length."""
    return b"".join(len(p).to_bytes(4, "big") + p for p in payloads)


def write_nsqd_queue(path: Path, name: str, segments: list[list[bytes]], read: tuple[int, int] = (0, 0),
                     tails: dict[int, bytes] | None = None, meta: str | None = None) -> None:
    """nsqd's files of queue ``name``: one segment per list of payloads (``tails`` appends raw
    bytes to a segment), the checkpoint's write cursor at the end of the last one (or the
    checkpoint's text ``meta``)."""
    for number, payloads in enumerate(segments):
        data = segment_bytes(payloads) + (tails or {}).get(number, b"")
        (path / f"{name}.diskqueue.{number:06d}.dat").write_bytes(data)
    if meta is None:
        last = len(segments) - 1
        write_pos = (path / f"{name}.diskqueue.{last:06d}.dat").stat().st_size
        depth = sum(map(len, segments))
        meta = f"{depth}\n{read[0]},{read[1]}\n{last},{write_pos}\n"
    (path / f"{name}.diskqueue.meta.dat").write_text(meta)


def write_nsqd_metadata(path: Path, topics: dict[str, list[str]]) -> None:
    """``nsqd.dat`` naming ``topics`` with their channels, as nsqd 1.3.0 writes it."""
    entries = [{"channels": [{"name": c, "paused": False} for c in channels], "name": topic, "paused": False}
               for topic, channels in topics.items()]
    (path / "nsqd.dat").write_text(json.dumps({"topics": entries, "version": "1.3.0"}))
