"""``nsqd.dat``: which topics and channels exist and which are paused.

The shape is nsqd's, so a data directory moves between nsqd and pynsqd::

    {"topics": [{"channels": [{"name": "c", "paused": false}], "name": "t", "paused": false}],
     "version": "1.3.0"}

pynsqd adds ``max_attempts`` to a channel entry when dead-lettering is set for
it; nsqd ignores unknown keys. Ephemeral topics and channels are never
written. The file is replaced atomically: temp file, fsync, rename, fsync of
the directory. :class:`MetadataFile` keeps it up to date while the broker runs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from broker.config.options import NSQD_COMPAT_VERSION
from broker.gocompat import go_unmarshal
from broker.protocol import is_valid_name
from diskqueue.checkpoint import store_checkpoint

__all__ = ["METADATA_FILE", "MetadataFile", "load", "save", "dump"]

log = logging.getLogger("pynsqd.metadata")

METADATA_FILE = "nsqd.dat"


def load(data_path: Path) -> list[dict]:
    """The topic entries of ``nsqd.dat`` (empty if there is none).

    Invalid names are skipped with a warning, as nsqd does. Raises ValueError
    if the file exists but is not valid JSON of the expected shape.
    """
    path = data_path / METADATA_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    try:
        return _entries(go_unmarshal(raw))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"failed to parse metadata {path}: {exc}") from exc


def _entries(doc: Any) -> list[dict]:
    """The topic entries of a decoded ``nsqd.dat``; TypeError names the first value of a wrong type."""
    if not isinstance(doc, dict):
        raise TypeError(f"the document is {_kind(doc)}, not an object")
    topics = doc.get("topics") or []
    if not isinstance(topics, list):
        raise TypeError(f"topics is {_kind(topics)}, not a list")
    result = []
    for entry in topics:
        if not isinstance(entry, dict):
            raise TypeError(f"a topic entry is {_kind(entry)}, not an object")
        name = entry.get("name", "")
        if not isinstance(name, str):
            raise TypeError(f"a topic name is {_kind(name)}, not a string")
        channel_entries = entry.get("channels") or []
        if not isinstance(channel_entries, list) or not all(isinstance(ch, dict) for ch in channel_entries):
            raise TypeError(f"the channels of topic {name!r} are not a list of objects")
        if not is_valid_name(name):
            log.warning("skipping creation of invalid topic %r", name)
            continue
        channels = []
        for ch in channel_entries:
            if not isinstance(ch.get("name", ""), str):
                raise TypeError(f"a channel name of topic {name!r} is {_kind(ch['name'])}, not a string")
            if not is_valid_name(ch.get("name", "")):
                log.warning("skipping creation of invalid channel %r", ch.get("name"))
                continue
            channels.append(ch)
        result.append({"name": name, "paused": bool(entry.get("paused")), "channels": channels})
    return result


_KINDS = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array", dict: "an object"}


def _kind(value: Any) -> str:
    return _KINDS.get(type(value), "null")


def dump(topics: list[dict], version: str) -> bytes:
    """Serialize topic entries in nsqd's key order (Go sorts map keys)."""
    doc = {"topics": [
        {"channels": [dict(sorted(ch.items())) for ch in t["channels"]], "name": t["name"], "paused": t["paused"]}
        for t in topics
    ], "version": version}
    return json.dumps(doc, separators=(",", ":")).encode()


def save(data_path: Path, payload: bytes) -> None:
    """Atomically and durably replace ``nsqd.dat`` with ``payload`` (blocking: run it in a thread).

    The disk queue's checkpoint writer does exactly this: temporary file, fsync,
    rename, fsync of the directory.
    """
    store_checkpoint(str(data_path / METADATA_FILE), payload)


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
        """Write the file now (in a worker thread). Raises OSError."""
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
