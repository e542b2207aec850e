"""Verifying a queue's data directory without changing it."""

from __future__ import annotations

import os
from dataclasses import dataclass

from . import fileops
from .checkpoint import TEMP_SUFFIX, load_checkpoint
from .format import meta_filename, segment_filename
from .listing import DirectoryListing
from .recovery import recover

__all__ = ["CheckReport", "check", "queue_names"]


@dataclass(frozen=True, slots=True)
class CheckReport:
    """What ``check()`` found.

    ``records`` is how many valid records lie from the committed cursor to the end: what
    opening the queue now would deliver. ``ok`` is False when any record was found damaged
    or missing, or the checkpoint does not match the files; an interrupted write at the
    very end (which opening cuts off) is only a note. ``corrupt`` lists ``(segment,
    offset)`` where damage starts; ``records_lost`` is exact unless ``lost_unknown``.
    """

    data_path: str
    name: str
    ok: bool
    checkpoint: str
    checkpoint_depth: int | None
    records: int
    segments: tuple[int, ...]
    segment_bytes: int
    records_lost: int
    lost_unknown: bool
    corrupt: tuple[tuple[int, int], ...]
    problems: tuple[str, ...]
    notes: tuple[str, ...]
    bad_files: tuple[str, ...]
    stray_files: tuple[str, ...]

    def format(self) -> str:
        """A human-readable multi-line summary."""
        lines = [
            f"queue {self.name!r} in {self.data_path}: {'OK' if self.ok else 'PROBLEMS FOUND'}",
            f"  checkpoint: {self.checkpoint}"
            + (f" (depth {self.checkpoint_depth})" if self.checkpoint_depth is not None else ""),
            f"  segments: {len(self.segments)} ({self.segment_bytes} bytes)"
            + (f", {self.segments[0]:06d}..{self.segments[-1]:06d}" if self.segments else ""),
            f"  readable records from the committed cursor: {self.records}",
        ]
        if self.records_lost or self.lost_unknown:
            lines.append(f"  records lost: {self.records_lost}{' or more' if self.lost_unknown else ''}")
        lines += [f"  problem: {p}" for p in self.problems]
        lines += [f"  note: {n}" for n in self.notes]
        lines += [f"  set-aside file: {f}" for f in self.bad_files]
        lines += [f"  leftover file: {f}" for f in self.stray_files]
        return "\n".join(lines)


def check(data_path: str | os.PathLike[str], name: str, *, min_msg_size: int = 0,
          max_msg_size: int = 1048576 + 26, listing: DirectoryListing | None = None) -> CheckReport:
    """Verify every segment header and every record of queue ``name`` from its committed
    cursor on, and compare with the checkpoint. Read-only; blocks (call it through
    ``trio.to_thread.run_sync`` from async code). ``listing``, a listing of ``data_path``
    shared by the checks of many queues, saves listing the directory for each. Raises
    ``FormatVersionError`` for files of a newer format, ``OSError`` when the directory
    cannot be read and ``ValueError`` for a listing of another directory."""
    path = os.fspath(data_path)
    listed = None
    if listing is not None:
        if listing.data_path != path:
            raise ValueError(f"the listing is of {listing.data_path!r}, not of {path!r}")
        listed = listing.take(name)
    entries = sorted(fileops.listdir(path) if listed is None else listed)
    checkpoint, _ = load_checkpoint(os.path.join(path, meta_filename(name)))
    found = recover(path, name, min_msg_size, max_msg_size, repair=False, verify_all=True, entries=listed)
    prefix = f"{name}.diskqueue."
    bad_files = tuple(e for e in entries if e.startswith(prefix) and e.endswith(".bad"))
    stray = tuple(e for e in entries if e == meta_filename(name) + TEMP_SUFFIX)
    sizes = 0
    size_of: dict[int, int] = {}
    for number in found.segments:
        try:
            size_of[number] = fileops.getsize(os.path.join(path, segment_filename(name, number)))
        except OSError:
            continue
        sizes += size_of[number]
    # where damage starts: each span read past, and where reading of a segment stops early
    corrupt = {(number, at) for number, at, _ in found.damaged}
    corrupt |= {(number, end) for number, end in found.bad.items() if end < size_of.get(number, end + 1)}
    ok = not found.problems and not found.lost and not found.lost_unknown
    return CheckReport(
        data_path=path,
        name=name,
        ok=ok,
        checkpoint=found.checkpoint_state,
        checkpoint_depth=checkpoint.depth if checkpoint is not None else None,
        records=found.depth,
        segments=tuple(found.segments),
        segment_bytes=sizes,
        records_lost=found.lost,
        lost_unknown=found.lost_unknown,
        corrupt=tuple(sorted(corrupt)),
        problems=tuple(found.problems),
        notes=tuple(found.notes),
        bad_files=bad_files,
        stray_files=stray,
    )


def queue_names(data_path: str | os.PathLike[str]) -> list[str]:
    """Names of the queues that have segment or checkpoint files in ``data_path``, sorted."""
    return DirectoryListing(data_path).names()
