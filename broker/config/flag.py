"""One command line flag, and :func:`option`, which declares an :class:`Options` field with its flag."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from broker.config.kinds import Kind

__all__ = ["Flag", "option", "declared_flag"]

_METADATA_KEY = "flag"


class Flag(NamedTuple):
    """One command line flag: its kind, nsqd's help text, the Options attribute and config key.

    ``attr`` and ``cfg`` are None for flags that set no option (``--config``, ``--version``).
    ``bound`` is ``">=0"`` or ``">0"`` for numbers that must not be negative or zero.
    """

    name: str
    kind: Kind
    usage: str
    attr: str | None = None
    cfg: str | None = None
    bound: str | None = None


def option(default: Any, kind: Kind, flag: str, usage: str, *, cfg: str | None = None,
           bound: str | None = None, factory: Any = None) -> Any:
    """A dataclass field whose value the flag ``--<flag>`` (and config key ``cfg``) sets.

    ``cfg`` defaults to the flag name with ``-`` turned into ``_``; ``factory`` computes the
    default when it depends on the machine (the hostname).
    """
    meta = {_METADATA_KEY: Flag(flag, kind, usage, cfg=cfg, bound=bound)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def declared_flag(item: dataclasses.Field[Any]) -> Flag | None:
    """The flag :func:`option` declared for a field, completed with its attribute and config key."""
    declared = item.metadata.get(_METADATA_KEY)
    if declared is None:
        return None
    return declared._replace(attr=item.name, cfg=declared.cfg or declared.name.replace("-", "_"))
