"""The checks every :class:`~broker.config.schema.Options` passes on construction.

Messages are nsqd's where nsqd has one (``--node-id must be [0,1024)``), so scripts that
match nsqd's startup errors match ours.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from broker.config.errors import OptionsError
from broker.config.flag import Flag, declared_flag
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

if TYPE_CHECKING:
    from broker.config.schema import Options

__all__ = ["validate"]

_MAX_PORT = 65535


def _bounded_flags(options: Options) -> list[Flag]:
    # In flag name order, as --help lists them: the first broken bound is the one reported.
    flags = (declared_flag(item) for item in dataclasses.fields(options))
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
    if options.max_attempts > MAX_ATTEMPTS:
        raise OptionsError(f"--max-attempts must be [0,{MAX_ATTEMPTS}]")
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
        raise OptionsError(f"unknown tlsVersionOption {go_quote_str(options.tls_min_version)}")
    if options.tls_required not in (TLS_NOT_REQUIRED, TLS_REQUIRED_EXCEPT_HTTP, TLS_REQUIRED):
        raise OptionsError("--tls-required must be true, false or tcp-https")
    if options.tls_client_auth_policy not in TLS_CLIENT_AUTH_POLICIES:
        raise OptionsError("--tls-client-auth-policy must be 'require' or 'require-verify'")
    if bool(options.tls_cert) != bool(options.tls_key):
        raise OptionsError("failed to build TLS config - --tls-cert and --tls-key must be given together")
    if options.tls_required != TLS_NOT_REQUIRED and not options.tls_cert:
        raise OptionsError("cannot require TLS client connections without TLS key and cert")
    for value in options.e2e_processing_latency_percentiles:
        if not 0 < value <= 1:
            raise OptionsError(f"invalid E2E processing latency percentile: {format_float_v(value)}")
