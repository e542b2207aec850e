"""The broker's options: nsqd 1.3.0's flags and TOML config file, parsed into one object.

Sources, highest priority first, as nsqd resolves them (``mreiferson/go-options``):

1. the command line: ``--flag=value``, ``--flag value``, ``-flag=value`` (Go's ``flag`` package
   takes one or two dashes), booleans as ``--flag`` or ``--flag=true|false``, list flags
   repeated (``--lookupd-tcp-address`` once per address; percentiles also comma separated);
2. the TOML file named by ``--config``, keyed by the option's config name: the flag name with
   ``-`` turned into ``_``, except ``id`` (``--node-id``), ``nsqlookupd_tcp_addresses``
   (``--lookupd-tcp-address``), ``auth_http_addresses`` and
   ``e2e_processing_latency_percentiles``. Durations there are Go duration strings, or
   integers meaning milliseconds. Keys nsqd does not know are ignored, with a warning;
3. the defaults below.

Durations are float seconds and sizes are ints in :class:`Options`; :func:`get_config_value`
renders a value the way nsqd's ``GET /config/:opt`` does (durations as integer nanoseconds).

Where pynsqd's defaults differ from nsqd's on purpose: the listeners bind ``127.0.0.1`` rather
than every interface (pass ``--tcp-address=0.0.0.0:4150`` and ``--http-address=0.0.0.0:4151``
to serve other hosts). ``data_path`` ``""`` means the current directory, as in nsqd.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import socket
import tomllib
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from broker.config.log import LOG_LEVELS, log_level_number
from broker.gocompat import format_duration, parse_duration, to_ns, to_seconds

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

__version__ = "0.1.0"
# What the wire and HTTP ``version`` fields report, so tooling that checks nsqd's version works.
NSQD_COMPAT_VERSION = "1.3.0"
VERSION_TEXT = f"pynsqd v{__version__} (nsqd {NSQD_COMPAT_VERSION} compatible)"

# --tls-required values, with nsqd's numbers (what GET /config/tls_required returns).
TLS_NOT_REQUIRED = 0
TLS_REQUIRED_EXCEPT_HTTP = 1
TLS_REQUIRED = 2

# --tls-min-version names and the protocol numbers GET /config/tls_min_version returns.
TLS_VERSIONS = {"ssl3.0": 0x0300, "tls1.0": 0x0301, "tls1.1": 0x0302, "tls1.2": 0x0303, "tls1.3": 0x0304}

_TLS_CLIENT_AUTH_POLICIES = ("", "require", "require-verify")
_MAX_PORT = 65535

log = logging.getLogger("pynsqd.options")


class OptionsError(ValueError):
    """A flag, config file value or combination of options that cannot be used.

    The message names the flag (``--node-id must be [0,1024)``) or config key
    (``failed parsing tls_required maybe - ...``), in nsqd's wording where nsqd has one.
    """


class InfoRequest(Exception):
    """``--help`` or ``--version`` was given: print :attr:`text` to stdout and exit 0."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


# --------------------------------------------------------------------------- value syntax

_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
# strconv.ParseInt(s, 0, 64): decimal, 0x/0o/0b prefixes, a leading 0 means octal, and
# underscores between digits.
_GO_INT = re.compile(
    r"[+-]?(?:0[xX](?:_?[0-9a-fA-F])+|0[bB](?:_?[01])+|0[oO](?:_?[0-7])+|0(?:_?[0-7])*|[1-9](?:_?[0-9])*)\Z"
)
_DECIMAL_INT = re.compile(r"[+-]?[0-9]+\Z")
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


def _parse_go_bool(text: str) -> bool:
    if text in _GO_TRUE:
        return True
    if text in _GO_FALSE:
        return False
    raise ValueError("parse error")


def _parse_go_int(text: str) -> int:
    if not _GO_INT.match(text):
        raise ValueError("parse error")
    negative = text[0] == "-"
    digits = text.lstrip("+-").replace("_", "")
    if len(digits) > 1 and digits[0] == "0" and digits[1].isdigit():
        value = int(digits, 8)
    else:
        value = int(digits, 0)
    value = -value if negative else value
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError("value out of range")
    return value


def _go_quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _go_value(value: Any) -> str:
    """Render a config value the way Go's ``%v`` shows it in nsqd's messages."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + " ".join(_go_value(item) for item in value) + "]"
    if isinstance(value, float):
        return _go_float(value)
    return str(value)


def _go_float(value: float) -> str:
    if math.isfinite(value) and value == int(value) and abs(value) < 1e21:
        return str(int(value))
    return repr(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --------------------------------------------------------------------------- value kinds


class _Kind:
    """How one type of option is read from a flag and a config file, shown and rendered."""

    __slots__ = ()
    type_name = "value"  # the word after the flag name in --help
    bool_flag = False  # takes no separate argument: --flag alone means true
    repeatable = False  # each use adds to the list instead of replacing it

    def from_flag(self, text: str) -> Any:
        raise NotImplementedError

    def from_config(self, value: Any) -> Any:
        raise NotImplementedError

    def to_json(self, value: Any) -> Any:
        return value

    def help_default(self, value: Any) -> str | None:
        """The ``(default ...)`` text, or None where Go leaves the zero value unmentioned."""
        return None


class _String(_Kind):
    __slots__ = ()
    type_name = "string"

    def from_flag(self, text: str) -> str:
        return text

    def from_config(self, value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError("expected a string")
        return value

    def help_default(self, value: str) -> str | None:
        return _go_quote(value) if value else None


class _Int(_Kind):
    __slots__ = ()
    type_name = "int"

    def from_flag(self, text: str) -> int:
        return _parse_go_int(text)

    def from_config(self, value: Any) -> int:
        if isinstance(value, str) and _DECIMAL_INT.match(value):
            value = int(value)
        if not _is_int(value):
            raise ValueError("expected an integer")
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError("value out of range")
        return value

    def help_default(self, value: int) -> str | None:
        return str(value) if value else None


class _Bool(_Kind):
    __slots__ = ()
    type_name = ""
    bool_flag = True

    def from_flag(self, text: str) -> bool:
        return _parse_go_bool(text)

    def from_config(self, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str):
            return _parse_go_bool(value)
        raise ValueError("expected true or false")

    def help_default(self, value: bool) -> str | None:
        return "true" if value else None


class _Duration(_Kind):
    __slots__ = ()
    type_name = "duration"

    def from_flag(self, text: str) -> float:
        return to_seconds(parse_duration(text))

    def from_config(self, value: Any) -> float:
        if isinstance(value, str):
            return to_seconds(parse_duration(value))
        if _is_int(value):
            # go-options reads a bare integer duration as milliseconds
            return value / 1000
        raise ValueError('expected a duration string such as "2s", or integer milliseconds')

    def to_json(self, value: float) -> int:
        return to_ns(value)

    def help_default(self, value: float) -> str | None:
        return format_duration(to_ns(value)) if value else None


class _StringList(_Kind):
    __slots__ = ()
    repeatable = True

    def from_flag(self, text: str) -> tuple[str, ...]:
        return (text,)

    def from_config(self, value: Any) -> tuple[str, ...]:
        if isinstance(value, str):
            return tuple(item.strip() for item in value.split(",") if item.strip())
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            return tuple(value)
        raise ValueError("expected a list of strings")

    def to_json(self, value: tuple[str, ...]) -> list[str]:
        return list(value)

    def help_default(self, value: tuple[str, ...]) -> str | None:
        return ",".join(value) if value else None


class _FloatList(_Kind):
    __slots__ = ()
    repeatable = True

    @staticmethod
    def _split(text: str) -> tuple[float, ...]:
        items = []
        for part in text.split(","):
            try:
                items.append(float(part.strip()))
            except ValueError:
                raise ValueError(f"could not parse {part!r}") from None
        return tuple(items)

    def from_flag(self, text: str) -> tuple[float, ...]:
        return self._split(text)

    def from_config(self, value: Any) -> tuple[float, ...]:
        if isinstance(value, str):
            return self._split(value)
        if isinstance(value, list) and all(
            isinstance(item, (int, float)) and not isinstance(item, bool) for item in value
        ):
            return tuple(float(item) for item in value)
        raise ValueError("expected a list of numbers")

    def to_json(self, value: tuple[float, ...]) -> list[float]:
        return list(value)


class _LogLevel(_Kind):
    __slots__ = ()
    _labels = {"debug": "DEBUG", "info": "INFO", "warn": "WARNING", "error": "ERROR", "fatal": "FATAL"}

    def from_flag(self, text: str) -> str:
        level = text.lower()
        if level not in LOG_LEVELS:
            raise ValueError(f"invalid log level '{text}' (debug, info, warn, error, fatal)")
        return level

    def from_config(self, value: Any) -> str:
        return self.from_flag(_go_value(value))

    def to_json(self, value: str) -> int:
        return log_level_number(value)

    def help_default(self, value: str) -> str | None:
        return self._labels[value]


class _TlsRequired(_Kind):
    __slots__ = ()
    type_name = ""
    bool_flag = True

    def from_flag(self, text: str) -> int:
        if text.lower() == "tcp-https":
            return TLS_REQUIRED_EXCEPT_HTTP
        try:
            return TLS_REQUIRED if _parse_go_bool(text.lower()) else TLS_NOT_REQUIRED
        except ValueError:
            raise ValueError("must be true, false or tcp-https") from None

    def from_config(self, value: Any) -> int:
        return self.from_flag(_go_value(value))

    def help_default(self, value: int) -> str | None:
        return str(value) if value else None


class _TlsMinVersion(_Kind):
    __slots__ = ()

    def from_flag(self, text: str) -> str:
        version = text.lower()
        if version == "":
            # nsqd leaves the default in place for an empty value
            return "tls1.0"
        if version not in TLS_VERSIONS:
            raise ValueError(f"unknown tlsVersionOption {_go_quote(text)}")
        return version

    def from_config(self, value: Any) -> str:
        return self.from_flag(_go_value(value))

    def to_json(self, value: str) -> int:
        return TLS_VERSIONS[value]

    def help_default(self, value: str) -> str | None:
        return value


_STRING, _INT, _BOOL, _DURATION = _String(), _Int(), _Bool(), _Duration()
_STRINGS, _FLOATS = _StringList(), _FloatList()
_LOG_LEVEL, _TLS_REQUIRED_KIND, _TLS_MIN_VERSION = _LogLevel(), _TlsRequired(), _TlsMinVersion()


# --------------------------------------------------------------------------- the options


@dataclass(frozen=True, slots=True)
class _Flag:
    """One command line flag: its kind, nsqd's help text, the Options attribute and config key.

    ``bound`` is ``">=0"`` or ``">0"`` for numbers that must not be negative or zero.
    """

    name: str
    kind: _Kind
    usage: str
    attr: str | None = None
    cfg: str | None = None
    bound: str | None = None


def _option(default: Any, kind: _Kind, flag: str, usage: str, *, cfg: str | None = None,
            bound: str | None = None, factory: Any = None) -> Any:
    meta = {"flag": (kind, flag, usage, cfg, bound)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _hostname() -> str:
    return socket.gethostname()


def default_node_id(hostname: str | None = None) -> int:
    """nsqd's default ``--node-id``: crc32 (IEEE) of the md5 digest of the hostname, mod 1024."""
    name = _hostname() if hostname is None else hostname
    return zlib.crc32(hashlib.md5(name.encode()).digest()) % 1024


@dataclass(frozen=True, slots=True)
class Options:
    """Every nsqd 1.3.0 option plus pynsqd's own, validated and immutable.

    Field names are nsqd's config-file names (``mem_queue_size``), except ``node_id``
    (config key ``id``). Durations are float seconds, sizes and counts ints, lists tuples.
    Fields with no flag (``client_timeout``, ``queue_scan_interval``, ...) are nsqd's
    internal options with nsqd's values. Construction validates and raises
    :class:`OptionsError`; ``dataclasses.replace`` does the same, which is how a running
    broker derives changed options (``PUT /config/log_level``).
    """

    # basic options
    node_id: int = _option(
        0, _INT, "node-id",
        "unique part for message IDs, (int) in range [0,1024) (default is hash of hostname)",
        cfg="id", factory=default_node_id,
    )
    log_level: str = _option(
        "info", _LOG_LEVEL, "log-level",
        "set log verbosity: debug, info, warn, error, or fatal",
    )
    log_prefix: str = _option("[nsqd] ", _STRING, "log-prefix", "log message prefix")

    tcp_address: str = _option(
        "127.0.0.1:4150", _STRING, "tcp-address",
        "<addr>:<port> (for TCP/IP) or <path> (for unix socket) to listen on for TCP clients",
    )
    http_address: str = _option(
        "127.0.0.1:4151", _STRING, "http-address",
        "<addr>:<port> (for TCP/IP) or <path> (for unix socket) to listen on for HTTP clients",
    )
    https_address: str = _option(
        "127.0.0.1:4152", _STRING, "https-address",
        "<addr>:<port> to listen on for HTTPS clients",
    )
    broadcast_address: str = _option(
        "", _STRING, "broadcast-address",
        "address that will be registered with lookupd (defaults to the OS hostname)",
        factory=_hostname,
    )
    broadcast_tcp_port: int = _option(
        0, _INT, "broadcast-tcp-port",
        "TCP port that will be registered with lookupd (defaults to the TCP port that this nsqd "
        "is listening on)",
        bound=">=0",
    )
    broadcast_http_port: int = _option(
        0, _INT, "broadcast-http-port",
        "HTTP port that will be registered with lookupd (defaults to the HTTP port that this "
        "nsqd is listening on)",
        bound=">=0",
    )
    nsqlookupd_tcp_addresses: tuple[str, ...] = _option(
        (), _STRINGS, "lookupd-tcp-address",
        "lookupd TCP address (may be given multiple times)",
        cfg="nsqlookupd_tcp_addresses",
    )
    auth_http_addresses: tuple[str, ...] = _option(
        (), _STRINGS, "auth-http-address",
        "<addr>:<port> or a full url to query auth server (may be given multiple times)",
        cfg="auth_http_addresses",
    )
    http_client_connect_timeout: float = _option(
        2.0, _DURATION, "http-client-connect-timeout",
        "timeout for HTTP connect",
        bound=">=0",
    )
    http_client_request_timeout: float = _option(
        5.0, _DURATION, "http-client-request-timeout",
        "timeout for HTTP request",
        bound=">=0",
    )

    # diskqueue options
    data_path: str = _option("", _STRING, "data-path", "path to store disk-backed messages")
    mem_queue_size: int = _option(
        10000, _INT, "mem-queue-size",
        "number of messages to keep in memory (per topic/channel)",
        bound=">=0",
    )
    max_bytes_per_file: int = _option(
        104857600, _INT, "max-bytes-per-file",
        "number of bytes per diskqueue file before rolling",
        bound=">0",
    )
    sync_every: int = _option(
        2500, _INT, "sync-every",
        "number of messages per diskqueue fsync",
        bound=">0",
    )
    sync_timeout: float = _option(
        2.0, _DURATION, "sync-timeout",
        "duration of time per diskqueue fsync",
        bound=">0",
    )

    queue_scan_interval: float = 0.1
    queue_scan_refresh_interval: float = 5.0
    queue_scan_selection_count: int = _option(
        20, _INT, "queue-scan-selection-count",
        "number of channels to check per cycle (every 100ms) for in-flight and deferred timeouts",
        bound=">0",
    )
    queue_scan_worker_pool_max: int = _option(
        4, _INT, "queue-scan-worker-pool-max",
        "max concurrency for checking in-flight and deferred message timeouts",
        bound=">0",
    )
    queue_scan_dirty_percent: float = 0.25

    # msg and command options
    msg_timeout: float = _option(
        60.0, _DURATION, "msg-timeout",
        "default duration to wait before auto-requeing a message",
        bound=">0",
    )
    max_msg_timeout: float = _option(
        900.0, _DURATION, "max-msg-timeout",
        "maximum duration before a message will timeout",
        bound=">0",
    )
    max_msg_size: int = _option(
        1048576, _INT, "max-msg-size",
        "maximum size of a single message in bytes",
        bound=">0",
    )
    max_body_size: int = _option(
        5242880, _INT, "max-body-size",
        "maximum size of a single command body",
        bound=">0",
    )
    max_req_timeout: float = _option(
        3600.0, _DURATION, "max-req-timeout",
        "maximum requeuing timeout for a message",
        bound=">=0",
    )
    client_timeout: float = 60.0

    # client overridable configuration options
    max_heartbeat_interval: float = _option(
        60.0, _DURATION, "max-heartbeat-interval",
        "maximum client configurable duration of time between client heartbeats",
        bound=">0",
    )
    max_rdy_count: int = _option(
        2500, _INT, "max-rdy-count",
        "maximum RDY count for a client",
        bound=">0",
    )
    max_output_buffer_size: int = _option(
        65536, _INT, "max-output-buffer-size",
        "maximum client configurable size (in bytes) for a client output buffer",
        bound=">0",
    )
    max_output_buffer_timeout: float = _option(
        30.0, _DURATION, "max-output-buffer-timeout",
        "maximum client configurable duration of time between flushing to a client",
        bound=">=0",
    )
    min_output_buffer_timeout: float = _option(
        0.025, _DURATION, "min-output-buffer-timeout",
        "minimum client configurable duration of time between flushing to a client",
        bound=">=0",
    )
    output_buffer_timeout: float = _option(
        0.25, _DURATION, "output-buffer-timeout",
        "default duration of time between flushing data to clients",
        bound=">=0",
    )
    max_channel_consumers: int = _option(
        0, _INT, "max-channel-consumers",
        "maximum channel consumer connection count per nsqd instance (default 0, i.e., unlimited)",
        bound=">=0",
    )

    # statsd integration
    statsd_address: str = _option(
        "", _STRING, "statsd-address",
        "UDP <addr>:<port> of a statsd daemon for pushing stats",
    )
    statsd_prefix: str = _option(
        "nsq.%s", _STRING, "statsd-prefix",
        "prefix used for keys sent to statsd (%s for host replacement)",
    )
    statsd_interval: float = _option(
        60.0, _DURATION, "statsd-interval",
        "duration between pushing to statsd",
        bound=">0",
    )
    statsd_mem_stats: bool = _option(
        True, _BOOL, "statsd-mem-stats",
        "toggle sending memory and GC stats to statsd",
    )
    statsd_udp_packet_size: int = _option(
        508, _INT, "statsd-udp-packet-size",
        "the size in bytes of statsd UDP packets",
        bound=">0",
    )
    statsd_exclude_ephemeral: bool = _option(
        False, _BOOL, "statsd-exclude-ephemeral",
        "Skip ephemeral topics and channels when sending stats to statsd",
    )

    # e2e message latency
    e2e_processing_latency_window_time: float = _option(
        600.0, _DURATION, "e2e-processing-latency-window-time",
        "calculate end to end latency quantiles for this duration of time (ie: 60s would only "
        "show quantile calculations from the past 60 seconds)",
        bound=">0",
    )
    e2e_processing_latency_percentiles: tuple[float, ...] = _option(
        (), _FLOATS, "e2e-processing-latency-percentile",
        "message processing time percentiles (as float (0, 1.0]) to track (can be specified "
        "multiple times or comma separated '1.0,0.99,0.95', default none)",
        cfg="e2e_processing_latency_percentiles",
    )

    # TLS config
    tls_cert: str = _option("", _STRING, "tls-cert", "path to certificate file")
    tls_key: str = _option("", _STRING, "tls-key", "path to key file")
    tls_client_auth_policy: str = _option(
        "", _STRING, "tls-client-auth-policy",
        "client certificate auth policy ('require' or 'require-verify')",
    )
    tls_root_ca_file: str = _option(
        "", _STRING, "tls-root-ca-file",
        "path to certificate authority file",
    )
    tls_required: int = _option(
        TLS_NOT_REQUIRED, _TLS_REQUIRED_KIND, "tls-required",
        "require TLS for client connections (true, false, tcp-https)",
    )
    tls_min_version: str = _option(
        "tls1.0", _TLS_MIN_VERSION, "tls-min-version",
        "minimum SSL/TLS version acceptable ('ssl3.0', 'tls1.0', 'tls1.1', 'tls1.2' or 'tls1.3')",
    )

    # compression
    deflate: bool = _option(
        True, _BOOL, "deflate",
        "enable deflate feature negotiation (client compression)",
    )
    max_deflate_level: int = _option(
        6, _INT, "max-deflate-level",
        "max deflate compression level a client can negotiate (> values == > nsqd CPU usage)",
    )
    snappy: bool = _option(
        True, _BOOL, "snappy",
        "enable snappy feature negotiation (client compression)",
    )

    # pynsqd's own
    durable: bool = _option(
        False, _BOOL, "durable",
        "acknowledge a publish only after it is fsynced, and keep delivered messages on disk "
        "until they are finished (a crash re-delivers instead of losing)",
    )
    max_attempts: int = _option(
        0, _INT, "max-attempts",
        "default number of delivery attempts after which a channel moves a message to its "
        "dead-letter set (0 = never)",
        bound=">=0",
    )

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # the dataclass is frozen; normalise in place once
        for name in ("nsqlookupd_tcp_addresses", "auth_http_addresses"):
            set_(self, name, tuple(getattr(self, name)))
        set_(self, "e2e_processing_latency_percentiles",
             tuple(float(v) for v in self.e2e_processing_latency_percentiles))
        set_(self, "log_level", str(self.log_level).lower())
        set_(self, "tls_min_version", str(self.tls_min_version).lower())
        if self.tls_client_auth_policy and self.tls_required == TLS_NOT_REQUIRED:
            # nsqd: asking for client certificates implies TLS is required
            set_(self, "tls_required", TLS_REQUIRED)
        _validate(self)

    def data_dir(self) -> str:
        """The directory for data files: ``data_path``, or the current directory if empty."""
        return self.data_path or os.getcwd()


def _collect_flags() -> tuple[_Flag, ...]:
    flags = [
        _Flag("version", _BOOL, "print version string"),
        _Flag("config", _STRING, "path to config file"),
        _Flag("verbose", _BOOL, "[deprecated] has no effect, use --log-level"),
        _Flag("worker-id", _BOOL, "[deprecated] use --node-id"),
    ]
    for item in dataclasses.fields(Options):
        if "flag" in item.metadata:
            kind, name, usage, cfg, bound = item.metadata["flag"]
            flags.append(_Flag(name, kind, usage, item.name, cfg or name.replace("-", "_"), bound))
    return tuple(sorted(flags, key=lambda flag: flag.name))


_FLAGS = _collect_flags()
_FLAGS_BY_NAME = {flag.name: flag for flag in _FLAGS}
_FLAGS_BY_CONFIG = {flag.cfg: flag for flag in _FLAGS if flag.cfg}
# node_id is accepted as a spelling of nsqd's ``id`` key, matching the field name.
_CONFIG_ALIASES = {"node_id": "id"}

CONFIG_NAMES: tuple[str, ...] = tuple(sorted(_FLAGS_BY_CONFIG))
"""Every config-file key (and ``GET /config/:opt`` name) pynsqd knows."""


def _validate(options: Options) -> None:
    for flag in _FLAGS:
        if flag.attr is None or flag.bound is None:
            continue
        value = getattr(options, flag.attr)
        if flag.bound == ">0" and not value > 0:
            raise OptionsError(f"--{flag.name} must be > 0")
        if flag.bound == ">=0" and not value >= 0:
            raise OptionsError(f"--{flag.name} must be >= 0")
    for name in ("broadcast_tcp_port", "broadcast_http_port"):
        if getattr(options, name) > _MAX_PORT:
            raise OptionsError(f"--{name.replace('_', '-')} must be [0,{_MAX_PORT}]")
    if options.log_level not in LOG_LEVELS:
        raise OptionsError(f"invalid log level '{options.log_level}' (debug, info, warn, error, fatal)")
    if options.max_deflate_level < 1 or options.max_deflate_level > 9:
        raise OptionsError("--max-deflate-level must be [1,9]")
    if options.node_id < 0 or options.node_id >= 1024:
        raise OptionsError("--node-id must be [0,1024)")
    if options.tls_min_version not in TLS_VERSIONS:
        raise OptionsError(f"unknown tlsVersionOption {_go_quote(options.tls_min_version)}")
    if options.tls_required not in (TLS_NOT_REQUIRED, TLS_REQUIRED_EXCEPT_HTTP, TLS_REQUIRED):
        raise OptionsError("--tls-required must be true, false or tcp-https")
    if options.tls_client_auth_policy not in _TLS_CLIENT_AUTH_POLICIES:
        raise OptionsError("--tls-client-auth-policy must be 'require' or 'require-verify'")
    if bool(options.tls_cert) != bool(options.tls_key):
        raise OptionsError("failed to build TLS config - --tls-cert and --tls-key must be given together")
    if options.tls_required != TLS_NOT_REQUIRED and not options.tls_cert:
        raise OptionsError("cannot require TLS client connections without TLS key and cert")
    for value in options.e2e_processing_latency_percentiles:
        if not 0 < value <= 1:
            raise OptionsError(f"invalid E2E processing latency percentile: {_go_float(value)}")


# --------------------------------------------------------------------------- parsing


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
        flag = _FLAGS_BY_NAME.get(name)
        if flag is None:
            if name in ("h", "help"):
                raise InfoRequest(help_text())
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
            raise OptionsError(f"invalid {what} {_go_quote(text)} for {flag_word}-{name}: {err}") from None
        if flag.kind.repeatable:
            given[name] = given.get(name, ()) + value
        else:
            given[name] = value
    return given


def load_config(path: str) -> dict[str, Any]:
    """Read a TOML config file into a dict; :class:`OptionsError` if it cannot be read or parsed."""
    try:
        with open(path, "rb") as stream:
            return tomllib.load(stream)
    except OSError as err:
        reason = err.strerror or str(err)
        reason = reason[:1].lower() + reason[1:]
        raise OptionsError(f"failed to load config file {path} - open {path}: {reason}") from None
    except tomllib.TOMLDecodeError as err:
        raise OptionsError(f"failed to load config file {path} - {err}") from None


def _resolve_config(path: str, config: dict[str, Any]) -> dict[str, Any]:
    """Config file values by field name, coerced; unknown keys are logged and skipped."""
    config = dict(config)
    for alias, name in _CONFIG_ALIASES.items():
        if alias in config:
            if name in config:
                raise OptionsError(f"config file {path} sets both {name} and {alias}")
            config[name] = config.pop(alias)
    resolved: dict[str, Any] = {}
    for key, value in config.items():
        flag = _FLAGS_BY_CONFIG.get(key)
        if flag is None:
            log.warning("config file %s: ignoring unknown option %r", path, key)
            continue
        try:
            resolved[flag.attr] = flag.kind.from_config(value)
        except ValueError as err:
            raise OptionsError(f"failed parsing {key} {_go_value(value)} - {err}") from None
    return resolved


def parse_args(argv: Sequence[str]) -> Options:
    """Parse nsqd's command line (and the ``--config`` file it names) into :class:`Options`.

    A flag on the command line beats the config file, which beats the default. Raises
    :class:`InfoRequest` for ``--help``/``-h`` and ``--version``, and :class:`OptionsError`
    for an unknown flag, a bad value, an unreadable config file or options that do not go
    together.
    """
    given = _read_command_line(argv)
    if given.get("version"):
        raise InfoRequest(VERSION_TEXT)
    values: dict[str, Any] = {}
    config_path = given.get("config", "")
    if config_path:
        values.update(_resolve_config(config_path, load_config(config_path)))
    for name, value in given.items():
        flag = _FLAGS_BY_NAME[name]
        if flag.attr is None:
            continue
        if flag.kind is _FLOATS:
            # nsqd's percentile flag keeps its list sorted, highest first
            value = tuple(sorted(value, reverse=True))
        values[flag.attr] = value
    return Options(**values)


# --------------------------------------------------------------------------- rendering


def get_config_value(options: Options, name: str) -> Any:
    """The JSON value nsqd's ``GET /config/:opt`` returns for config name ``name``.

    Durations are integer nanoseconds, lists are lists, ``log_level`` is nsqd's level number
    (2 = info), ``tls_required`` 0/1/2 and ``tls_min_version`` the protocol number (0x0301
    for tls1.0). Raises ``KeyError`` for a name nsqd's ``/config`` would answer with
    ``INVALID_OPTION``.
    """
    flag = _FLAGS_BY_CONFIG.get(_CONFIG_ALIASES.get(name, name))
    if flag is None:
        raise KeyError(name)
    return flag.kind.to_json(getattr(options, flag.attr))


def help_text() -> str:
    """``--help`` output: every flag with nsqd's help text and pynsqd's default, Go style."""
    defaults = Options()
    lines = ["Usage of pynsqd:"]
    for flag in _FLAGS:
        head = f"  -{flag.name}"
        if flag.kind.type_name:
            head = f"{head} {flag.kind.type_name}"
        usage = flag.usage
        if flag.attr is not None:
            shown = flag.kind.help_default(getattr(defaults, flag.attr))
            if shown is not None:
                usage = f"{usage} (default {shown})"
        lines.append(head)
        lines.append(f"    \t{usage}")
    lines.append("")
    lines.append("pynsqd bench [flags] runs the benchmark client instead; see pynsqd bench -help.")
    return "\n".join(lines)
