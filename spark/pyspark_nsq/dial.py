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

__all__ = ["dial", "CONNECT_TIMEOUT_S", "NsqError", "USER_AGENT"]

USER_AGENT = f"pyspark_nsq/{__version__}"


def dial(address: Address, identify: dict[str, Any]) -> FramePump:
    """Connect to ``address`` and IDENTIFY with ``identify``; the caller owns the pump.

    Raises :class:`NsqError` when the connection or IDENTIFY fails.
    """
    return connect(address, identify, user_agent=USER_AGENT, port_option="the nsqd option")
