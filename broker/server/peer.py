"""A V2 connection from another node of the cluster: the node-to-node role and its handshake.

A node connects to its peers' TCP ports and names itself in IDENTIFY
(:mod:`broker.protocol.replica`). The first IDENTIFY naming a node is challenged; the
connection becomes that node's (``REPL`` is a command) only when a later IDENTIFY proves it
holds the cluster's secret. Until then nothing changes: ``REPL`` stays an unknown command.
:class:`ReplicaReceiver` is the node's replication as the TCP server sees it;
:class:`PeerRole` is one connection's part in the handshake.

Plain functions of the IDENTIFY body: :mod:`broker.server.client` applies them while it
applies an IDENTIFY; the replication (:mod:`broker.replication`) implements the receiver.
"""

from __future__ import annotations

import json
from typing import Protocol

from broker.core.maybe import Maybe
from broker.protocol import ProtocolError
from broker.protocol.replica import (
    REPLICA_ADDRESS_FIELD,
    REPLICA_IDENTIFY_FIELD,
    REPLICA_NONCE_FIELD,
    REPLICA_PROOF_FIELD,
    Challenge,
    is_valid_node_id,
    is_valid_nonce,
)

__all__ = ["PeerConnection", "PeerRole", "ReplicaReceiver"]


class PeerConnection(Protocol):
    """A connection of a peer node, as the replication sees it."""

    #: when it last received bytes (trio time)
    last_read: float


class ReplicaReceiver(Protocol):
    """The node's replication as its TCP server sees it (:mod:`broker.replication`): the
    connections of peer nodes (the node-to-node role, :mod:`broker.protocol.replica`) open,
    send ``REPL`` bodies, and close."""

    node_id: str

    def challenge(self, peer: str, peer_nonce: str, address: str, remote: str) -> Challenge | None:
        """The challenge for a connecting node that dialled ``address``; None (logged and
        counted) when that is not this node's address, or the node is not ready."""
        ...

    def accepting_proof(self, challenge: Challenge) -> str:
        """This node's proof, for the answer to the connecting node's first IDENTIFY."""
        ...

    def proven(self, challenge: Challenge | None, peer: str, given: object, remote: str) -> bool:
        """Whether ``given`` proves that the connecting node ``peer`` holds the cluster's secret,
        in answer to ``challenge`` (None: none was made); a failure is logged and counted."""
        ...

    def opened(self, peer: str, link: PeerConnection) -> None: ...

    def receive(self, peer: str, body: bytes) -> Maybe[bytes]: ...

    def closed(self, peer: str, link: PeerConnection, last_heard: float) -> None:
        """The connection ended; ``last_heard``: when it last received bytes (trio time)."""
        ...


class PeerRole:
    """One connection's part in the node-to-node role: the node's replication (``replicas``,
    None: it does not replicate), the peer node proven to be at the other end (``node``, None:
    a client), and the challenge made and not yet answered."""

    __slots__ = ("replicas", "node", "challenge", "challenge_issued")

    def __init__(self, replicas: ReplicaReceiver | None = None):
        self.replicas = replicas
        self.node: str | None = None
        #: the handshake's first step was answered and waits for the proof (None: no handshake)
        self.challenge: Challenge | None = None
        self.challenge_issued = False  # the IDENTIFY being answered began a handshake

    def identify(self, data: dict, remote: str, link: PeerConnection) -> None:
        """Take an IDENTIFY body's part in the handshake, from ``remote``: challenge a node that
        names itself, or grant the role to one that proves it (``link``, its connection, is
        then opened to the replication). Raises a fatal ``E_BAD_BODY`` for a malformed step."""
        self.challenge_issued = False
        replicas = self.replicas
        replica = data.get(REPLICA_IDENTIFY_FIELD)
        if replica is None or replicas is None or self.node is not None:
            return
        given, nonce = data.get(REPLICA_PROOF_FIELD), data.get(REPLICA_NONCE_FIELD)
        if given is None and nonce is None:
            return  # no handshake asked for: the key alone is ignored, as nsqd ignores it
        if not is_valid_node_id(replica) or replica == replicas.node_id:
            raise ProtocolError("E_BAD_BODY", f"IDENTIFY replica ({json.dumps(replica)}) is invalid")
        challenge, self.challenge = self.challenge, None  # one answer per challenge
        if given is not None:
            if replicas.proven(challenge, replica, given, remote):
                self.node = replica
                replicas.opened(replica, link)
            return
        if not is_valid_nonce(nonce):
            raise ProtocolError("E_BAD_BODY", f"IDENTIFY replica_nonce ({json.dumps(nonce)}) is invalid")
        address = data.get(REPLICA_ADDRESS_FIELD)
        if not isinstance(address, str):
            raise ProtocolError("E_BAD_BODY", f"IDENTIFY replica_address ({json.dumps(address)}) is invalid")
        self.challenge = replicas.challenge(replica, str(nonce), address, remote)
        self.challenge_issued = self.challenge is not None

    def answer(self, answer: dict) -> None:
        """Add this node's part to the feature-negotiation answer: its name to a proven peer or
        one just challenged, with the challenge and this node's proof to the latter."""
        replicas = self.replicas
        if replicas is not None and (self.node is not None or self.challenge_issued):
            answer[REPLICA_IDENTIFY_FIELD] = replicas.node_id
            if self.challenge_issued and self.challenge is not None:
                answer[REPLICA_NONCE_FIELD] = self.challenge.nonce
                answer[REPLICA_PROOF_FIELD] = replicas.accepting_proof(self.challenge)
