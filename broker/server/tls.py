"""TLS contexts built from nsqd's ``--tls-*`` options, as nsqd's ``buildTLSConfig`` builds them.

The server context serves the TCP upgrade (IDENTIFY ``tls_v1``) and the HTTPS listener;
the client context is used for HTTPS auth servers. Python's ``ssl`` cannot ask for a
client certificate without verifying it, so ``--tls-client-auth-policy=require`` (Go's
``RequireAnyClientCert``) is checked as ``require-verify`` is: against
``--tls-root-ca-file``, or the system's certificate authorities without one.
"""

from __future__ import annotations

import os
import ssl
import warnings
from typing import TYPE_CHECKING, Any

from diskqueue import os_error_reason

if TYPE_CHECKING:
    from broker.config.schema import Options

__all__ = ["TLSConfigError", "server_context", "client_context", "peer_context", "describe_session"]

# --tls-min-version names; OpenSSL has no SSL 3.0 any more, so ssl3.0 means "the oldest it has".
_MIN_VERSIONS = {
    "ssl3.0": ssl.TLSVersion.MINIMUM_SUPPORTED,
    "tls1.0": ssl.TLSVersion.TLSv1,
    "tls1.1": ssl.TLSVersion.TLSv1_1,
    "tls1.2": ssl.TLSVersion.TLSv1_2,
    "tls1.3": ssl.TLSVersion.TLSv1_3,
}

#: ``tls_version`` in ``/stats``, in Go's ``prettyConnectionState`` wording.
_VERSION_NAMES = {"TLSv1": "TLS1.0", "TLSv1.1": "TLS1.1", "TLSv1.2": "TLS1.2", "TLSv1.3": "TLS1.3"}


class TLSConfigError(ValueError):
    """The certificate, key or CA file cannot be used; the message is nsqd's
    ``failed to build TLS config - <cause>``."""


def _set_min_version(context: ssl.SSLContext, name: str) -> None:
    with warnings.catch_warnings():
        # Python deprecates TLS 1.0 and 1.1, but they are nsqd's choice to offer (tls1.0 is its default)
        warnings.simplefilter("ignore", DeprecationWarning)
        context.minimum_version = _MIN_VERSIONS[name]


def server_context(options: Options) -> ssl.SSLContext | None:
    """The server-side context, or None when ``--tls-cert``/``--tls-key`` are not given.

    Raises :class:`TLSConfigError` when a file cannot be read or does not hold what it should.
    """
    if not options.tls_cert and not options.tls_key:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _set_min_version(context, options.tls_min_version)
    try:
        _readable(options.tls_cert, options.tls_key, options.tls_root_ca_file)
        context.load_cert_chain(options.tls_cert, options.tls_key)
        if options.tls_client_auth_policy:
            context.verify_mode = ssl.CERT_REQUIRED
            if options.tls_root_ca_file:
                context.load_verify_locations(cafile=options.tls_root_ca_file)
            else:
                context.load_default_certs(ssl.Purpose.CLIENT_AUTH)
        elif options.tls_root_ca_file:
            # nsqd reads the file (and fails on a bad one) even when it asks for no client certificate
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=options.tls_root_ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise TLSConfigError(f"failed to build TLS config - {exc}") from exc
    return context


def _readable(*paths: str) -> None:
    """Open each given file as Go reads it first: a missing or unreadable one raises ``OSError``
    worded as Go's (``open c.pem: no such file or directory``), which ``ssl`` does not name."""
    for path in paths:
        if not path:
            continue
        try:
            os.close(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
        except OSError as exc:
            raise OSError(f"open {path}: {os_error_reason(exc)}") from None


def client_context(options: Options) -> ssl.SSLContext:
    """The context for HTTPS requests to auth servers: ``--tls-root-ca-file`` or the system's CAs.

    Raises :class:`TLSConfigError` for an unreadable CA file (nsqd's ``failed to build client
    TLS config``).
    """
    context = ssl.create_default_context()
    _set_min_version(context, options.tls_min_version)
    if options.tls_root_ca_file:
        try:
            _readable(options.tls_root_ca_file)
            context.load_verify_locations(cafile=options.tls_root_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise TLSConfigError(f"failed to build client TLS config - {exc}") from exc
    return context


def peer_context(options: Options) -> ssl.SSLContext | None:
    """The context of this node's links to its peers (``--replicas``), or None without
    ``--tls-cert``: a peer's certificate is verified against ``--tls-root-ca-file`` (or the
    system's certificate authorities), its name against the address the lookupds give, and
    this node presents its own certificate to peers that ask for one.

    Raises :class:`TLSConfigError` for files that cannot be used.
    """
    if not options.tls_cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    _set_min_version(context, options.tls_min_version)
    try:
        _readable(options.tls_cert, options.tls_key, options.tls_root_ca_file)
        if options.tls_root_ca_file:
            context.load_verify_locations(cafile=options.tls_root_ca_file)
        context.load_cert_chain(options.tls_cert, options.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise TLSConfigError(f"failed to build TLS config - {exc}") from exc
    return context


def describe_session(session: Any) -> tuple[str, str, str]:
    """``(tls_version, tls_cipher_suite, common_name)`` of an established session (an
    ``ssl.SSLObject`` or a ``trio.SSLStream``, which exposes its methods), for ``/stats`` and
    the auth server's ``common_name``; the common name is "" without a client certificate.
    The cipher suite is OpenSSL's name for it."""
    version = session.version() or ""
    cipher = session.cipher()
    common_name = ""
    peer = session.getpeercert()
    if peer:
        for rdn in peer.get("subject", ()):
            for key, value in rdn:
                if key == "commonName":
                    common_name = value
    return _VERSION_NAMES.get(version, version), cipher[0] if cipher else "", common_name
