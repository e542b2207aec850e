"""``nsqd.dat``: which topics and channels exist and which are paused.

The shape is nsqd's, so a data directory moves between nsqd and pynsqd::

    {"topics": [{"channels": [{"name": "c", "paused": false}], "name": "t", "paused": false}],
     "version": "1.3.0"}

pynsqd adds ``max_attempts`` to a channel entry when dead-lettering is set for
it; nsqd ignores unknown keys. Ephemeral topics and channels are never
written. The file is replaced atomically: temp file, fsync, rename, fsync of
the directory.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from broker.protocol import is_valid_name

__all__ = ["METADATA_FILE", "load", "save", "dump"]

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
        doc = json.loads(raw)
        topics = doc.get("topics") or []
        if not isinstance(topics, list):
            raise TypeError("topics is not a list")
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"failed to parse metadata {path}: {exc}") from exc
    result = []
    for entry in topics:
        name = entry.get("name", "")
        if not is_valid_name(name):
            log.warning("skipping creation of invalid topic %r", name)
            continue
        channels = []
        for ch in entry.get("channels") or []:
            if not is_valid_name(ch.get("name", "")):
                log.warning("skipping creation of invalid channel %r", ch.get("name"))
                continue
            channels.append(ch)
        result.append({"name": name, "paused": bool(entry.get("paused")), "channels": channels})
    return result


def dump(topics: list[dict], version: str) -> bytes:
    """Serialize topic entries in nsqd's key order (Go sorts map keys)."""
    doc = {"topics": [
        {"channels": [dict(sorted(ch.items())) for ch in t["channels"]], "name": t["name"], "paused": t["paused"]}
        for t in topics
    ], "version": version}
    return json.dumps(doc, separators=(",", ":")).encode()


def save(data_path: Path, payload: bytes) -> None:
    """Atomically replace ``nsqd.dat`` with ``payload`` (blocking: run it in a thread)."""
    path = data_path / METADATA_FILE
    tmp = data_path / f"{METADATA_FILE}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(data_path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
