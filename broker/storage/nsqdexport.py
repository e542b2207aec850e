"""The way back to nsqd: a stopped pynsqd's queues written as nsqd 1.3.0's files in another directory.

``pynsqd export-nsqd --data-path=D --to=N`` reads the data directory ``D`` of a stopped
pynsqd (its lock is taken, so a running one makes it fail) and writes into the new or empty
directory ``N`` what nsqd needs to deliver the same messages: ``nsqd.dat`` (the same
format; nsqd ignores pynsqd's ``max_attempts``) and, per topic and channel with messages,
go-diskqueue's files (see :mod:`broker.storage.nsqdimport` for their layout)::

    <name>.diskqueue.000000.dat, ...   records from each queue's committed cursor on
    <name>.diskqueue.meta.dat          "<depth>\\n0,0\\n<last file>,<its size>\\n"

A channel's deferred messages (stashed by the shutdown) join its queue without their due
time, as nsqd itself keeps them; a channel of a topic with priorities is written in its
(priority, arrival) order, without the priorities; dead letters have no place in nsqd and are left out (the
count is logged). ``D`` keeps every message (its queues are opened as a start opens them,
and nothing is committed), so an interrupted export is simply run again into an emptied ``N``. A data directory of ``--durable`` (records marked with their origin) is
refused: which of its records are already finished is known to pynsqd only.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from broker.config.options import Options
from broker.core.message import Message, decode, encode, origin
from broker.core.ranking import rank_key
from broker.storage.datadir import DataDirectory
from broker.storage.metadata import METADATA_FILE, load
from diskqueue import DiskQueue
from diskqueue.checkpoint import fsync_path, replace_durably
from diskqueue.format import meta_filename, segment_filename

__all__ = ["ExportRefused", "export_nsqd"]

log = logging.getLogger("pynsqd.export")

_READ_BATCH = 4096


class ExportRefused(RuntimeError):
    """The export cannot be made faithfully (a ``--durable`` data directory, a target that is not empty)."""


async def export_nsqd(options: Options, target: Path) -> dict[str, int]:
    """Write the queues of the data directory ``options.data_path`` as nsqd's files in ``target``.

    Returns the messages written per queue name. Raises :class:`ExportRefused`,
    ``DataPathLocked`` while a broker uses the directory, ``OSError`` on a file error.
    """
    target.mkdir(parents=True, exist_ok=True)
    if any(target.iterdir()):
        raise ExportRefused(f"{target} is not empty")
    directory = DataDirectory(options)
    directory.lock()
    try:
        written: dict[str, int] = {}
        for topic in load(directory.path):
            names = [(topic["name"], [topic["name"]])]
            names += [(f"{topic['name']}:{ch['name']}", [f"{topic['name']}:{ch['name']}",
                                                         f"{topic['name']}:{ch['name']}#deferred"])
                      for ch in topic["channels"]]
            for name, sources in names:
                msgs: list[Message] = []
                for source in sources:
                    msgs.extend(await _read(directory, source))
                if topic.get("prioritised") and ":" in name:
                    # nsqd delivers in file order: the channel's (priority, arrival) order
                    msgs.sort(key=rank_key(options.default_priority))
                records = []
                for msg in msgs:
                    msg.due_ns = 0
                    msg.priority = None
                    records.append(encode(msg))
                buried = await _read(directory, f"{name}#buried") if ":" in name else []
                if buried:
                    log.warning("nsqd export: channel %s: %d dead letters left out (nsqd has no place for them)",
                                name, len(buried))
                if records:
                    _write_queue(target, name, records, options.max_bytes_per_file)
                written[name] = len(records)
                log.info("nsqd export: queue %s: wrote %d messages", name, len(records))
        metadata = directory.path / METADATA_FILE
        if metadata.exists():
            shutil.copyfile(metadata, target / METADATA_FILE)
        fsync_path(str(target))
        return written
    finally:
        directory.unlock()


async def _read(directory: DataDirectory, name: str) -> list[Message]:
    """The records of pynsqd's queue ``name`` from its committed cursor on, in nsqd's layout ([] if none)."""
    if not any(directory.path.glob(f"{_glob_escape(name)}.diskqueue.*")):
        return []
    queue: DiskQueue = directory.queues.open(name, auto_commit=False)
    out: list[Message] = []
    try:
        if queue.note:
            raise ExportRefused(f"queue {name} was written with --durable; export needs a data directory "
                                "of pynsqd run without it")
        while batch := queue.read_many(_READ_BATCH):
            for record in batch:
                if origin(record) is not None:
                    raise ExportRefused(f"queue {name} was written with --durable; export needs a data "
                                        "directory of pynsqd run without it")
                out.append(decode(record))
    finally:
        await queue.close()  # nothing was committed: the directory keeps every message
    return out


def _glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def _write_queue(target: Path, name: str, records: list[bytes], max_bytes: int) -> None:
    """nsqd's segment files and checkpoint for ``records``; a file is rolled as nsqd rolls it."""
    number = 0
    size = 0
    chunks: list[bytes] = []
    for record in records:
        framed = len(record).to_bytes(4, "big") + record
        if chunks and size + len(framed) > max_bytes:
            replace_durably(str(target / segment_filename(name, number)), b"".join(chunks))
            number, size, chunks = number + 1, 0, []
        chunks.append(framed)
        size += len(framed)
    replace_durably(str(target / segment_filename(name, number)), b"".join(chunks))
    replace_durably(str(target / meta_filename(name)), f"{len(records)}\n0,0\n{number},{size}\n".encode())

