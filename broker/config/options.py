"""The broker's options: nsqd 1.3.0's flags and TOML config file, parsed into one object.

Sources, highest priority first, as nsqd resolves them (``mreiferson/go-options``):

1. the command line: ``--flag=value``, ``--flag value``, ``-flag=value`` (Go's ``flag`` package
   takes one or two dashes), booleans as ``--flag`` or ``--flag=true|false``, list flags
   repeated (``--lookupd-tcp-address`` once per address; percentiles also comma separated);
2. the TOML file named by ``--config`` (:mod:`broker.config.config_file`);
3. the defaults of :class:`~broker.config.schema.Options`.

Durations are float seconds and sizes are ints in :class:`Options`; :func:`get_config_value`
renders a value the way nsqd's ``GET /config/:opt`` does (durations as integer nanoseconds).
This module reads the command line and is also where callers find the options' public names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from broker.config.config_file import load_config, resolve_config
from broker.config.errors import HelpRequest, InfoRequest, OptionsError
from broker.config.flag_table import CONFIG_NAMES, FLAGS_BY_NAME, get_config_value
from broker.config.help import help_text
from broker.config.kinds import FLOATS
from broker.config.schema import Options, default_node_id
from broker.config.tls import TLS_NOT_REQUIRED, TLS_REQUIRED, TLS_REQUIRED_EXCEPT_HTTP, TLS_VERSIONS
from broker.config.version import NSQD_COMPAT_VERSION, VERSION_TEXT, __version__
from broker.gocompat import go_quote_str

__all__ = [
    "__version__",
    "NSQD_COMPAT_VERSION",
    "VERSION_TEXT",
    "TLS_NOT_REQUIRED",
    "TLS_REQUIRED_EXCEPT_HTTP",
    "TLS_REQUIRED",
    "TLS_VERSIONS",
    "CONFIG_NAMES",
    "Options",
    "OptionsError",
    "InfoRequest",
    "parse_args",
    "load_config",
    "get_config_value",
    "help_text",
    "default_node_id",
]


def _read_command_line(argv: Sequence[str]) -> dict[str, Any]:
    """Go ``flag`` package parsing: the flags given, by flag name, in their parsed form."""
    given: dict[str, Any] = {}
    args = list(argv)
    index = 0
    while index < len(args):
        arg = args[index]
        index += 1
        if arg == "--":
            if index < len(args):
                raise OptionsError(f"unexpected argument {args[index]!r}")
            break
        if len(arg) < 2 or arg[0] != "-":
            raise OptionsError(f"unexpected argument {arg!r} (flags look like -flag=value)")
        body = arg[2:] if arg.startswith("--") else arg[1:]
        if not body or body[0] in "-=":
            raise OptionsError(f"bad flag syntax: {arg}")
        name, equals, text = body.partition("=")
        flag = FLAGS_BY_NAME.get(name)
        if flag is None:
            if name in ("h", "help"):
                raise HelpRequest(help_text())
            raise OptionsError(f"flag provided but not defined: -{name}")
        if not equals:
            if flag.kind.bool_flag:
                text = "true"
            elif index < len(args):
                text = args[index]
                index += 1
            else:
                raise OptionsError(f"flag needs an argument: -{name}")
        try:
            value = flag.kind.from_flag(text)
        except ValueError as err:
            what = "boolean value" if flag.kind.bool_flag else "value"
            flag_word = "" if flag.kind.bool_flag else "flag "
            raise OptionsError(f"invalid {what} {go_quote_str(text)} for {flag_word}-{name}: {err}") from None
        if flag.kind.repeatable:
            given[name] = given.get(name, ()) + value
        else:
            given[name] = value
    return given


def parse_args(argv: Sequence[str]) -> Options:
    """Parse nsqd's command line (and the ``--config`` file it names) into :class:`Options`.

    A flag on the command line beats the config file, which beats the default. Raises
    :class:`InfoRequest` for ``--help``/``-h`` (a :class:`HelpRequest`) and ``--version``, and :class:`OptionsError`
    for an unknown flag, a bad value, an unreadable config file or options that do not go
    together.
    """
    given = _read_command_line(argv)
    if given.get("version"):
        raise InfoRequest(VERSION_TEXT)
    values: dict[str, Any] = {}
    config_path = given.get("config", "")
    if config_path:
        values.update(resolve_config(config_path, load_config(config_path)))
    for name, value in given.items():
        flag = FLAGS_BY_NAME[name]
        if flag.attr is None:
            continue
        if flag.kind is FLOATS:
            # nsqd's percentile flag keeps its list sorted, highest first
            value = tuple(sorted(value, reverse=True))
        values[flag.attr] = value
    return Options(**values)
