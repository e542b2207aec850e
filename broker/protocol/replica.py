"""pynsqd's node-to-node role (``--replicas``): what a V2 connection between two nodes adds.

A node opens an ordinary V2 connection to a peer's TCP port. Before the peer treats it as a
node, both prove that they hold the cluster's secret (``--replication-secret-file``), which
never crosses the wire; what IDENTIFY carries (nsqd ignores these keys, and a client that
does not send them sees nothing new):

=====  ===============================================  =====================================
step   connecting node A                                accepting node B answers
=====  ===============================================  =====================================
1      IDENTIFY ``replica`` A, ``replica_nonce`` Na,     when Ad is B's own address:
       ``replica_address`` Ad (the address A dialled,   ``replica`` B, ``replica_nonce`` Nb,
       as nsqlookupd lists B)                           ``replica_proof`` :func:`proof` (B,
                                                        ``ACCEPTOR``); nothing else changes
(TLS)  the TLS upgrade IDENTIFY agreed, the peer's       (the ordinary upgrade)
       certificate verified
2      IDENTIFY ``replica`` A, ``replica_proof``         ``replica`` B when the proof holds:
       :func:`proof` (A, ``CONNECTOR``)                  from now on the connection is node A's
=====  ===============================================  =====================================

A proof is an HMAC-SHA256 under the secret of both nonces, both node ids, the address dialled
and the prover's role, so it is good for one connection only (a fresh nonce each side), cannot
be reflected (the roles differ), cannot be relayed by a third party that the connecting node
dialled (its address is not the accepting node's, which checks it) and says nothing of the
secret. A node without a secret uses the empty
one: the handshake runs, and proves nothing (the node warns at start).

On a proven connection, and only there, the connecting node may send::

    REPL\\n[4-byte size][body]

where the body is a msgpack document (see :mod:`broker.replication.wire`). Each ``REPL``
gets one response frame, whose data is a msgpack answer. Anywhere else ``REPL`` is what
nsqd says of any unknown command, ``E_INVALID invalid command REPL``.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
from typing import NamedTuple

__all__ = ["REPLICA_IDENTIFY_FIELD", "REPLICA_NONCE_FIELD", "REPLICA_PROOF_FIELD", "REPLICA_ADDRESS_FIELD",
           "ACCEPTOR", "CONNECTOR",
           "Repl", "Challenge", "encode_repl", "is_valid_node_id", "is_valid_nonce", "new_nonce", "proof",
           "proof_holds"]

REPLICA_IDENTIFY_FIELD = "replica"
REPLICA_NONCE_FIELD = "replica_nonce"
REPLICA_PROOF_FIELD = "replica_proof"
REPLICA_ADDRESS_FIELD = "replica_address"
#: The roles a proof is made for: the node that accepted the connection, the one that opened it.
ACCEPTOR, CONNECTOR = b"accepting", b"connecting"
_SIZE = struct.Struct(">I")
_NODE_ID_LENGTH = 32
_NONCE_BYTES = 32
_HEX = frozenset("0123456789abcdef")


class Repl(NamedTuple):
    """``REPL`` with its body, on a connection proven to come from a node of the cluster."""

    body: bytes


class Challenge(NamedTuple):
    """What the accepting side of a connection remembers between the two IDENTIFYs: who the
    connecting node says it is, its nonce, the nonce sent back and the address it dialled."""

    peer: str
    peer_nonce: str
    nonce: str
    address: str


def encode_repl(body: bytes) -> bytes:
    """The ``REPL`` command carrying ``body``."""
    return b"REPL\n" + _SIZE.pack(len(body)) + body


def is_valid_node_id(value: object) -> bool:
    """A node id is 32 lowercase hex digits (a random 128-bit number, kept in the data directory)."""
    return isinstance(value, str) and len(value) == _NODE_ID_LENGTH and _HEX.issuperset(value)


def is_valid_nonce(value: object) -> bool:
    """A nonce is 64 lowercase hex digits (256 random bits)."""
    return isinstance(value, str) and len(value) == 2 * _NONCE_BYTES and _HEX.issuperset(value)


def new_nonce() -> str:
    """A fresh nonce for one handshake."""
    return secrets.token_hex(_NONCE_BYTES)


def proof(secret: bytes, role: bytes, own_nonce: str, their_nonce: str, prover: str, verifier: str,
          address: str) -> str:
    """The proof that ``prover``, in ``role``, holds ``secret``, for the handshake whose nonces
    are ``own_nonce`` (the prover's) and ``their_nonce`` (the verifier's), on a connection to
    ``address`` (``host:port`` of the accepting node, as dialled)."""
    text = b"\0".join((b"pynsqd replica", role, own_nonce.encode(), their_nonce.encode(), prover.encode(),
                       verifier.encode(), address.encode("utf-8", "surrogateescape")))
    return hmac.new(secret, text, hashlib.sha256).hexdigest()


def proof_holds(given: object, secret: bytes, role: bytes, own_nonce: str, their_nonce: str, prover: str,
                verifier: str, address: str) -> bool:
    """Whether ``given`` is :func:`proof` of the same (compared in constant time)."""
    if not isinstance(given, str):
        return False
    expected = proof(secret, role, own_nonce, their_nonce, prover, verifier, address)
    return hmac.compare_digest(given.encode("ascii", "replace"), expected.encode())
