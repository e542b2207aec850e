"""``--statsd-prefix`` as nsqd expands it at start (apart from the push, which a start
without ``--statsd-address`` does not load: ``GET /config/statsd_prefix`` shows the
expanded prefix whether or not anything is pushed, as nsqd's does)."""

from __future__ import annotations

__all__ = ["host_key", "statsd_prefix"]


def host_key(host_port: str) -> str:
    """nsqd's ``statsd.HostKey``: ``.`` and ``:`` become ``_`` (``127.0.0.1:4151`` -> ``127_0_0_1_4151``)."""
    return host_port.replace(".", "_").replace(":", "_")


def statsd_prefix(template: str, broadcast_address: str, http_port: int) -> str:
    """``--statsd-prefix`` as nsqd expands it once at start.

    Every ``%s`` becomes the host key of ``<broadcast address>:<HTTP port>`` (an IPv6
    address in brackets, as Go's ``net.JoinHostPort`` writes it), and a ``.`` is appended
    unless the result ends in one. An empty template stays empty: names then have no prefix.
    """
    if not template:
        return ""
    host = f"[{broadcast_address}]" if ":" in broadcast_address else broadcast_address
    prefix = template.replace("%s", host_key(f"{host}:{http_port}"))
    return prefix if prefix.endswith(".") else prefix + "."
