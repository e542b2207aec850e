"""Opening a connection to nsqd: TCP connect, the V2 magic and IDENTIFY.

This client speaks plain V2: it does not upgrade to TLS or compression, so an
IDENTIFY that asks for them is refused before anything is sent rather than left to
garble the stream.
"""

from __future__ import annotations

import json
import socket
from typing import Any

from broker.protocol import MAGIC_V2, encode_identify

from .address import Address
from .errors import NsqError
from .pump import RESPONSE_TIMEOUT_S, FramePump

__all__ = ["connect", "CONNECT_TIMEOUT_S"]

#: How long opening a connection (TCP connect, IDENTIFY) may take.
CONNECT_TIMEOUT_S = 10.0
#: Upgrades this client does not implement.
_UNSUPPORTED_IDENTIFY = ("tls_v1", "snappy", "deflate")


def connect(address: Address, identify: dict[str, Any], *, user_agent: str, client_id: str | None = None,
            port_option: str = "the address", error: type[NsqError] = NsqError,
            send_timeout: float = RESPONSE_TIMEOUT_S) -> FramePump:
    """Connect to ``address``, send the magic and IDENTIFY with ``identify``.

    ``client_id`` defaults to the host name; ``feature_negotiation`` is asked for, so
    the pump's ``identity`` holds nsqd's answer (empty when nsqd answered a plain
    ``OK``). ``port_option`` names the setting that holds the address, for the error
    raised when an HTTP server answers. The caller owns the pump and must close it.

    Raises ``error`` when the connection or IDENTIFY fails (``E_CONNECTION`` when the
    address cannot be reached, ``E_HTTP_PORT`` when it is an HTTP port), ValueError
    when ``identify`` asks for TLS or compression.
    """
    for key in _UNSUPPORTED_IDENTIFY:
        if identify.get(key):
            raise ValueError(f"IDENTIFY {key} is not supported by this client")
    try:
        sock = socket.create_connection((address.host, address.port), CONNECT_TIMEOUT_S)
    except OSError as exc:
        raise error(address, "E_CONNECTION", f"cannot connect: {exc}") from exc
    hint = f"answered in HTTP: this is the HTTP port; {port_option} wants the TCP port (4150 by default)"
    pump = FramePump(sock, address, http_hint=hint, error=error, send_timeout=send_timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        hostname = socket.gethostname()
        params = {
            "client_id": client_id or hostname,
            "hostname": hostname,
            "user_agent": user_agent,
            "feature_negotiation": True,
            **identify,
        }
        pump.send(MAGIC_V2 + encode_identify(params))
        answer = pump.read_response(CONNECT_TIMEOUT_S)
        if answer != b"OK":
            pump.identity = json.loads(answer)
    except BaseException:
        pump.close()
        raise
    return pump
