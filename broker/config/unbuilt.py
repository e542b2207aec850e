"""The nsqd options pynsqd accepts but does not act on yet, in one table.

nsqd's command lines and config files must keep working, so pynsqd accepts every nsqd
flag; the ones whose feature it lacks are listed in :data:`UNBUILT`, which ``--help``
(:mod:`broker.config.help`) and the start-up warnings (:func:`unbuilt_warnings`) read.
Building a feature means removing its rows.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from broker.config.flag_table import FLAGS
from broker.config.schema import Options
from broker.gocompat import format_duration, to_ns

__all__ = ["Unbuilt", "UNBUILT", "UNBUILT_BY_FLAG", "unbuilt_warnings"]


class Unbuilt(NamedTuple):
    """One accepted option whose feature pynsqd lacks.

    ``flag`` is the flag name; ``reason`` starts the warning (what pynsqd does not do),
    ``instead`` ends it (what happens instead, or ""); ``help_note`` is added to the flag's
    ``--help`` text. ``warns`` is False for an option whose default already asks for the
    missing feature, where a warning on every start would say nothing new.
    """

    flag: str
    reason: str
    instead: str = ""
    help_note: str = "not built in pynsqd: ignored"
    warns: bool = True


#: Every option pynsqd accepts but does not act on, by flag name (the order of ``--help``).
UNBUILT: tuple[Unbuilt, ...] = ()
UNBUILT_BY_FLAG = {row.flag: row for row in UNBUILT}

_ATTRS = {flag.name: flag.attr for flag in FLAGS}


def _defaults() -> dict[str, Any]:
    # The declared defaults; none of the unbuilt options has a machine-dependent one.
    return {field.name: field.default for field in dataclasses.fields(Options)}


def _shown(value: Any) -> str:
    """A value as it would be written on the command line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(str(item) for item in value)
    if isinstance(value, float):  # the only unbuilt float options are durations
        return format_duration(to_ns(value))
    return str(value)


def unbuilt_warnings(options: Options) -> list[str]:
    """One warning per option set (on the command line or in the config file) that pynsqd ignores.

    An option left at its default is not mentioned. Each line names the flag and its value
    and says what pynsqd does instead, e.g. ``pynsqd does not push stats to statsd;
    --statsd-address=127.0.0.1:8125 is ignored (scrape GET /metrics ...)``.
    """
    defaults = _defaults()
    warnings = []
    for row in UNBUILT:
        attr = _ATTRS[row.flag]
        assert attr is not None
        value = getattr(options, attr)
        if not row.warns or value == defaults[attr]:
            continue
        line = f"{row.reason}; --{row.flag}={_shown(value)} is ignored"
        warnings.append(f"{line} ({row.instead})" if row.instead else line)
    return warnings

