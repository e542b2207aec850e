"""Every flag pynsqd accepts, by flag name and by config key, and ``GET /config/:opt``'s values.

The table is collected from :class:`~broker.config.schema.Options`'s field declarations plus
the flags that set no option (``--config``, ``--version`` and nsqd's deprecated ones).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from broker.config.flag import Flag, declared_flag
from broker.config.kinds import BOOL, STRING
from broker.config.schema import Options

__all__ = ["FLAGS", "FLAGS_BY_NAME", "FLAGS_BY_CONFIG", "CONFIG_ALIASES", "CONFIG_NAMES", "get_config_value"]


def _collect_flags() -> tuple[Flag, ...]:
    flags = [
        Flag("version", BOOL, "print version string"),
        Flag("config", STRING, "path to config file"),
        Flag("verbose", BOOL, "[deprecated] has no effect, use --log-level"),
        Flag("worker-id", BOOL, "[deprecated] use --node-id"),
    ]
    for item in dataclasses.fields(Options):
        flag = declared_flag(item)
        if flag is not None:
            flags.append(flag)
    return tuple(sorted(flags, key=lambda flag: flag.name))


#: Every flag, sorted by name (the order of ``--help``).
FLAGS = _collect_flags()
FLAGS_BY_NAME = {flag.name: flag for flag in FLAGS}
FLAGS_BY_CONFIG = {flag.cfg: flag for flag in FLAGS if flag.cfg}
#: node_id is accepted as a spelling of nsqd's ``id`` key in a config file, matching the field
#: name; ``GET /config/node_id`` answers ``INVALID_OPTION``, as nsqd's.
CONFIG_ALIASES = {"node_id": "id"}

CONFIG_NAMES: tuple[str, ...] = tuple(sorted(FLAGS_BY_CONFIG))
"""Every config-file key (and ``GET /config/:opt`` name) pynsqd knows."""


def get_config_value(options: Options, name: str) -> Any:
    """The JSON value nsqd's ``GET /config/:opt`` returns for config name ``name``.

    Durations are integer nanoseconds, lists are lists, ``log_level`` is nsqd's level number
    (2 = info), ``tls_required`` 0/1/2 and ``tls_min_version`` the protocol number (0x0301
    for tls1.0). Raises ``KeyError`` for a name nsqd's ``/config`` would answer with
    ``INVALID_OPTION``.
    """
    flag = FLAGS_BY_CONFIG.get(name)
    if flag is None or flag.attr is None:
        raise KeyError(name)
    return flag.kind.to_json(getattr(options, flag.attr))
