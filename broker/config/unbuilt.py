"""The nsqd options pynsqd accepts but does not act on yet, in one table.

nsqd's command lines and config files must keep working, so pynsqd accepts every nsqd
flag; the ones whose feature it lacks are listed in :data:`UNBUILT`, which ``--help``
(:mod:`broker.config.help`) and the start-up warnings (:func:`unbuilt_warnings`) read.
Building a feature means removing its rows. ``--tls-required`` is not a row: it cannot be
ignored safely, so :func:`refuse_unbuilt` refuses to start with it instead (and with
``--tls-client-auth-policy``, which implies it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from broker.config.errors import OptionsError
from broker.config.flag_table import FLAGS
from broker.config.schema import Options
from broker.config.tls import TLS_NOT_REQUIRED, TLS_REQUIRED_EXCEPT_HTTP
from broker.gocompat import format_duration, to_ns

__all__ = ["Unbuilt", "UNBUILT", "UNBUILT_BY_FLAG", "TLS_REQUIRED_HELP_NOTE", "unbuilt_warnings",
           "refuse_unbuilt"]


@dataclass(frozen=True, slots=True)
class Unbuilt:
    """One accepted option whose feature pynsqd lacks.

    ``flag`` is the flag name; ``reason`` starts the warning (what pynsqd does not do),
    ``instead`` ends it (what happens instead, or ""); ``help_note`` is added to the flag's
    ``--help`` text. ``warns`` is False for options whose default already asks for the
    missing feature (deflate, snappy): clients negotiate those per connection and are
    told no, so a warning on every start would say nothing new. It is also False for
    ``--tls-client-auth-policy``, which implies ``--tls-required`` and so is refused.
    """

    flag: str
    reason: str
    instead: str = ""
    help_note: str = "not built in pynsqd: ignored"
    warns: bool = True


_STATSD = "pynsqd does not push stats to statsd"
_STATSD_INSTEAD = "scrape GET /metrics or read GET /stats instead"
_TLS = "pynsqd has no TLS yet"
_TLS_INSTEAD = "clients connect without TLS"
_DEFLATE = "pynsqd has no deflate compression yet"

#: Every option pynsqd accepts but does not act on, by flag name (the order of ``--help``).
UNBUILT: tuple[Unbuilt, ...] = (
    Unbuilt("auth-http-address", "pynsqd has no authorization yet",
            "every client may publish and subscribe without AUTH"),
    Unbuilt("deflate", _DEFLATE, help_note="not built in pynsqd: always answered false", warns=False),
    Unbuilt("https-address", "pynsqd has no HTTPS listener yet", "nothing listens there",
            help_note="not built in pynsqd: nothing listens there"),
    Unbuilt("max-deflate-level", _DEFLATE, "IDENTIFY answers deflate false"),
    Unbuilt("snappy", "pynsqd has no snappy compression yet",
            help_note="not built in pynsqd: always answered false", warns=False),
    Unbuilt("statsd-address", _STATSD, _STATSD_INSTEAD),
    Unbuilt("statsd-exclude-ephemeral", _STATSD, _STATSD_INSTEAD),
    Unbuilt("statsd-interval", _STATSD, _STATSD_INSTEAD),
    Unbuilt("statsd-mem-stats", _STATSD, _STATSD_INSTEAD),
    Unbuilt("statsd-prefix", _STATSD, _STATSD_INSTEAD),
    Unbuilt("statsd-udp-packet-size", _STATSD, _STATSD_INSTEAD),
    Unbuilt("tls-cert", _TLS, _TLS_INSTEAD),
    Unbuilt("tls-client-auth-policy", _TLS, help_note="not built in pynsqd: refused at start", warns=False),
    Unbuilt("tls-key", _TLS, _TLS_INSTEAD),
    Unbuilt("tls-min-version", _TLS, _TLS_INSTEAD),
    Unbuilt("tls-root-ca-file", _TLS, _TLS_INSTEAD),
)
UNBUILT_BY_FLAG = {row.flag: row for row in UNBUILT}

#: ``--help``'s note for ``--tls-required``, which :func:`refuse_unbuilt` handles.
TLS_REQUIRED_HELP_NOTE = "not built in pynsqd: true and tcp-https are refused at start"

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


def refuse_unbuilt(options: Options) -> None:
    """Raise :class:`OptionsError` for options pynsqd cannot honour by ignoring them.

    ``--tls-required`` (true or tcp-https) promises that no client talks in plain text;
    without TLS the broker could only refuse every client, so it refuses to start. (Without
    ``--tls-cert`` and ``--tls-key`` nsqd's own message has already been raised by
    validation.)
    """
    if options.tls_required == TLS_NOT_REQUIRED:
        return
    if options.tls_client_auth_policy:
        raise OptionsError(
            f"{_TLS}, so it cannot check client certificates: remove "
            f"--tls-client-auth-policy={options.tls_client_auth_policy} (it implies --tls-required=true)"
        )
    shown = "tcp-https" if options.tls_required == TLS_REQUIRED_EXCEPT_HTTP else "true"
    raise OptionsError(
        f"{_TLS}, so it cannot require TLS client connections: remove --tls-required={shown} "
        "(or set it to false)"
    )
