"""pynsqd's node-to-node role (``--replicas``): what a V2 connection between two nodes adds.

A node opens an ordinary V2 connection to a peer's TCP port and names itself in IDENTIFY
with ``"replica": "<node id>"``; a peer that replicates answers with its own id under the
same key (nsqd ignores the key, and a client that does not send it sees nothing new). On
such a connection, and only there, the connecting node may send::

    REPL\\n[4-byte size][body]

where the body is a msgpack document (see :mod:`broker.replication.wire`). Each ``REPL``
gets one response frame, whose data is a msgpack answer. Anywhere else ``REPL`` is what
nsqd says of any unknown command, ``E_INVALID invalid command REPL``.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

__all__ = ["REPLICA_IDENTIFY_FIELD", "Repl", "encode_repl", "is_valid_node_id"]

REPLICA_IDENTIFY_FIELD = "replica"
_SIZE = struct.Struct(">I")
_NODE_ID_LENGTH = 32


class Repl(NamedTuple):
    """``REPL`` with its body, on a connection that negotiated the replica role."""

    body: bytes


def encode_repl(body: bytes) -> bytes:
    """The ``REPL`` command carrying ``body``."""
    return b"REPL\n" + _SIZE.pack(len(body)) + body


def is_valid_node_id(value: object) -> bool:
    """A node id is 32 lowercase hex digits (a random 128-bit number, kept in the data directory)."""
    return (isinstance(value, str) and len(value) == _NODE_ID_LENGTH
            and all(c in "0123456789abcdef" for c in value))
