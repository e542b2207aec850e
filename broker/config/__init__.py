"""nsqd's flags and TOML config file as one declarative table, parsed once into :class:`Options`.

* :mod:`~broker.config.schema` -- the :class:`Options` dataclass, whose fields declare each flag,
  and the checks every :class:`Options` passes on construction;
* :mod:`~broker.config.kinds` -- how each type of value is read (Go syntax) and shown;
* :mod:`~broker.config.flag` and :mod:`~broker.config.flag_table` -- the flags collected from it;
* :mod:`~broker.config.options` -- the command line and :func:`parse_args`;
* :mod:`~broker.config.config_file` -- the ``--config`` TOML file;
* :mod:`~broker.config.unbuilt` -- the nsqd options accepted but not acted on yet, their
  start-up warnings;
* :mod:`~broker.config.help` -- ``--help``;
* :mod:`~broker.config.log` -- nsqd's log line format.
"""

from broker.config.config_file import load_config
from broker.config.errors import HelpRequest, InfoRequest, InstantiateError, OptionsError
from broker.config.flag_table import CONFIG_NAMES, get_config_value
from broker.config.help import export_help_text, help_text
from broker.config.log import (
    LOG_LEVELS,
    LOGGER_NAME,
    NsqdFormatter,
    configure_logging,
    log_level_number,
    set_log_level,
)
from broker.config.options import parse_args
from broker.config.schema import Options, default_node_id
from broker.config.tls import TLS_NOT_REQUIRED, TLS_REQUIRED, TLS_REQUIRED_EXCEPT_HTTP, TLS_VERSIONS
from broker.config.version import NSQD_COMPAT_VERSION, VERSION_TEXT, __version__

__all__ = [
    "__version__", "NSQD_COMPAT_VERSION", "VERSION_TEXT",
    "TLS_NOT_REQUIRED", "TLS_REQUIRED_EXCEPT_HTTP", "TLS_REQUIRED", "TLS_VERSIONS",
    "CONFIG_NAMES", "Options", "OptionsError", "InstantiateError", "InfoRequest", "HelpRequest", "parse_args",
    "load_config", "get_config_value", "help_text", "export_help_text", "default_node_id",
    "LOGGER_NAME", "LOG_LEVELS", "NsqdFormatter", "configure_logging", "set_log_level", "log_level_number",
]
