"""IDENTIFY applied to a V2 connection: nsqd's checks, what a client may set, and the answer.

The parser (:mod:`broker.protocol`) has already checked the body's field types; here the
values are checked against nsqd's ranges (a fatal ``E_BAD_BODY`` with nsqd's wording),
applied to the :class:`~broker.server.client.Client`, and answered: ``OK``, or with
``feature_negotiation`` the JSON of what was agreed, in nsqd's key order, pynsqd's
extensions (lease, keyed publishes, the node-to-node role, priorities) only for a client
that asked for them. TLS and compression agreed here are performed by the connection's
writer after the answer (:mod:`broker.server.upgrade`).

Plain functions: the command handler (:mod:`broker.server.handlers`) calls :func:`identify`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from broker.config.options import NSQD_COMPAT_VERSION
from broker.protocol import ProtocolError
from broker.protocol.keys import DEDUP_WINDOW_FIELD, KEYS_IDENTIFY_FIELD
from broker.protocol.lease import LEASE_IDENTIFY_FIELD, is_valid_lease_token
from broker.protocol.priorities import DEFAULT_PRIORITY_FIELD, PRIORITIES_IDENTIFY_FIELD
from broker.server.transport import Upgrade

if TYPE_CHECKING:
    from broker.server.client import Client
    from broker.server.compression import Codec

__all__ = ["identify", "MIN_OUTPUT_BUFFER_SIZE", "DEFAULT_DEFLATE_LEVEL"]

#: The least output buffer size IDENTIFY may set (nsqd's).
MIN_OUTPUT_BUFFER_SIZE = 64
#: nsqd's deflate level when IDENTIFY asks for deflate without a level.
DEFAULT_DEFLATE_LEVEL = 6


def _seconds(data: dict, key: str, low: float, high: float, what: str, *, can_disable: bool = True) -> float | None:
    """An IDENTIFY duration (milliseconds) in seconds, checked against ``low``..``high`` seconds.

    None when absent or 0 (keep the default); 0.0 for -1 (turned off) where
    ``can_disable``; otherwise a fatal ``E_BAD_BODY`` naming ``what``.
    """
    value = data.get(key) or 0
    if value == 0:
        return None
    if value == -1 and can_disable:
        return 0.0
    if low * 1000 <= value <= high * 1000:
        return value / 1000
    raise ProtocolError("E_BAD_BODY", f"IDENTIFY {what} ({value}) is invalid")


def identify(client: Client, data: dict) -> bytes:
    """Apply an IDENTIFY body to ``client``; returns the response payload.

    Raises fatal ``E_BAD_BODY`` errors with nsqd's wording for out-of-range values, and
    ``E_IDENTIFY_FAILED`` for both deflate and snappy.
    """
    opts = client.options
    client.client_id = data.get("client_id") or ""
    client.hostname = data.get("hostname") or ""
    client.user_agent = data.get("user_agent") or ""

    heartbeat = _seconds(data, "heartbeat_interval", 1.0, opts.max_heartbeat_interval, "heartbeat interval")
    if heartbeat is not None:
        client.heartbeat_interval = heartbeat

    timeout = _seconds(data, "output_buffer_timeout", opts.min_output_buffer_timeout, opts.max_output_buffer_timeout,
                       "output buffer timeout")
    if timeout is not None:
        client.output_buffer_timeout = timeout
    size = data.get("output_buffer_size") or 0
    if size == -1:
        client.output_buffer_size = 1
        client.output_buffer_timeout = 0.0
    elif size == 0:
        pass
    elif MIN_OUTPUT_BUFFER_SIZE <= size <= opts.max_output_buffer_size:
        client.output_buffer_size = size
    else:
        raise ProtocolError("E_BAD_BODY", f"IDENTIFY output buffer size ({size}) is invalid")

    sample_rate = data.get("sample_rate") or 0
    if not 0 <= sample_rate <= 99:
        raise ProtocolError("E_BAD_BODY", f"IDENTIFY sample rate ({sample_rate}) is invalid")
    client.sample_rate = sample_rate

    msg_timeout = _seconds(data, "msg_timeout", 1.0, opts.max_msg_timeout, "msg timeout", can_disable=False)
    if msg_timeout is not None:
        client.msg_timeout = msg_timeout

    lease = data.get(LEASE_IDENTIFY_FIELD)
    if lease is not None:
        if not is_valid_lease_token(lease):
            raise ProtocolError("E_BAD_BODY", f"IDENTIFY lease ({json.dumps(lease)}) is invalid")
        client.lease = lease
    if data.get(KEYS_IDENTIFY_FIELD):
        client.publish_keys = True
    if data.get(PRIORITIES_IDENTIFY_FIELD):
        client.priorities = True
    client.peer.identify(data, client.remote_address, client)

    client.feature_negotiation = bool(data.get("feature_negotiation"))
    client.wake_timers()
    if not client.feature_negotiation:
        return b"OK"
    transport = client.transport
    tls = transport.ssl_context is not None and bool(data.get("tls_v1"))
    deflate = opts.deflate and bool(data.get("deflate"))
    deflate_level = DEFAULT_DEFLATE_LEVEL
    if deflate and (data.get("deflate_level") or 0) > 0:
        deflate_level = data["deflate_level"]
    deflate_level = min(deflate_level, opts.max_deflate_level)
    snappy = opts.snappy and bool(data.get("snappy"))
    if deflate and snappy:
        raise ProtocolError("E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression")
    response = _answer(client, tls, deflate, deflate_level, snappy)
    if tls or deflate or snappy:
        # loaded by the first client that upgrades: a start does not pay for compression
        from broker.server.compression import DeflateCodec, SnappyCodec

        codec: Codec | None = DeflateCodec(deflate_level) if deflate else SnappyCodec() if snappy else None
        transport.upgrade = Upgrade(tls, codec)
        client.stop_plain_writes()
    return response


def _answer(client: Client, tls: bool, deflate: bool, deflate_level: int, snappy: bool) -> bytes:
    """The feature-negotiation JSON, in nsqd's key order, with what was agreed."""
    opts = client.options
    answer = {
        "max_rdy_count": opts.max_rdy_count,
        "version": NSQD_COMPAT_VERSION,
        "max_msg_timeout": int(opts.max_msg_timeout * 1000),
        "msg_timeout": int(client.msg_timeout * 1000),
        "tls_v1": tls,
        "deflate": deflate,
        "deflate_level": min(deflate_level, opts.max_deflate_level),
        "max_deflate_level": opts.max_deflate_level,
        "snappy": snappy,
        "sample_rate": client.sample_rate,
        "auth_required": bool(opts.auth_http_addresses),
        "output_buffer_size": client.output_buffer_size,
        "output_buffer_timeout": int(client.output_buffer_timeout * 1000),
    }
    if client.lease is not None:  # only a client that asked learns of the extension
        answer[LEASE_IDENTIFY_FIELD] = client.lease
    if client.publish_keys:  # the same for keyed publishes
        answer[KEYS_IDENTIFY_FIELD] = True
        answer[DEDUP_WINDOW_FIELD] = round(opts.dedup_window * 1000)
    client.peer.answer(answer)
    if client.priorities:
        answer[PRIORITIES_IDENTIFY_FIELD] = True
        answer[DEFAULT_PRIORITY_FIELD] = opts.default_priority
    return json.dumps(answer, separators=(",", ":")).encode()
