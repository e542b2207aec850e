"""How the connector connects to one nsqd: the shared client's handshake, in its own name.

:func:`dial` opens a :class:`~broker.client.FramePump` (TCP, the V2 magic, IDENTIFY)
that names the connector in its user agent and, when the address turns out to be an
HTTP port, says which option to correct. What to send is up to the publisher, the
subscriptions and the lease readers built on top.
"""

from __future__ import annotations

from typing import Any

from broker.client import CONNECT_TIMEOUT_S, FramePump, NsqError, connect

from .options import Address
from .version import __version__

__all__ = ["dial", "client_name", "CONNECT_TIMEOUT_S", "NsqError", "USER_AGENT", "MAX_CLIENT_ID"]

USER_AGENT = f"pyspark_nsq/{__version__}"
#: The longest ``client_id`` the connector sends. nsqd bounds an IDENTIFY only by its
#: ``--max-body-size``; this keeps a name readable in a ``/stats`` table or a metric label.
MAX_CLIENT_ID = 64


def client_name(*parts: object) -> str:
    """A connection's ``client_id``: ``parts`` joined by spaces, cut to MAX_CLIENT_ID characters.

    Executors share a host name and the user agent, so the name is what tells their
    connections apart in nsqd's ``/stats`` (``read 3f2a9c1b0d4e batch 7 partition 1``).
    """
    return " ".join(str(part) for part in parts)[:MAX_CLIENT_ID]


def dial(address: Address, identify: dict[str, Any], client_id: str | None = None) -> FramePump:
    """Connect to ``address`` and IDENTIFY with ``identify`` as ``client_id`` (default: the
    host name); the caller owns the pump.

    Raises :class:`NsqError` when the connection or IDENTIFY fails.
    """
    return connect(address, identify, user_agent=USER_AGENT, client_id=client_id, port_option="the nsqd option")
