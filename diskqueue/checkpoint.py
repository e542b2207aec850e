"""The checkpoint: where reading resumes and where writing continues after a restart.

File ``<name>.diskqueue.meta.dat``, msgpack::

    {"crc": u32, "body": bin}          crc = zlib CRC-32 of body
    body = {
      "version":   1,
      "commit":    [segment, offset, seq],   the committed cursor (ack floor): reading resumes here
      "write":     [segment, offset, seq],   end of the data known durable when this was written
      "depth":     int,                      readable records from "commit" to "write"
      "bad":       [[segment, end], ...],    corrupt segments at or after "commit": reading
                                             stops at "end" and skips to the next segment
      "accounted": [segment, ...],           segments whose skip loss is already out of "depth"
      "note":      bin,                      the owner's note (``DiskQueue.note``), optional
    }

``seq`` counts records ever written to the queue, so ``write.seq - commit.seq`` bounds the
depth, and segment headers carry the ``seq`` of their first record. The file is replaced
atomically: write a temporary file, fsync it, rename it over the old one, fsync the
directory. It is a hint, not the source of truth: records found complete and checksum-valid
after ``write`` on open are kept, and a checkpoint that does not match the files is ignored
in favour of counting the records on disk.
"""

from __future__ import annotations

import os
import zlib
from typing import NamedTuple

import msgpack

from . import fileops
from .errors import FormatVersionError, describe_os_error

__all__ = [
    "CHECKPOINT_VERSION",
    "Checkpoint",
    "Cursor",
    "FILE_MODE",
    "decode_checkpoint",
    "encode_checkpoint",
    "fsync_path",
    "load_checkpoint",
    "replace_durably",
    "write_temporary",
]

CHECKPOINT_VERSION = 1
TEMP_SUFFIX = ".tmp"
#: Every file a queue writes (segments, checkpoints) and the metadata file: readable by their
#: owner only, as nsqd's (message bodies are nobody else's business).
FILE_MODE = 0o600


class Cursor(NamedTuple):
    """A position in the queue: segment number, byte offset in it, records written before it."""

    file: int
    pos: int
    seq: int


class Checkpoint(NamedTuple):
    """The decoded checkpoint (see the module docstring for the meaning of each field)."""

    commit: Cursor
    write: Cursor
    depth: int
    bad: tuple[tuple[int, int], ...] = ()
    accounted: tuple[int, ...] = ()
    note: bytes = b""


def encode_checkpoint(checkpoint: Checkpoint) -> bytes:
    """The file contents for ``checkpoint``."""
    c, w = checkpoint.commit, checkpoint.write
    body = msgpack.packb(
        {
            "version": CHECKPOINT_VERSION,
            "commit": [c.file, c.pos, c.seq],
            "write": [w.file, w.pos, w.seq],
            "depth": checkpoint.depth,
            "bad": [list(item) for item in checkpoint.bad],
            "accounted": list(checkpoint.accounted),
            "note": checkpoint.note,
        }
    )
    return msgpack.packb({"crc": zlib.crc32(body), "body": body})


def decode_checkpoint(data: bytes) -> Checkpoint:
    """Decode checkpoint file contents.

    Raises ``ValueError`` when the contents are not a valid checkpoint and
    ``FormatVersionError`` for an intact checkpoint of a newer version.
    """
    try:
        outer = msgpack.unpackb(data)
        body = outer["body"]
        if not isinstance(body, bytes) or zlib.crc32(body) != outer["crc"]:
            raise ValueError("checkpoint checksum mismatch")
        fields = msgpack.unpackb(body)
        version = fields["version"]
        if version != CHECKPOINT_VERSION:
            raise FormatVersionError(
                f"checkpoint has version {version}; this code reads version {CHECKPOINT_VERSION}"
            )
        commit = Cursor(*map(_natural, fields["commit"]))
        write = Cursor(*map(_natural, fields["write"]))
        depth = _natural(fields["depth"])
        bad = tuple((_natural(f), _natural(e)) for f, e in fields["bad"])
        accounted = tuple(map(_natural, fields["accounted"]))
        note = fields.get("note", b"")
        if not isinstance(note, bytes):
            raise ValueError(f"checkpoint note {note!r} is not bytes")
    except FormatVersionError:
        raise
    except ValueError:
        raise
    except Exception as exc:  # msgpack raises a zoo of types on garbage: all mean "not a checkpoint"
        raise ValueError(f"checkpoint is not readable: {exc!r}") from exc
    return Checkpoint(commit, write, depth, bad, accounted, note)


def _natural(value: object) -> int:
    if type(value) is not int or value < 0:
        raise ValueError(f"checkpoint field {value!r} is not a non-negative integer")
    return value


def load_checkpoint(path: str) -> tuple[Checkpoint | None, str | None]:
    """Read the checkpoint at ``path``: ``(checkpoint, None)``, ``(None, None)`` when there is
    none, or ``(None, reason)`` when the file exists but is not valid."""
    try:
        data = fileops.read_file(path)
    except FileNotFoundError:
        return None, None
    except OSError as exc:  # a directory in its place, a read error: as unusable as garbage
        return None, describe_os_error("read", path, exc)
    try:
        return decode_checkpoint(data), None
    except FormatVersionError:
        raise
    except ValueError as exc:
        return None, str(exc)


def write_temporary(path: str, data: bytes) -> str:
    """Write ``data`` to ``path + ".tmp"`` and fsync it; returns the temporary path."""
    tmp = path + TEMP_SUFFIX
    fd = fileops.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
    try:
        view = memoryview(data)
        while view:
            view = view[fileops.write(fd, view) :]
        fileops.fsync(fd)
    finally:
        fileops.close(fd)
    return tmp


def fsync_path(path: str) -> None:
    """fsync the file or directory at ``path``; for a directory, this makes the renames,
    creations and removals in it durable."""
    fd = fileops.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fileops.fsync(fd)
    finally:
        fileops.close(fd)


def replace_durably(path: str, data: bytes) -> None:
    """Replace the file at ``path`` (a checkpoint, the metadata file) atomically and durably
    (blocking: several fsyncs)."""
    fileops.replace(write_temporary(path, data), path)
    fsync_path(os.path.dirname(path) or ".")
