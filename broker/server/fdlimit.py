"""The open-files limit: raised to the hard limit at start, as Go's runtime does for nsqd.

Every connection, disk queue segment and checkpoint write needs a file descriptor. Many
systems still start processes with a soft limit of 1024 (or less) under a much higher hard
limit; Go programs such as nsqd raise the soft limit to the hard one at start (Go 1.19+),
so pynsqd does the same rather than failing ``accept`` with EMFILE under load.
"""

from __future__ import annotations

import logging
import resource

__all__ = ["raise_open_files_limit"]

_NR_OPEN = "/proc/sys/fs/nr_open"  # Linux: the ceiling for an unlimited hard limit


def _ceiling(hard: int) -> int:
    if hard != resource.RLIM_INFINITY:
        return hard
    try:
        with open(_NR_OPEN) as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 20


def raise_open_files_limit(log: logging.Logger) -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit and log the limit in use; returns it.

    A refusal (some sandboxes forbid it) is logged as a warning and the old limit kept.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _ceiling(hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError) as exc:
            log.warning("open files limit: %d; could not raise it to the hard limit %d: %s", soft, target, exc)
            return soft
        log.info("open files limit: %d (soft limit raised from %d)", target, soft)
        return target
    log.info("open files limit: %d", soft)
    return soft
