"""``nsqd.dat``: which topics and channels exist and which are paused.

The shape is nsqd's, so a data directory moves between nsqd and pynsqd::

    {"topics": [{"channels": [{"name": "c", "paused": false}], "name": "t", "paused": false}],
     "version": "1.3.0"}

pynsqd adds ``max_attempts`` to a channel entry when dead-lettering is set for
it, ``"prioritised": true`` to a topic entry once it has priorities and
``"replicas": N`` when the topic has a number of replicas of its own; nsqd
ignores unknown keys. Ephemeral topics and channels are never
written. The file is replaced atomically: temp file, fsync, rename, fsync of
the directory. :class:`MetadataFile` keeps it up to date while the broker runs.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from broker.config.options import NSQD_COMPAT_VERSION
from broker.gocompat.jsonscan import syntax_error
from broker.gocompat.unmarshal import GO_BOOL, GO_STRING, GoSlice, GoStruct, unmarshal
from broker.protocol import is_valid_name
from diskqueue import describe_os_error
from diskqueue.checkpoint import FILE_MODE, TEMP_SUFFIX, replace_durably

__all__ = ["METADATA_FILE", "MetadataFile", "MetadataLoadError", "MetadataWriteError", "load", "save", "dump"]

log = logging.getLogger("pynsqd.metadata")

METADATA_FILE = "nsqd.dat"

#: nsqd's ``Metadata`` struct, which it reads ``nsqd.dat`` into (its errors name these types).
_CHANNEL = GoStruct("nsqd.ChannelMetadata", {"name": GO_STRING, "paused": GO_BOOL})
_TOPIC = GoStruct("nsqd.TopicMetadata", {"name": GO_STRING, "paused": GO_BOOL, "channels": GoSlice(_CHANNEL)})
_METADATA = GoStruct("nsqd.Metadata", {"topics": GoSlice(_TOPIC), "version": GO_STRING})

#: Bytes checked before the rest of the file is read: garbage (zeros, random bytes, another
#: file's contents) shows at once, and a huge damaged file is then never read whole.
_PREFIX = 65536


class MetadataLoadError(ValueError):
    """``nsqd.dat`` exists but cannot be read or is not nsqd's metadata; the message is nsqd's:
    ``failed to parse metadata in <path> - <what Go's JSON decoder says>`` or
    ``failed to read metadata from <path> - <the OS error>``."""


class MetadataWriteError(OSError):
    """``nsqd.dat`` could not be replaced; the message is the OS error as nsqd words it
    (``open <data>/nsqd.dat.tmp: read-only file system``), ``errno`` the OS's."""

    def __init__(self, message: str, errno: int | None):
        super().__init__(message)
        self.errno = errno


def load(data_path: Path) -> list[dict]:
    """The topic entries of ``nsqd.dat`` (empty if there is none), read as nsqd reads the file.

    Invalid names are skipped with a warning, as nsqd does. Raises
    :class:`MetadataLoadError` when the file cannot be read or does not decode into
    nsqd's metadata (an empty file included), with nsqd's message; the file is left as it is.
    """
    path = data_path / METADATA_FILE
    raw = _read(path)
    if raw is None:
        return []
    try:
        problem = syntax_error(raw, complete=len(raw) < _PREFIX)
        if problem is not None:
            raise ValueError(problem)
        if len(raw) == _PREFIX:
            raw += _read_rest(path, _PREFIX)
        doc = unmarshal(raw, _METADATA)
    except ValueError as exc:
        raise MetadataLoadError(f"failed to parse metadata in {path} - {exc}") from None
    return _entries(doc)


def _read(path: Path) -> bytes | None:
    """The first :data:`_PREFIX` bytes of the file (all of it when shorter), None if there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise MetadataLoadError(f"failed to read metadata from {path} - {describe_os_error('open', str(path), exc)}") \
            from None
    try:
        chunks = []
        size = 0
        while size < _PREFIX:
            chunk = os.read(fd, _PREFIX - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    except OSError as exc:  # a directory named nsqd.dat opens, and its read fails
        raise MetadataLoadError(f"failed to read metadata from {path} - {describe_os_error('read', str(path), exc)}") \
            from None
    finally:
        os.close(fd)


def _read_rest(path: Path, offset: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read()
    except OSError as exc:
        raise MetadataLoadError(f"failed to read metadata from {path} - {describe_os_error('read', str(path), exc)}") \
            from None


def _entries(doc: dict[str, Any]) -> list[dict]:
    """The topic entries nsqd would create from a decoded ``nsqd.dat``, in its order."""
    result = []
    for topic in doc["topics"]:
        name = topic["name"]
        if not is_valid_name(name):
            log.warning("skipping creation of invalid topic %s", name)
            continue
        channels = []
        for channel in topic["channels"]:
            if not is_valid_name(channel["name"]):
                log.warning("skipping creation of invalid channel %s", channel["name"])
                continue
            channels.append(channel)
        entry = {"name": name, "paused": topic["paused"], "channels": channels}
        if topic.get("prioritised") is True:
            entry["prioritised"] = True
        if "replicas" in topic:
            entry["replicas"] = topic["replicas"]  # checked by the broker
        result.append(entry)
    return result


def dump(topics: list[dict], version: str) -> bytes:
    """Serialize topic entries as nsqd 1.3.0 marshals its ``Metadata`` struct: fields in the
    struct's order, and ``null`` for an empty list (a nil Go slice). pynsqd's own fields of a
    channel (``max_attempts``) follow nsqd's, which nsqd skips when it reads the file."""
    doc = {"topics": [_topic(t) for t in topics] or None, "version": version}
    return json.dumps(doc, separators=(",", ":")).encode()


def _topic(entry: dict[str, Any]) -> dict[str, Any]:
    doc = {"name": entry["name"], "paused": entry["paused"],
           "channels": [_channel(ch) for ch in entry["channels"]] or None}
    if entry.get("prioritised"):
        doc["prioritised"] = True
    if entry.get("replicas") is not None:
        doc["replicas"] = entry["replicas"]
    return doc


def _channel(entry: dict[str, Any]) -> dict[str, Any]:
    doc = {"name": entry["name"], "paused": entry["paused"]}
    doc.update(sorted((key, value) for key, value in entry.items() if key not in doc))
    return doc


def save(data_path: Path, payload: bytes) -> None:
    """Atomically and durably replace ``nsqd.dat`` with ``payload`` (blocking: run it in a thread).

    The disk queue's checkpoint writer does exactly this: temporary file, fsync,
    rename, fsync of the directory. Raises :class:`MetadataWriteError`.
    """
    path = str(data_path / METADATA_FILE)
    try:
        replace_durably(path, payload)
    except OSError as exc:
        if exc.filename2 is not None:
            what = describe_os_error("rename", exc.filename, exc, exc.filename2)
        elif exc.filename is not None:
            what = describe_os_error("open", exc.filename, exc)
        else:  # writing or syncing the temporary file
            what = describe_os_error("write", path + TEMP_SUFFIX, exc)
        raise MetadataWriteError(what, exc.errno) from exc


class MetadataFile:
    """``nsqd.dat`` of one data directory, rewritten as topics and channels change.

    :meth:`changed` schedules a rewrite, done by :meth:`run`; :meth:`persist`
    writes at once. Writers take turns and each serializes the state current
    when its turn comes (``entries`` is called then), so the file never goes
    back to an older state. Implements :class:`broker.core.host.MetadataStore`.
    """

    def __init__(self, data_path: Path):
        self.data_path = data_path
        self._dirty = trio.Event()
        self._lock = trio.Lock()
        self._version = 0  # bumped by every change
        self._saved = 0  # the version the file on disk describes
        self._written = trio.Event()

    def load(self) -> list[dict]:
        """The topic entries of the file (see :func:`load`)."""
        return load(self.data_path)

    def check_writable(self) -> None:
        """Create (and remove) the temporary file every rewrite starts with.

        Raises :class:`MetadataWriteError` where the file could not be rewritten (a
        read-only data path, no permission), before anything was read or changed.
        """
        tmp = str(self.data_path / METADATA_FILE) + TEMP_SUFFIX
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
        except OSError as exc:
            raise MetadataWriteError(describe_os_error("open", tmp, exc), exc.errno) from None
        os.close(fd)
        os.unlink(tmp)

    def changed(self) -> None:
        """Schedule a rewrite (done by :meth:`run`)."""
        self._version += 1
        self._dirty.set()

    async def wait_persisted(self) -> None:
        """Return once the file reflects every change made before this call."""
        target = self._version
        while self._saved < target:
            await self._written.wait()

    async def persist(self, entries: Callable[[], list[dict]]) -> None:
        """Write the file now (in a worker thread). Raises :class:`MetadataWriteError` (an OSError)."""
        async with self._lock:
            version = self._version
            payload = dump(entries(), NSQD_COMPAT_VERSION)
            await trio.to_thread.run_sync(save, self.data_path, payload)
            self._saved = max(self._saved, version)
            written, self._written = self._written, trio.Event()
            written.set()

    async def run(self, entries: Callable[[], list[dict]], on_error: Callable[[str], None]) -> None:
        """Rewrite the file after changes until cancelled; a failed write is reported and retried every second."""
        while True:
            await self._dirty.wait()
            self._dirty = trio.Event()
            try:
                await self.persist(entries)
            except OSError as exc:
                on_error(f"failed to persist metadata - {exc}")
                self._dirty.set()  # retry: durable SUBs and publishes wait for it
                await trio.sleep(1)
