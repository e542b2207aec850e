"""The :class:`Options` dataclass: nsqd 1.3.0's options and pynsqd's own, as one declarative table.

Each field declares its default, its flag (:func:`~broker.config.flag.option`: the value kind,
nsqd's help text, the config file key, a bound), so the command line, the config file,
``--help`` and ``GET /config/:opt`` all read the same table (:mod:`broker.config.flag_table`).

Where pynsqd's defaults differ from nsqd's on purpose: the listeners bind ``127.0.0.1`` rather
than every interface (pass ``--tcp-address=0.0.0.0:4150`` and ``--http-address=0.0.0.0:4151``
to serve other hosts). ``data_path`` ``""`` means the current directory, as in nsqd.
"""

from __future__ import annotations

import hashlib
import os
import socket
import zlib
from dataclasses import dataclass, fields

from broker.config.errors import InstantiateError, OptionsError
from broker.config.flag import Flag, declared_flag, option
from broker.config.kinds import (
    BOOL,
    DURATION,
    FLOATS,
    INT,
    LOG_LEVEL,
    STRING,
    STRINGS,
    TLS_MIN_VERSION,
    TLS_REQUIRED_KIND,
)
from broker.config.log import LOG_LEVELS
from broker.config.tls import (
    TLS_CLIENT_AUTH_POLICIES,
    TLS_NOT_REQUIRED,
    TLS_REQUIRED,
    TLS_REQUIRED_EXCEPT_HTTP,
    TLS_VERSIONS,
)
from broker.gocompat import format_float_v, go_quote_str
from broker.protocol import MAX_ATTEMPTS

__all__ = ["Options", "default_node_id", "validate"]


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
    node_id: int = option(
        0, INT, "node-id",
        "unique part for message IDs, (int) in range [0,1024) (default is hash of hostname)",
        cfg="id", factory=default_node_id,
    )
    log_level: str = option(
        "info", LOG_LEVEL, "log-level",
        "set log verbosity: debug, info, warn, error, or fatal",
    )
    log_prefix: str = option("[nsqd] ", STRING, "log-prefix", "log message prefix")

    tcp_address: str = option(
        "127.0.0.1:4150", STRING, "tcp-address",
        "<addr>:<port> (for TCP/IP) or <path> (for unix socket) to listen on for TCP clients",
    )
    http_address: str = option(
        "127.0.0.1:4151", STRING, "http-address",
        "<addr>:<port> (for TCP/IP) or <path> (for unix socket) to listen on for HTTP clients",
    )
    https_address: str = option(
        "127.0.0.1:4152", STRING, "https-address",
        "<addr>:<port> to listen on for HTTPS clients",
    )
    broadcast_address: str = option(
        "", STRING, "broadcast-address",
        "address that will be registered with lookupd (defaults to the OS hostname)",
        factory=_hostname,
    )
    broadcast_tcp_port: int = option(
        0, INT, "broadcast-tcp-port",
        "TCP port that will be registered with lookupd (defaults to the TCP port that this nsqd "
        "is listening on)",
        bound=">=0",
    )
    broadcast_http_port: int = option(
        0, INT, "broadcast-http-port",
        "HTTP port that will be registered with lookupd (defaults to the HTTP port that this "
        "nsqd is listening on)",
        bound=">=0",
    )
    nsqlookupd_tcp_addresses: tuple[str, ...] = option(
        (), STRINGS, "lookupd-tcp-address",
        "lookupd TCP address (may be given multiple times)",
        cfg="nsqlookupd_tcp_addresses",
    )
    auth_http_addresses: tuple[str, ...] = option(
        (), STRINGS, "auth-http-address",
        "<addr>:<port> or a full url to query auth server (may be given multiple times)",
        cfg="auth_http_addresses",
    )
    http_client_connect_timeout: float = option(
        2.0, DURATION, "http-client-connect-timeout",
        "timeout for HTTP connect",
        bound=">=0",
    )
    http_client_request_timeout: float = option(
        5.0, DURATION, "http-client-request-timeout",
        "timeout for HTTP request",
        bound=">=0",
    )

    # diskqueue options
    data_path: str = option("", STRING, "data-path", "path to store disk-backed messages")
    mem_queue_size: int = option(
        10000, INT, "mem-queue-size",
        "number of messages to keep in memory (per topic/channel)",
        bound=">=0",
    )
    max_bytes_per_file: int = option(
        104857600, INT, "max-bytes-per-file",
        "number of bytes per diskqueue file before rolling",
        bound=">0",
    )
    sync_every: int = option(
        2500, INT, "sync-every",
        "number of messages per diskqueue fsync",
        bound=">0",
    )
    sync_timeout: float = option(
        2.0, DURATION, "sync-timeout",
        "duration of time per diskqueue fsync",
        bound=">0",
    )

    queue_scan_interval: float = 0.1
    queue_scan_refresh_interval: float = 5.0
    queue_scan_selection_count: int = option(
        20, INT, "queue-scan-selection-count",
        "number of channels to check per cycle (every 100ms) for in-flight and deferred timeouts",
        bound=">0",
    )
    queue_scan_worker_pool_max: int = option(
        4, INT, "queue-scan-worker-pool-max",
        "max concurrency for checking in-flight and deferred message timeouts",
        bound=">0",
    )
    queue_scan_dirty_percent: float = 0.25

    # msg and command options
    msg_timeout: float = option(
        60.0, DURATION, "msg-timeout",
        "default duration to wait before auto-requeing a message",
        bound=">0",
    )
    max_msg_timeout: float = option(
        900.0, DURATION, "max-msg-timeout",
        "maximum duration before a message will timeout",
        bound=">0",
    )
    max_msg_size: int = option(
        1048576, INT, "max-msg-size",
        "maximum size of a single message in bytes",
        bound=">0",
    )
    max_body_size: int = option(
        5242880, INT, "max-body-size",
        "maximum size of a single command body",
        bound=">0",
    )
    max_req_timeout: float = option(
        3600.0, DURATION, "max-req-timeout",
        "maximum requeuing timeout for a message",
        bound=">=0",
    )
    client_timeout: float = 60.0

    # client overridable configuration options
    max_heartbeat_interval: float = option(
        60.0, DURATION, "max-heartbeat-interval",
        "maximum client configurable duration of time between client heartbeats",
        bound=">0",
    )
    max_rdy_count: int = option(
        2500, INT, "max-rdy-count",
        "maximum RDY count for a client",
        bound=">0",
    )
    max_output_buffer_size: int = option(
        65536, INT, "max-output-buffer-size",
        "maximum client configurable size (in bytes) for a client output buffer",
        bound=">0",
    )
    max_output_buffer_timeout: float = option(
        30.0, DURATION, "max-output-buffer-timeout",
        "maximum client configurable duration of time between flushing to a client",
        bound=">=0",
    )
    min_output_buffer_timeout: float = option(
        0.025, DURATION, "min-output-buffer-timeout",
        "minimum client configurable duration of time between flushing to a client",
        bound=">=0",
    )
    output_buffer_timeout: float = option(
        0.25, DURATION, "output-buffer-timeout",
        "default duration of time between flushing data to clients",
        bound=">=0",
    )
    max_channel_consumers: int = option(
        0, INT, "max-channel-consumers",
        "maximum channel consumer connection count per nsqd instance (default 0, i.e., unlimited)",
        bound=">=0",
    )

    # statsd integration
    statsd_address: str = option(
        "", STRING, "statsd-address",
        "UDP <addr>:<port> of a statsd daemon for pushing stats",
    )
    statsd_prefix: str = option(
        "nsq.%s", STRING, "statsd-prefix",
        "prefix used for keys sent to statsd (%s for host replacement)",
    )
    statsd_interval: float = option(
        60.0, DURATION, "statsd-interval",
        "duration between pushing to statsd",
        bound=">0",
    )
    statsd_mem_stats: bool = option(
        True, BOOL, "statsd-mem-stats",
        "toggle sending memory and GC stats to statsd",
    )
    statsd_udp_packet_size: int = option(
        508, INT, "statsd-udp-packet-size",
        "the size in bytes of statsd UDP packets",
    )
    statsd_exclude_ephemeral: bool = option(
        False, BOOL, "statsd-exclude-ephemeral",
        "Skip ephemeral topics and channels when sending stats to statsd",
    )

    # e2e message latency
    e2e_processing_latency_window_time: float = option(
        600.0, DURATION, "e2e-processing-latency-window-time",
        "calculate end to end latency quantiles for this duration of time (ie: 60s would only "
        "show quantile calculations from the past 60 seconds)",
        bound=">0",
    )
    e2e_processing_latency_percentiles: tuple[float, ...] = option(
        (), FLOATS, "e2e-processing-latency-percentile",
        "message processing time percentiles (as float (0, 1.0]) to track (can be specified "
        "multiple times or comma separated '1.0,0.99,0.95', default none)",
        cfg="e2e_processing_latency_percentiles",
    )

    # TLS config
    tls_cert: str = option("", STRING, "tls-cert", "path to certificate file")
    tls_key: str = option("", STRING, "tls-key", "path to key file")
    tls_client_auth_policy: str = option(
        "", STRING, "tls-client-auth-policy",
        "client certificate auth policy ('require' or 'require-verify')",
    )
    tls_root_ca_file: str = option(
        "", STRING, "tls-root-ca-file",
        "path to certificate authority file",
    )
    tls_required: int = option(
        TLS_NOT_REQUIRED, TLS_REQUIRED_KIND, "tls-required",
        "require TLS for client connections (true, false, tcp-https)",
    )
    tls_min_version: str = option(
        "tls1.0", TLS_MIN_VERSION, "tls-min-version",
        "minimum SSL/TLS version acceptable ('ssl3.0', 'tls1.0', 'tls1.1', 'tls1.2' or 'tls1.3')",
    )

    # compression
    deflate: bool = option(
        True, BOOL, "deflate",
        "enable deflate feature negotiation (client compression)",
    )
    max_deflate_level: int = option(
        6, INT, "max-deflate-level",
        "max deflate compression level a client can negotiate (> values == > nsqd CPU usage)",
    )
    snappy: bool = option(
        True, BOOL, "snappy",
        "enable snappy feature negotiation (client compression)",
    )

    # pynsqd's own
    durable: bool = option(
        False, BOOL, "durable",
        "acknowledge a publish only after it is fsynced, and keep delivered messages on disk "
        "until they are finished (a crash re-delivers instead of losing)",
    )
    max_attempts: int = option(
        0, INT, "max-attempts",
        "default number of delivery attempts after which a channel moves a message to its "
        "dead-letter set (0 = never)",
        bound=">=0",
    )

    dedup_window: float = option(
        600.0, DURATION, "dedup-window",
        "how long a topic remembers the key of a keyed publish: a publish of the same key to "
        "the same topic within it is a duplicate and is not stored (0 = keys are not remembered)",
        bound=">=0",
    )
    dedup_max_keys: int = option(
        1000000, INT, "dedup-max-keys",
        "most publish keys remembered, over all topics; past it the oldest are forgotten "
        "before their window ends",
        bound=">0",
    )

    default_priority: int = option(
        1 << 31, INT, "default-priority",
        "priority of a message published without one (0 = most urgent ... 4294967295); "
        "a topic delivers in priority order once a message with another priority is published to it",
        bound=">=0",
    )

    replicas: int = option(
        1, INT, "replicas",
        "nodes that hold each message before a publish is acknowledged: this one and replicas-1 "
        "peers registered with the same nsqlookupd (1 = no copies)",
        bound=">0",
    )
    replica_timeout: float = option(
        5.0, DURATION, "replica-timeout",
        "how long a node may be unreachable before a holder of its copies takes them over, "
        "and how long a publish waits for its copies",
        bound=">0",
    )
    replication_secret_file: str = option(
        "", STRING, "replication-secret-file",
        "path to a file holding the cluster's secret: a node proves it holds it before its peers "
        "let it keep, drop or take over copies (every node needs the same; empty = any client "
        "can pass for a node)",
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
        validate(self)

    def data_dir(self) -> str:
        """The directory for data files: ``data_path``, or the current directory if empty."""
        return self.data_path or os.getcwd()


# ---------------------------------------------------------------- the checks every Options passes
# Messages are nsqd's where nsqd has one (``--node-id must be [0,1024)``), so scripts that
# match nsqd's startup errors match ours.

_MAX_PORT = 65535


def _bounded_flags(options: Options) -> list[Flag]:
    # In flag name order, as --help lists them: the first broken bound is the one reported.
    flags = (declared_flag(item) for item in fields(options))
    return sorted((flag for flag in flags if flag is not None and flag.bound is not None), key=lambda f: f.name)


def validate(options: Options) -> None:
    """Raise :class:`OptionsError` for the first option out of range or combination that cannot work."""
    for flag in _bounded_flags(options):
        assert flag.attr is not None
        value = getattr(options, flag.attr)
        if flag.bound == ">0" and not value > 0:
            raise OptionsError(f"--{flag.name} must be > 0")
        if flag.bound == ">=0" and not value >= 0:
            raise OptionsError(f"--{flag.name} must be >= 0")
    if options.default_priority > (1 << 32) - 1:
        raise OptionsError("--default-priority must be [0,4294967295]")
    if options.max_attempts > MAX_ATTEMPTS:
        raise OptionsError(f"--max-attempts must be [0,{MAX_ATTEMPTS}]")
    for name in ("broadcast_tcp_port", "broadcast_http_port"):
        if getattr(options, name) > _MAX_PORT:
            raise OptionsError(f"--{name.replace('_', '-')} must be [0,{_MAX_PORT}]")
    if options.log_level not in LOG_LEVELS:
        raise OptionsError(f"invalid log level '{options.log_level}' (debug, info, warn, error, fatal)")
    if options.max_deflate_level < 1 or options.max_deflate_level > 9:
        raise InstantiateError("--max-deflate-level must be [1,9]")
    if options.node_id < 0 or options.node_id >= 1024:
        raise InstantiateError("--node-id must be [0,1024)")
    if options.tls_min_version not in TLS_VERSIONS:
        raise OptionsError(f"unknown tlsVersionOption {go_quote_str(options.tls_min_version)}")
    if options.tls_required not in (TLS_NOT_REQUIRED, TLS_REQUIRED_EXCEPT_HTTP, TLS_REQUIRED):
        raise OptionsError("--tls-required must be true, false or tcp-https")
    if bool(options.tls_cert) != bool(options.tls_key):
        raise InstantiateError("failed to build TLS config - --tls-cert and --tls-key must be given together")
    if options.tls_required != TLS_NOT_REQUIRED and not options.tls_cert:
        raise InstantiateError("cannot require TLS client connections without TLS key and cert")
    if options.tls_client_auth_policy not in TLS_CLIENT_AUTH_POLICIES:  # nsqd ignores any other policy
        raise OptionsError("--tls-client-auth-policy must be 'require' or 'require-verify'")
    for value in options.e2e_processing_latency_percentiles:
        if not 0 < value <= 1:
            raise InstantiateError(f"invalid E2E processing latency percentile: {format_float_v(value)}")
