"""The holding side of replication: the node's TCP server hands it the connections of other
nodes (:class:`~broker.server.client.ReplicaReceiver`), from the handshake that proves
them (:mod:`broker.protocol.replica`) to the ``REPL`` requests they send.

Every request of a body is checked (:func:`~broker.replication.wire.decode_requests`, then
what a node may say of itself and of others) before any is applied; a body with one that
is wrong changes nothing and is answered with why. Requests are applied to the copies held
here (:class:`~broker.replication.held.HeldCopies`) through a table by request type; a
large body :data:`APPLY_PIECE` at a time, other tasks running between pieces; an ADD (and a
TAKEN) is answered once its record is on stable storage with ``--durable``.

A KEYS is answered with the keys this node knows (``known_keys``, the replicator's: those of
the copies held here and those its own topics stored), looked up where it stands among the
body's requests.

A HELLO is answered with what this node took over from the sender and from every node, and
how many copies it holds for the sender by topic, once no takeover of the sender is under
way (``under_way``: a refused publish's origin learns whether its copies were taken, see
:mod:`.refused`). A HOLDS (the sender makes copies again: see
:mod:`.recopy`) is answered with which of its ids this node holds, once their new holders are
stored. A
HELLO from a node that lost its memory (a crash without ``--durable``) first has its copies
taken over (``take_over_now``, the replicator's), so that what it kept on disk is skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from broker.config.options import Options
from broker.core.maybe import Maybe
from broker.protocol.replica import ACCEPTOR, CONNECTOR, Challenge, new_nonce, proof, proof_holds
from broker.replication.held import HeldCopies
from broker.replication.notice import Notices, printable
from broker.replication.peers import Inbound, Peers
from broker.replication.wire import (
    Add,
    Channels,
    Drop,
    Fin,
    Forget,
    Gone,
    Hello,
    Holds,
    Keys,
    Request,
    Taken,
    Update,
    WireError,
    WireLimits,
    decode_requests,
    pack,
)
from diskqueue import DiskQueueError

__all__ = ["Holder", "APPLY_PIECE"]

log = logging.getLogger("pynsqd.replication")

#: Requests of one REPL body applied in one step (other tasks run between steps).
APPLY_PIECE = 1000
#: Channel names of one node's topics held here at most (what a node may make this one keep).
MAX_CHANNEL_NAMES = 1 << 20


class Holder:
    """What other nodes' connections reach of this node; ``secret`` is the cluster's,
    ``take_over_now``, ``proven`` and ``under_way`` the replicator's (take over a node's copies
    at once; a node proved itself; the end of a node's takeover under way, if one is)."""

    def __init__(self, options: Options, peers: Peers, secret: bytes,
                 take_over_now: Callable[[str], Awaitable[None]], proven: Callable[[str], None],
                 known_keys: Callable[[str, list[bytes]], list[bytes]],
                 under_way: Callable[[str], trio.Event | None] = lambda node: None):
        self.options = options
        self.node_id = ""  # this node's, once the replicator has read it
        #: this node's address as the lookupds list it (``host:port``); None: not serving nodes yet
        self.own_address: str | None = None
        self.held: HeldCopies | None = None  # opened by the replicator before it answers nodes
        self._peers = peers
        self._secret = secret
        self._take_over_now = take_over_now
        self._proven = proven  # a node's connection to this one was proven: it is a member
        self._known_keys = known_keys
        self._under_way = under_way
        self._limits = WireLimits(options.max_msg_size)
        self._notices = Notices(log)
        #: connections from others that failed to prove they come from a node of the cluster, since start
        self.handshakes_refused = 0
        #: REPL bodies refused because a request was wrong, since start
        self.requests_refused = 0
        self._handlers: dict[type, Callable[[HeldCopies, str, Any], None]] = {
            Add: _add, Fin: _fin, Drop: _drop, Channels: _channels, Taken: self._taken, Forget: _forget,
            Update: _update}

    # ---------------------------------------------------------------- the handshake

    def challenge(self, peer: str, peer_nonce: str, address: str, remote: str) -> Challenge | None:
        own = self.own_address
        if own is None:
            return None  # not serving nodes yet: the peer dials again
        if address != own:
            self.handshakes_refused += 1
            self._notices.warn(("dialled", remote.rsplit(":", 1)[0]), "REPLICATION: client(%s) said it was node %s dialling %s, and "
                               "this node is %s: refused (a relay between nodes, or a stale nsqlookupd entry)",
                               remote, peer, printable(address), own)
            return None
        return Challenge(peer, peer_nonce, new_nonce(), address)

    def accepting_proof(self, challenge: Challenge) -> str:
        return proof(self._secret, ACCEPTOR, challenge.nonce, challenge.peer_nonce, self.node_id, challenge.peer,
                     challenge.address)

    def proven(self, challenge: Challenge | None, peer: str, given: object, remote: str) -> bool:
        if challenge is not None and challenge.peer == peer and proof_holds(
                given, self._secret, CONNECTOR, challenge.peer_nonce, challenge.nonce, peer, self.node_id,
                challenge.address):
            return True
        self.handshakes_refused += 1
        self._notices.warn(("proof", remote.rsplit(":", 1)[0]), "REPLICATION: client(%s) said it was node %s and "
                           "did not prove it belongs to this cluster (is --replication-secret-file the same on "
                           "both?)", remote, peer)
        return False

    def opened(self, peer: str, link: Inbound) -> None:
        self._peers.opened(peer, link)
        self._proven(peer)

    def closed(self, peer: str, link: Inbound, last_heard: float) -> None:
        self._peers.closed(peer, link, last_heard)

    # ---------------------------------------------------------------- requests

    def receive(self, peer: str, body: bytes) -> Maybe[bytes]:
        """Apply the requests of a ``REPL`` from ``peer`` (see the module docstring); the answer,
        or what to await for it."""
        try:
            seq, requests = decode_requests(body, self._limits)
            for request in requests:
                self._check_from(peer, request, seq)
        except WireError as exc:
            self.requests_refused += 1
            self._notices.warn(("request", peer), "REPLICATION: refused a REPL from node %s: %s", peer, exc)
            return pack([exc.seq, f"bad request: {exc}", None])
        if requests and type(requests[0]) is Hello:  # alone in its body (decode_requests checks)
            if requests[0].lost_memory:
                return self._hello_after_loss(peer, seq)
            ended = self._under_way(peer)
            if ended is not None:
                return self._hello_after(ended, peer, seq)
            return pack([seq, None, self.taken_from(peer)])
        if requests and type(requests[0]) is Gone:  # alone too
            return pack([seq, None, self._gone_answer(requests[0].node)])
        if requests and type(requests[0]) is Holds:  # alone too
            return self._holds(peer, seq, requests[0])
        if len(requests) > APPLY_PIECE:
            return self._apply_in_pieces(peer, seq, requests)
        known: dict[str, set[bytes]] = {}
        try:
            self._apply(peer, requests, known)
        except DiskQueueError as exc:
            log.error("REPLICATION: storing what node %s sent failed: %s", peer, exc)
            return pack([seq, f"storing failed: {exc}", None])
        answer = pack([seq, None, _known_answer(known)])
        if self.options.durable and any(type(request) in _SYNCED for request in requests):
            return self._synced(seq, answer)
        return answer

    def _apply(self, peer: str, requests: list[Request], known: dict[str, set[bytes]]) -> None:
        """Apply ``requests`` in order; the keys each KEYS found known go to ``known``."""
        held, handlers = self._held_log(), self._handlers
        for request in requests:
            if type(request) is Keys:
                found = self._known_keys(request.topic, request.keys)
                if found:
                    known.setdefault(request.topic, set()).update(found)
                continue
            handlers[type(request)](held, peer, request)

    async def _apply_in_pieces(self, peer: str, seq: int, requests: list[Request]) -> bytes:
        """A large body's requests, :data:`APPLY_PIECE` at a time with the other tasks running
        between pieces (its connection's next command waits for the answer, so order holds)."""
        known: dict[str, set[bytes]] = {}
        try:
            for start in range(0, len(requests), APPLY_PIECE):
                if start:
                    await trio.lowlevel.checkpoint()
                self._apply(peer, requests[start:start + APPLY_PIECE], known)
        except DiskQueueError as exc:
            log.error("REPLICATION: storing what node %s sent failed: %s", peer, exc)
            return pack([seq, f"storing failed: {exc}", None])
        answer = pack([seq, None, _known_answer(known)])
        if self.options.durable and any(type(request) in _SYNCED for request in requests):
            return await self._synced(seq, answer)
        return answer

    def _taken(self, held: HeldCopies, peer: str, request: Taken) -> None:
        """``peer`` took over ``request.ids`` of their origin: the copies held here that the peer
        held too are dropped, and this node says the takeover in its HELLO answers to the origin,
        as its own (the origin learns of it from any majority, the taker out of reach or not)."""
        held.drop(request.origin, request.topic, request.ids, by=peer)
        if request.origin != self.node_id:
            held.mark_taken(request.origin, request.topic, request.ids)

    def _check_from(self, peer: str, request: Request, seq: int) -> None:
        """What a node may say of itself and of others: it adds copies of its own messages, held by
        this node among others, and takes over from a node other than itself."""
        problem = None
        if type(request) is Add and (request.holders[0] != peer or self.node_id not in request.holders[1:]):
            problem = WireError("an ADD's holders must be its sender, then this node among others")
        if type(request) is Holds and request.holders is not None and (
                request.holders[0] != peer or self.node_id not in request.holders[1:]):
            problem = WireError("a HOLDS's holders must be its sender, then this node among others")
        if type(request) is Taken and request.origin == peer:  # (from this node: told to every peer)
            problem = WireError("a node takes over from another node")
        if type(request) is Channels and self._held_log().channel_names.get(peer, 0) + len(request.channels) > \
                MAX_CHANNEL_NAMES:
            problem = WireError(f"more than {MAX_CHANNEL_NAMES} channels of one node's topics")
        if problem is not None:
            problem.seq = seq
            raise problem

    def _gone_answer(self, node: str) -> list:
        """GONE's answer: whether this node reaches ``node``, and for how long it has not heard from it."""
        if self._peers.reachable(node):
            return [True, 0.0]
        heard = self._peers.last_heard(node, -1.0)
        return [False, None if heard < 0 else trio.current_time() - heard]

    def taken_from(self, peer: str) -> list:
        """HELLO's answer: what this node took over from ``peer``, and from every node (so that a
        peer that was down meanwhile drops the copies it holds of those before it acts on them)."""
        held = self._held_log()
        everything = {origin: {topic: sorted(ids) for topic, ids in topics.items()}
                      for origin, topics in held.taken.items()}
        return [everything.get(peer, {}), everything, held.held_for(peer)]

    async def _hello_after(self, ended: trio.Event, peer: str, seq: int) -> bytes:
        """HELLO's answer once the takeover of ``peer`` under way ended: it says every message
        taken (and none is taken while the peer's connection lasts: it reaches this node)."""
        await ended.wait()
        return pack([seq, None, self.taken_from(peer)])

    async def _hello_after_loss(self, peer: str, seq: int) -> bytes:
        log.warning("REPLICATION: node %s restarted after a crash without --durable: taking over its copies",
                    peer)
        await self._take_over_now(peer)
        return pack([seq, None, self.taken_from(peer)])

    def _holds(self, peer: str, seq: int, request: Holds) -> bytes | Awaitable[bytes]:
        """HOLDS's answer: which of its ids this node holds for ``peer`` (their new holders
        written first, and synced with ``--durable``)."""
        held = self._held_log()
        depth = held.queue.write_seq
        try:
            found = held.relist(peer, request.topic, request.ids, request.holders)
        except DiskQueueError as exc:
            log.error("REPLICATION: storing what node %s sent failed: %s", peer, exc)
            return pack([seq, f"storing failed: {exc}", None])
        answer = pack([seq, None, found])
        if self.options.durable and held.queue.write_seq != depth:
            return self._synced(seq, answer)
        return answer

    async def _synced(self, seq: int, answer: bytes) -> bytes:
        try:
            await self._held_log().synced()
        except DiskQueueError as exc:
            return pack([seq, f"sync failed: {exc}", None])
        return answer

    def _held_log(self) -> HeldCopies:
        assert self.held is not None, "the replicator opens the log before it answers nodes"
        return self.held


#: Requests answered once their records are on stable storage with ``--durable``: a copy, and a
#: takeover a peer was told of (the taker waits for a majority of those answers before it delivers).
_SYNCED = (Add, Taken)


# What each request does to the copies held here (the table of Holder._handlers).

def _known_answer(known: dict[str, set[bytes]]) -> dict[str, list[bytes]] | None:
    """The ``extra`` of a body's answer: the keys its KEYS found known, by topic (None: none asked or found)."""
    return {topic: sorted(keys) for topic, keys in known.items()} if known else None


def _add(held: HeldCopies, peer: str, request: Add) -> None:
    held.add(peer, request.topic, list(request.holders), request.ids, request.entries, request.dones,
             request.keys, request.expires)


def _fin(held: HeldCopies, peer: str, request: Fin) -> None:
    held.finish(peer, request.topic, request.channel, request.ids)


def _update(held: HeldCopies, peer: str, request: Update) -> None:
    held.update(peer, request.topic, request.channel, request.ids, request.attempts, request.dues)


def _drop(held: HeldCopies, peer: str, request: Drop) -> None:
    held.drop(peer, request.topic, request.ids)


def _channels(held: HeldCopies, peer: str, request: Channels) -> None:
    held.set_channels(peer, request.topic, request.channels)




def _forget(held: HeldCopies, peer: str, request: Forget) -> None:
    held.forget_taken(peer, request.topic, request.ids)  # what this node took from the sender
