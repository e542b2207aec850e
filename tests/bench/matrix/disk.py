"""Bytes written to disk per published message, for the rows whose topic has channels nobody
reads (the ``N channels`` rows).

The window runs from just before the writer starts until the broker has settled after it:
every channel's ``message_count`` in ``/stats`` holds every message of the topic's, the
topic's depth is 0 and the data path has stopped growing (or ``SETTLE_TIMEOUT`` passed:
``settled`` is then false). Two figures over that window, each divided by the topic's
``message_count`` (what the broker accepted; nsq's bench_writer reports only a rate):

- ``data_bytes_per_msg``: how much the files under the data path grew (the sum of their
  sizes; the broker's log, which the runner keeps there, left out): what the broker left on
  disk for the run's messages;
- ``write_bytes_per_msg``: the growth of ``write_bytes`` in ``/proc/<pid>/io``, the bytes the
  broker process caused to be sent to storage (page-cache pages it dirtied, whole pages; its
  log and metadata included; 0 on tmpfs).

Both leave out what a broker writes when it stops (nsqd and pynsqd flush their in-memory
queues then), so with ``--mem-queue-size=2000000`` they are about 0.

The same looks give ``copied_s``, the seconds from just before the writer started to the
first look at which every channel held every message, and ``fan_out_msgs_per_s``, the
topic's ``message_count`` over it: how fast messages reached every channel, where the
writer's rate is how fast the broker accepted them (nsqd accepts into the topic's queue and
copies to the channels behind it, seconds later with many channels).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

#: the longest wait for a broker to settle after the writer
SETTLE_TIMEOUT = 60.0


#: how often the settling broker is looked at; it is settled once two looks in a row agree
SETTLE_POLL = 0.1


def data_path_bytes(data: Path, skip: tuple[str, ...] = ("broker.log",)) -> int:
    """The sum of the sizes of the files under ``data`` (a file removed while walking counts 0)."""
    total = 0
    for path in data.rglob("*"):
        if path.name in skip:
            continue
        try:
            if path.is_file():
                total += path.stat().st_size
        except OSError:
            pass
    return total


def io_counters(pid: int) -> dict[str, int]:
    """``/proc/<pid>/io`` as a dict (``write_bytes``, ``wchar``, ``cancelled_write_bytes``, ...)."""
    counters = {}
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        key, _, value = line.partition(":")
        counters[key.strip()] = int(value)
    return counters


def copied(stats: dict | None, channels: int) -> bool:
    """Whether the topic's stats show every published message in each of ``channels`` channels."""
    if stats is None:
        return False
    counts = [c.get("message_count", 0) for c in stats.get("channels") or ()]
    return (len(counts) >= channels and stats.get("depth", 0) == 0
            and all(n >= stats.get("message_count", 0) for n in counts))


class DiskMeter:
    """Measures one run: ``start()`` before the writer, ``finish()`` after it."""

    def __init__(self, data: Path, pid: int, channels: int, stats: Callable[[], dict | None]):
        self.data, self.pid, self.channels, self.stats = data, pid, channels, stats
        self.data0 = self.write0 = self.cancelled0 = 0
        self.began = 0.0

    def start(self) -> None:
        self.data0 = data_path_bytes(self.data)
        io = io_counters(self.pid)
        self.write0, self.cancelled0 = io.get("write_bytes", 0), io.get("cancelled_write_bytes", 0)
        self.began = time.monotonic()

    def finish(self, timeout: float = SETTLE_TIMEOUT, poll: float = SETTLE_POLL) -> dict:
        """Wait for the broker to settle, then the figures (see the module's docstring)."""
        waited = time.monotonic()
        last: tuple | None = None
        copied_at = None
        while True:
            stats = self.stats()
            now = time.monotonic()
            size = data_path_bytes(self.data)
            io = io_counters(self.pid)
            look = (size, io.get("write_bytes", 0), stats and stats.get("message_count"))
            done = copied(stats, self.channels)
            if done and copied_at is None:
                copied_at = now
            settled = done and look == last
            if settled or now - waited > timeout:
                break
            last = look
            time.sleep(poll)
        return figures(messages=(stats or {}).get("message_count", 0), channels=self.channels,
                       data_bytes=size - self.data0, write_bytes=io.get("write_bytes", 0) - self.write0,
                       cancelled_write_bytes=io.get("cancelled_write_bytes", 0) - self.cancelled0,
                       settled=settled, settle_s=time.monotonic() - waited,
                       copied_s=None if copied_at is None else copied_at - self.began)


def figures(messages: int, channels: int, data_bytes: int, write_bytes: int, cancelled_write_bytes: int = 0,
            settled: bool = True, settle_s: float = 0.0, copied_s: float | None = None) -> dict:
    """One run's record, with the per-message figures (None without messages) and the fan-out
    rate (None when the channels never held every message)."""
    return {
        "messages": messages, "channels": channels, "data_bytes": data_bytes, "write_bytes": write_bytes,
        "cancelled_write_bytes": cancelled_write_bytes, "settled": settled, "settle_s": round(settle_s, 2),
        "copied_s": None if copied_s is None else round(copied_s, 3),
        "data_bytes_per_msg": data_bytes / messages if messages else None,
        "write_bytes_per_msg": write_bytes / messages if messages else None,
        "fan_out_msgs_per_s": messages / copied_s if messages and copied_s else None,
    }
