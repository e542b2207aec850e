"""Power cuts, simulated: a file layer that records every change a disk queue makes to a
directory, and the directories a power cut at any point of that record could leave.

:class:`Recorder` takes the place of ``diskqueue.fileops`` (the disk queue's one door to
the file system; the broker's ``nsqd.dat`` goes through it too). It performs every call on
the real directory, so the code under test runs as usual, and appends every change to one
list in the order the changes happened, whichever thread made them: ``open`` (with
creation or truncation), ``pwrite``/``write`` with their offsets and bytes (``fallocate``
past the end of a file as a write of zero bytes), ``ftruncate``,
``fsync``/``fdatasync`` of a file or of the directory, ``rename``/``replace`` and
``unlink``. A test adds its own events (``mark``: "these messages were acknowledged") to the
same list, so a point in the list says both what had reached the files and what had been
promised. ``fsync`` calls are recorded, not made: what is stable is what the model says.
Reads go to the real calls unrecorded.

:class:`Disk` replays a prefix of the record and answers what a power cut right there may
leave (:meth:`Disk.power_cut`). The model:

* A file's data and size reach stable storage only through ``fsync`` or ``fdatasync`` of
  it. Each write since the file's last fsync is, independently, kept, dropped, kept as a
  prefix (torn at any byte), kept in 512-byte sectors at random (torn inside), or
  *zero-filled*: the file's size grew to cover it but its data never landed (reads as
  zero bytes). An ``ftruncate`` since the last fsync is kept or dropped. What stays is
  applied in the order it was written.
* A name (a file created, a rename or replace, an unlink) reaches stable storage only
  through an fsync of its directory; an fsync of the file does not make its name durable.
  Until then each change of a name is, independently, kept or not: the directory may show
  the old or the new name (a replaced name shows the old or the new file, never none).
* Modes: ``"random"`` draws every choice; ``"kept"`` keeps everything (the state a killed
  process leaves: every write reached the page cache); ``"lost"`` keeps nothing that was
  not fsynced.
* After a power cut everything on disk is stable (a new ``Disk`` of the cut's files). After
  a kill nothing changed: the next process's record continues the same model
  (:meth:`Disk.killed`), so a power cut during that restart may still lose what the killed
  process never fsynced.

The record of a run is kept whole, so one run yields as many crash points as wanted, and
the reconstructed directories are plain directories: a failing one can be kept and
replayed.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Callable
from copy import deepcopy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.file_layer import FileLayer

__all__ = ["BROKER_FLAGS", "Disk", "Op", "Recorder", "check_model", "crash_points", "first_seed", "write_directory"]

#: The name the directory itself is recorded under (files are recorded by their name in it).
DIRECTORY = "."
SECTOR = 512
_WRITING = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


@dataclass(frozen=True, slots=True)
class Op:
    """One recorded change, or a test's ``mark`` (``event``)."""

    kind: str  # open, close, write, truncate, sync, rename, unlink, mark
    fd: int = -1
    name: str = ""  # the file's name in the directory when the call was made
    target: str = ""  # rename: the new name
    offset: int = 0  # write: where; truncate: the new size
    data: bytes = b""
    flags: int = 0  # open: the flags
    event: Any = None  # mark: what the test recorded

    def __str__(self) -> str:
        if self.kind == "open":
            how = "create" if self.flags & os.O_CREAT else "open"
            if self.flags & os.O_TRUNC:
                how += "+trunc"
            return f"{how} {self.name} -> fd {self.fd}"
        if self.kind == "write":
            return f"write {self.name} fd {self.fd} [{self.offset}, {self.offset + len(self.data)})"
        if self.kind == "truncate":
            return f"truncate {self.name} fd {self.fd} to {self.offset}"
        if self.kind in ("sync", "close"):
            return f"{self.kind} {self.name} fd {self.fd}"
        if self.kind == "rename":
            return f"rename {self.name} -> {self.target}"
        if self.kind == "unlink":
            return f"unlink {self.name}"
        return f"mark {self.event!r}"


class Recorder(FileLayer):
    """The file layer of one directory, ``root``: real calls, every change recorded in ``ops``.

    Install it with :meth:`installed` around the code under test. Thread-safe: a change
    and its record are made under one lock, so ``ops`` is the order in which the changes
    really happened. Writes outside ``root``, or to a subdirectory, raise
    ``AssertionError``: they would escape the model.
    """

    def __init__(self, root: str | os.PathLike[str]):
        self.root = os.path.realpath(root)
        self.initial = {name: Path(self.root, name).read_bytes() for name in sorted(os.listdir(self.root))}
        self.ops: list[Op] = []
        self._lock = threading.Lock()
        self._names: dict[int, str] = {}  # open descriptor -> the name it was opened under

    def calls(self) -> dict[str, Callable[..., Any]]:
        """The replacements for ``diskqueue.fileops`` (reads go to the real calls)."""
        return {"open": self.open, "close": self.close, "pwrite": self.pwrite, "write": self.write,
                "fallocate": self.fallocate, "ftruncate": self.ftruncate, "fsync": self.fsync, "fdatasync": self.fsync,
                "rename": self.rename, "replace": self.rename, "unlink": self.unlink, "makedirs": self.makedirs}

    def mark(self, event: Any) -> None:
        """Record a test's event at this point of the record."""
        with self._lock:
            self.ops.append(Op("mark", event=event))

    def _name(self, path: str | os.PathLike[str]) -> str | None:
        """``path``'s name in the directory, DIRECTORY for the directory, None outside it."""
        full = os.path.abspath(os.fspath(path))
        if full == self.root:
            return DIRECTORY
        parent, name = os.path.split(full)
        return name if parent == self.root else None

    def _inside(self, path: str | os.PathLike[str]) -> str:
        name = self._name(path)
        if name is None or name == DIRECTORY:
            raise AssertionError(f"a change to {path} is outside the simulated directory {self.root}")
        return name

    # -- the calls ------------------------------------------------------------------------

    def open(self, path: str | os.PathLike[str], flags: int, mode: int = 0o777) -> int:
        name = self._name(path)
        if name is None:
            if flags & _WRITING:
                raise AssertionError(f"opening {path} for writing escapes the simulated directory {self.root}")
            return os.open(path, flags, mode)
        with self._lock:
            existed = name == DIRECTORY or os.path.exists(os.path.join(self.root, name))
            fd = os.open(path, flags, mode)
            self._names[fd] = name
            created = os.O_CREAT if flags & os.O_CREAT and not existed else 0
            self.ops.append(Op("open", fd=fd, name=name, flags=created | (flags & os.O_TRUNC)))
        return fd

    def close(self, fd: int) -> None:
        with self._lock:
            os.close(fd)
            name = self._names.pop(fd, None)
            if name is not None:
                self.ops.append(Op("close", fd=fd, name=name))

    def pwrite(self, fd: int, data: Any, offset: int) -> int:
        with self._lock:
            written = os.pwrite(fd, data, offset)
            self._written(fd, offset, data, written)
        return written

    def write(self, fd: int, data: Any) -> int:
        with self._lock:
            offset = os.lseek(fd, 0, os.SEEK_CUR)
            written = os.write(fd, data)
            self._written(fd, offset, data, written)
        return written

    def _written(self, fd: int, offset: int, data: Any, written: int) -> None:
        if written:
            self.ops.append(Op("write", fd=fd, name=self._names[fd], offset=offset, data=bytes(data[:written])))

    def fallocate(self, fd: int, offset: int, length: int) -> None:
        # recorded as what it does past the end of the file: a write of zero bytes
        with self._lock:
            size = os.fstat(fd).st_size
            os.posix_fallocate(fd, offset, length)
            if offset + length > size:
                self._written(fd, size, bytes(offset + length - size), offset + length - size)

    def ftruncate(self, fd: int, size: int) -> None:
        with self._lock:
            os.ftruncate(fd, size)
            self.ops.append(Op("truncate", fd=fd, name=self._names[fd], offset=size))

    def fsync(self, fd: int) -> None:
        with self._lock:
            name = self._names.get(fd)
            if name is None:
                raise AssertionError(f"fsync of descriptor {fd}, not opened in the simulated directory {self.root}")
            self.ops.append(Op("sync", fd=fd, name=name))

    def rename(self, src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        old, new = self._inside(src), self._inside(dst)
        with self._lock:
            os.replace(src, dst)
            self.ops.append(Op("rename", name=old, target=new))

    def unlink(self, path: str | os.PathLike[str]) -> None:
        name = self._inside(path)
        with self._lock:
            os.unlink(path)
            self.ops.append(Op("unlink", name=name))

    def makedirs(self, path: str | os.PathLike[str], exist_ok: bool = False) -> None:
        if not os.path.isdir(path):
            raise AssertionError(f"creating the directory {path} escapes the simulated directory {self.root}")
        os.makedirs(path, exist_ok=exist_ok)

    # -- views ----------------------------------------------------------------------------

    def is_directory(self, fd: int) -> bool:
        """Whether ``fd`` was opened on the simulated directory itself."""
        return self._names.get(fd) == DIRECTORY

    def marks(self) -> list[tuple[int, Any]]:
        """``(index in ops, event)`` of every mark, in order."""
        return [(i, op.event) for i, op in enumerate(self.ops) if op.kind == "mark"]

    def crash_points(self, count: int, rng: random.Random) -> list[int]:
        """``count`` crash points, ascending, each drawn from one of four kinds at random:
        anywhere; right after a mark ``("acked", ...)`` (the promise is as fresh as it gets);
        right after an fsync of the directory (a checkpoint or a new file just became
        durable, and what it depends on may not have); right after a file creation or a
        rename (before the fsync of the directory that makes it durable). A point ``k``
        means the first ``k`` operations happened."""
        acks = [i + 1 for i, event in self.marks() if event[0] == "acked"]
        installs = [i + 1 for i, op in enumerate(self.ops) if op.kind == "sync" and op.name == DIRECTORY]
        names = [i + 1 for i, op in enumerate(self.ops)
                 if op.kind == "rename" or (op.kind == "open" and op.flags & os.O_CREAT)]
        points = []
        for _ in range(count):
            near = rng.choice((None, acks, installs, names))
            points.append(rng.choice(near) if near else rng.randrange(len(self.ops) + 1))
        return sorted(points)

    def trace(self, end: int, last: int = 60) -> str:
        """The ``last`` records before ``end``, one a line, numbered: for a failure report."""
        start = max(0, end - last)
        return "\n".join(f"  {i:6d}  {self.ops[i]}" for i in range(start, end))


class _File:
    """An inode of the model: the content on stable storage, the changes since, the content now."""

    __slots__ = ("stable", "pending", "now")

    def __init__(self, content: bytes = b""):
        self.stable = content
        self.pending: list[tuple[str, int, bytes]] = []  # ("write", offset, data) | ("truncate", size, b"")
        self.now = bytearray(content)


def _resize(buf: bytearray, size: int) -> None:
    if size < len(buf):
        del buf[size:]
    else:
        buf.extend(bytes(size - len(buf)))


def _put(buf: bytearray, offset: int, data: bytes) -> None:
    if offset > len(buf):
        buf.extend(bytes(offset - len(buf)))
    buf[offset : offset + len(data)] = data


class Disk:
    """The model of the directory, replayed from a recorder's ``initial`` files and its ops.

    :meth:`advance` applies more of the record; :meth:`power_cut` draws one state the files
    could be in after a power cut at that point, without changing the model.
    """

    def __init__(self, initial: dict[str, bytes]):
        self.names: dict[str, _File] = {name: _File(data) for name, data in initial.items()}
        self.stable_names = dict(self.names)
        self.name_changes: list[tuple[str, str, str, _File]] = []  # (kind, name, target, file)
        self.fds: dict[int, _File | None] = {}  # None: the directory
        self.applied = 0

    def advance(self, ops: list[Op], end: int) -> None:
        """Apply ``ops[self.applied:end]``."""
        for op in ops[self.applied : end]:
            self._apply(op)
        self.applied = max(self.applied, end)

    def _apply(self, op: Op) -> None:
        kind = op.kind
        if kind == "open":
            if op.name == DIRECTORY:
                self.fds[op.fd] = None
                return
            file = self.names.get(op.name)
            # O_CREAT opens an existing file too (a temporary file a killed process left,
            # say); only O_EXCL must find none, and only a plain open must find one
            if (file is None and not op.flags & os.O_CREAT) or (file is not None and op.flags & os.O_EXCL):
                raise AssertionError(f"model out of step: {op} (the model {'lacks' if file is None else 'has'} it)")
            if file is None:
                file = self.names[op.name] = _File()
                self.name_changes.append(("link", op.name, "", file))
            elif op.flags & os.O_TRUNC:
                self._truncate(file, 0)
            self.fds[op.fd] = file
        elif kind == "close":
            del self.fds[op.fd]
        elif kind == "write":
            file = self._file(op)
            file.pending.append(("write", op.offset, op.data))
            _put(file.now, op.offset, op.data)
        elif kind == "truncate":
            self._truncate(self._file(op), op.offset)
        elif kind == "sync":
            target = self.fds[op.fd]
            if target is None:
                self.stable_names = dict(self.names)
                self.name_changes.clear()
            else:
                target.stable = bytes(target.now)
                target.pending.clear()
        elif kind == "rename":
            file = self.names.pop(op.name)
            self.names[op.target] = file
            self.name_changes.append(("rename", op.name, op.target, file))
        elif kind == "unlink":
            file = self.names.pop(op.name)
            self.name_changes.append(("unlink", op.name, "", file))

    def _file(self, op: Op) -> _File:
        file = self.fds[op.fd]
        assert file is not None, f"{op}: a write to the directory"
        return file

    @staticmethod
    def _truncate(file: _File, size: int) -> None:
        file.pending.append(("truncate", size, b""))
        _resize(file.now, size)

    def killed(self) -> Disk:
        """A copy of the model as a killed process leaves it, for a restart to go on from:
        its descriptors are gone, and nothing it wrote is more stable than it was (the page
        cache keeps it for the next process, a power cut may still lose it). Continue it
        with :meth:`advance` from 0 over the next process's record."""
        copy = deepcopy(self)
        copy.fds.clear()
        copy.applied = 0
        return copy

    def files_now(self) -> dict[str, bytes]:
        """What the directory holds now, as the running code sees it (nothing lost)."""
        return {name: bytes(file.now) for name, file in self.names.items()}

    def power_cut(self, rng: random.Random, mode: str = "random") -> tuple[dict[str, bytes], list[str]]:
        """One state a power cut now may leave: ``(files by name, the choices made)``.

        ``mode`` is ``"random"``, ``"kept"`` or ``"lost"`` (see the module docstring).
        """
        choices: list[str] = []
        if mode == "kept":
            return self.files_now(), ["everything kept"]
        names = dict(self.stable_names)
        for kind, name, target, file in self.name_changes:
            if mode == "lost" or rng.random() < 0.5:
                choices.append(f"lost {kind} {name}{' -> ' + target if target else ''}")
                continue
            if kind == "link":
                names[name] = file
            elif kind == "rename":
                if names.get(name) is file:
                    del names[name]
                names[target] = file
            elif names.get(name) is file:
                del names[name]
        contents: dict[int, bytes] = {}
        out = {}
        for name, file in sorted(names.items()):
            if id(file) not in contents:
                contents[id(file)] = self._cut(file, name, rng, mode, choices)
            out[name] = contents[id(file)]
        return out, choices

    @staticmethod
    def _cut(file: _File, name: str, rng: random.Random, mode: str, choices: list[str]) -> bytes:
        buf = bytearray(file.stable)
        for kind, offset, data in file.pending:
            if mode == "lost":
                continue
            roll = rng.random()
            if kind == "truncate":
                if roll < 0.5:
                    _resize(buf, offset)
                else:
                    choices.append(f"{name}: lost truncate to {offset}")
                continue
            end = offset + len(data)
            if roll < 0.4:
                _put(buf, offset, data)
            elif roll < 0.6:
                choices.append(f"{name}: lost write [{offset}, {end})")
            elif roll < 0.75:
                keep = rng.randrange(len(data))
                _put(buf, offset, data[:keep])
                choices.append(f"{name}: write [{offset}, {end}) torn after {keep} bytes")
            elif roll < 0.9:
                if end > len(buf):
                    _resize(buf, end)
                choices.append(f"{name}: write [{offset}, {end}) zero-filled")
            else:
                first = offset - offset % SECTOR
                lost = []
                for start in range(first, end, SECTOR):
                    lo, hi = max(start, offset), min(start + SECTOR, end)
                    if rng.random() < 0.5:
                        _put(buf, lo, data[lo - offset : hi - offset])
                    else:
                        lost.append(lo)  # reads as zeros if a later sector landed
                choices.append(f"{name}: write [{offset}, {end}) lost the sectors at {lost}")
        return bytes(buf)


#: A durable broker under power cuts: small segments roll often; syncs and checkpoints come
#: every few operations, so that a short recorded run crosses many crash points.
BROKER_FLAGS = ("--durable", "--max-bytes-per-file=2048", "--sync-every=16", "--sync-timeout=50ms",
                "--msg-timeout=500ms", "--mem-queue-size=50")


def check_model(disk: Disk, recorder: Recorder, path: Path) -> None:
    """``disk`` (the model of the directory ``path`` when ``recorder`` began), advanced over the
    whole record, holds what ``path`` holds: the recorder saw every change."""
    disk.advance(recorder.ops, len(recorder.ops))
    assert disk.files_now() == {p.name: p.read_bytes() for p in path.iterdir()}, \
        "the recorder missed a change: the model of the directory differs from the directory"


def crash_points(default: int) -> int:
    """``PYNSQD_POWERCUT_POINTS``, the number of crash points a simulation tries, or ``default``."""
    return int(os.environ.get("PYNSQD_POWERCUT_POINTS") or default)


def first_seed() -> int:
    """``PYNSQD_POWERCUT_SEED``: an integer, ``random`` (a new seed), or unset (a fixed seed)."""
    value = os.environ.get("PYNSQD_POWERCUT_SEED", "")
    if value == "random":
        return random.SystemRandom().randrange(1 << 32)
    return int(value) if value else 20250611


def write_directory(path: Path, files: dict[str, bytes]) -> Path:
    """Create the directory ``path`` holding exactly ``files``; returns ``path``."""
    path.mkdir(parents=True)
    for name, data in files.items():
        (path / name).write_bytes(data)
    return path
