"""The TLS settings' values: ``--tls-required`` levels and ``--tls-min-version`` names."""

from __future__ import annotations

__all__ = [
    "TLS_NOT_REQUIRED",
    "TLS_REQUIRED_EXCEPT_HTTP",
    "TLS_REQUIRED",
    "TLS_VERSIONS",
    "TLS_CLIENT_AUTH_POLICIES",
]

# --tls-required values, with nsqd's numbers (what GET /config/tls_required returns).
TLS_NOT_REQUIRED = 0
TLS_REQUIRED_EXCEPT_HTTP = 1
TLS_REQUIRED = 2

#: --tls-min-version names and the protocol numbers GET /config/tls_min_version returns.
TLS_VERSIONS = {"ssl3.0": 0x0300, "tls1.0": 0x0301, "tls1.1": 0x0302, "tls1.2": 0x0303, "tls1.3": 0x0304}

#: --tls-client-auth-policy values ("" asks for no client certificate).
TLS_CLIENT_AUTH_POLICIES = ("", "require", "require-verify")
