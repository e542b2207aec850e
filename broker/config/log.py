"""nsqd's log line format for pynsqd's loggers.

nsqd writes every line through Go's ``log`` package with ``--log-prefix`` (``"[nsqd] "``) and
date, time and microseconds, then the level name::

    [nsqd] 2024/01/01 12:00:00.000000 INFO: TCP: listening on 127.0.0.1:4150

Scripts and log shippers that parse nsqd's output parse ours unchanged. All of pynsqd logs
under the ``pynsqd`` logger hierarchy; :func:`configure_logging` installs one stderr handler
on it, and :func:`set_log_level` changes the threshold at run time (``PUT /config/log_level``).
"""

from __future__ import annotations

import datetime
import logging
import math
import sys
from typing import TextIO

__all__ = [
    "LOGGER_NAME",
    "LOG_LEVELS",
    "NsqdFormatter",
    "configure_logging",
    "set_log_level",
    "log_level_number",
]

LOGGER_NAME = "pynsqd"

# nsqd's level names (lg.ParseLogLevel) mapped onto the stdlib's levels.
LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
}

# nsqd's lg.LogLevel numbers, which is what GET /config/log_level returns.
_NSQD_LEVEL_NUMBERS = {"debug": 1, "info": 2, "warn": 3, "error": 4, "fatal": 5}

# What nsqd prints for each level (lg.LogLevel.String: WARN prints as "WARNING").
_LEVEL_LABELS = {
    logging.DEBUG: "DEBUG",
    logging.INFO: "INFO",
    logging.WARNING: "WARNING",
    logging.ERROR: "ERROR",
    logging.CRITICAL: "FATAL",
}


def log_level_number(level: str) -> int:
    """nsqd's integer for a level name (``"info"`` -> 2); ``KeyError`` for unknown names."""
    return _NSQD_LEVEL_NUMBERS[level.lower()]


class NsqdFormatter(logging.Formatter):
    """Formats records as ``<prefix>YYYY/MM/DD HH:MM:SS.ffffff LEVEL: message``.

    Times are local, as Go's ``log`` package prints them. A record's traceback, if any,
    follows on the next lines.
    """

    def __init__(self, prefix: str = "[nsqd] ") -> None:
        super().__init__()
        self.prefix = prefix
        self._second = -1
        self._second_text = ""

    def format(self, record: logging.LogRecord) -> str:
        created = record.created
        second = math.floor(created)
        micros = round((created - second) * 1e6)  # as datetime rounds a timestamp
        if micros >= 1_000_000:
            second, micros = second + 1, micros - 1_000_000
        if second != self._second:  # a start logs thousands of lines a second: format each second once
            self._second_text = datetime.datetime.fromtimestamp(second).strftime("%Y/%m/%d %H:%M:%S")
            self._second = second
        stamp = f"{self._second_text}.{micros:06d}"
        label = _LEVEL_LABELS.get(record.levelno) or record.levelname
        line = f"{self.prefix}{stamp} {label}: {record.getMessage()}"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        if record.stack_info:
            line = f"{line}\n{self.formatStack(record.stack_info)}"
        return line


class _NsqdHandler(logging.StreamHandler):
    """The handler :func:`configure_logging` owns, so a second call replaces it."""


def configure_logging(
    level: str = "info", prefix: str = "[nsqd] ", stream: TextIO | None = None
) -> logging.Logger:
    """Send the ``pynsqd`` loggers to ``stream`` (stderr) in nsqd's format at ``level``.

    ``level`` is one of nsqd's names (debug, info, warn, error, fatal); raises ``KeyError``
    for anything else. Calling it again replaces the handler it installed before, so the
    command line can log with defaults while it reads its options and then switch to the
    configured prefix and level. Returns the ``pynsqd`` logger.
    """
    logger = logging.getLogger(LOGGER_NAME)
    for handler in list(logger.handlers):
        if isinstance(handler, _NsqdHandler):
            logger.removeHandler(handler)
            handler.close()
    handler = _NsqdHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(NsqdFormatter(prefix))
    logger.addHandler(handler)
    logger.setLevel(LOG_LEVELS[level.lower()])
    return logger


def set_log_level(level: str) -> None:
    """Change the ``pynsqd`` threshold at run time; ``KeyError`` for an unknown level name."""
    logging.getLogger(LOGGER_NAME).setLevel(LOG_LEVELS[level.lower()])
