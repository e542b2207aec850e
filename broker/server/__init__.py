"""The TCP side of the broker: listeners, V2 connections and their command handlers.

:mod:`broker.server.net` holds what the TCP and HTTP servers share (listen
addresses, the accept loop); :mod:`broker.server.tcp` the V2 server,
:mod:`broker.server.client` one client's state and output (its transport in
:mod:`broker.server.transport`, IDENTIFY in :mod:`broker.server.identify`, the node-to-node
role in :mod:`broker.server.peer`), and :mod:`broker.server.handlers` the handler of each
wire command.
"""

from broker.server.client import Client
from broker.server.net import (
    Address,
    Addresses,
    ConnectionServer,
    bound_address,
    describe_address,
    open_listeners,
    peer_address,
)
from broker.server.tcp import TCPServer

__all__ = [
    "Address",
    "Addresses",
    "Client",
    "ConnectionServer",
    "TCPServer",
    "bound_address",
    "describe_address",
    "open_listeners",
    "peer_address",
]
