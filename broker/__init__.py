"""pynsqd: an nsqd-compatible message broker on Trio.

Public names are loaded on first use so that light users of the package
(the Spark connector's executors import only :mod:`broker.protocol`) do not
pay for the whole daemon.
"""

from __future__ import annotations

import importlib

__all__ = ["Broker", "Daemon", "Addresses", "Options", "parse_args", "Message"]

_EXPORTS = {
    "Broker": "broker.core.broker",
    "Daemon": "broker.daemon",
    "Addresses": "broker.daemon",
    "Options": "broker.config.options",
    "parse_args": "broker.config.options",
    "Message": "broker.core.message",
}


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'broker' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
