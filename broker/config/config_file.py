"""The TOML file named by ``--config``: keyed by each option's config name, as nsqd reads it.

The config name is the flag name with ``-`` turned into ``_``, except ``id`` (``--node-id``),
``nsqlookupd_tcp_addresses`` (``--lookupd-tcp-address``), ``auth_http_addresses`` and
``e2e_processing_latency_percentiles``. Durations are Go duration strings, or integers
meaning milliseconds. Keys nsqd does not know are ignored, with a warning.
"""

from __future__ import annotations

import logging
from typing import Any

from broker.config.errors import OptionsError
from broker.config.flag_table import CONFIG_ALIASES, FLAGS_BY_CONFIG
from broker.gocompat import format_v

__all__ = ["load_config", "resolve_config"]

log = logging.getLogger("pynsqd.options")


def load_config(path: str) -> dict[str, Any]:
    """Read a TOML config file into a dict; :class:`OptionsError` if it cannot be read or parsed."""
    import tomllib  # here: a start without --config does not pay for the TOML parser

    try:
        with open(path, "rb") as stream:
            return tomllib.load(stream)
    except OSError as err:
        reason = err.strerror or str(err)
        reason = reason[:1].lower() + reason[1:]
        raise OptionsError(f"failed to load config file {path} - open {path}: {reason}") from None
    except tomllib.TOMLDecodeError as err:
        raise OptionsError(f"failed to load config file {path} - {err}") from None


def resolve_config(path: str, config: dict[str, Any]) -> dict[str, Any]:
    """Config file values by :class:`Options` field name, coerced; unknown keys are logged and skipped.

    Raises :class:`OptionsError` for a value of the wrong kind, or for both ``id`` and its
    alias ``node_id``.
    """
    config = dict(config)
    for alias, name in CONFIG_ALIASES.items():
        if alias in config:
            if name in config:
                raise OptionsError(f"config file {path} sets both {name} and {alias}")
            config[name] = config.pop(alias)
    resolved: dict[str, Any] = {}
    for key, value in config.items():
        flag = FLAGS_BY_CONFIG.get(key)
        if flag is None or flag.attr is None:
            log.warning("config file %s: ignoring unknown option %r", path, key)
            continue
        try:
            resolved[flag.attr] = flag.kind.from_config(value)
        except ValueError as err:
            raise OptionsError(f"failed parsing {key} {format_v(value)} - {err}") from None
    return resolved
