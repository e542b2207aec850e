"""This node's connection to one peer, in the node-to-node role (:mod:`broker.protocol.replica`).

A :class:`PeerLink` dials the peer's TCP port, sends the V2 magic and runs the handshake of
:mod:`broker.protocol.replica`: an IDENTIFY naming this node, whose answer names the peer
and proves it holds the cluster's secret; the TLS upgrade when this node has TLS (the
peer's certificate verified, its name the address the lookupds give; a peer that offers no
TLS is refused); a second IDENTIFY proving this node. Then it says HELLO (the answer says
what the peer took over from this node while it was gone) and sends ``REPL`` frames, each
carrying every request queued since the last one (a request answered with data of its own,
GONE or HOLDS, in a frame of its own). At most
:data:`MAX_OUTSTANDING` frames wait for their answers at once, so requests that arrive
meanwhile share the next frame (and, with ``--durable``, the peer's next fsync).

Two kinds of request: :meth:`PeerLink.request` is answered (a waiter learns the outcome;
the link breaking fails it), :meth:`PeerLink.post` is delivered at least once (kept until
the frame carrying it is answered, and sent again after a reconnect). The peer's
heartbeats are answered with NOP; a peer silent for two and a half heartbeats is gone,
and the link dials again.
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Callable
from typing import Any

import trio

from broker.protocol import MAGIC_V2, FrameDecoder, ProtocolError
from broker.protocol.commands import encode_identify, encode_nop
from broker.protocol.replica import (
    ACCEPTOR,
    CONNECTOR,
    REPLICA_ADDRESS_FIELD,
    REPLICA_IDENTIFY_FIELD,
    REPLICA_NONCE_FIELD,
    REPLICA_PROOF_FIELD,
    encode_repl,
    is_valid_node_id,
    is_valid_nonce,
    new_nonce,
    proof,
    proof_holds,
)
from broker.replication.notice import Notices, printable
from broker.replication.wire import Hello, Request, WireError, comes_alone, encode_request, pack, unpack

__all__ = ["PeerLink", "Waiter", "MAX_OUTSTANDING", "HEARTBEAT", "NOT_SENT"]

log = logging.getLogger("pynsqd.replication")
#: A request's error when its link was down as it was made: it was never sent (every other
#: error may come after the peer applied it, its answer lost with the connection).
NOT_SENT = "not connected"

#: Frames sent and not yet answered, at most.
MAX_OUTSTANDING = 2
#: Seconds between the peer's heartbeats (the least IDENTIFY may ask for).
HEARTBEAT = 1.0
#: Seconds between two warnings that a peer and this node do not accept each other.
REFUSAL_LOG = 60.0
#: Seconds at most between two dials of an address that answered as no node of this cluster.
REFUSED_REDIAL = 30.0
#: Estimated bytes of requests kept for a peer that is unreachable, at most.
MAX_BACKLOG = 64 << 20
#: Estimated bytes of requests one frame carries before the rest waits for the next.
FRAME_BUDGET = 1 << 20
_READ_SIZE = 65536
_MAX_FRAME = 64 << 20
#: The largest frame a peer may send before it has proven itself (an IDENTIFY answer is ~400 bytes).
_MAX_UNPROVEN_FRAME = 16 << 10
_HEARTBEAT_DATA = b"_heartbeat_"


class LinkBroken(Exception):
    """The connection to the peer failed or the peer refused the role."""


class PeerRefused(LinkBroken):
    """The peer is not a proven node of this cluster, or does not accept this one as such."""


#: What ends a connection to a peer (the link dials again); anything else is a fault of ours.
LINK_ERRORS = (OSError, ssl.SSLError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError, LinkBroken, WireError,
               ProtocolError, ValueError, TypeError)


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    return [leaf for sub in group.exceptions
            for leaf in (_leaves(sub) if isinstance(sub, BaseExceptionGroup) else [sub])]


def _answer(data: bytes) -> tuple[int, str | None, Any]:
    """A peer's answer to a REPL, ``[seq, error, extra]``, checked; raises :class:`WireError`."""
    answer = unpack(data)
    if type(answer) is not list or len(answer) != 3 or type(answer[0]) is not int or not (
            answer[1] is None or type(answer[1]) is str):
        raise WireError("an answer is [seq, error or nil, extra]")
    return answer[0], answer[1], answer[2]


class Waiter:
    """The outcome of one answered request: ``error`` None once applied."""

    __slots__ = ("done", "error", "extra")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.error: str | None = None
        self.extra: Any = None

    def settle(self, error: str | None, extra: Any = None) -> None:
        if not self.done.is_set():
            self.error = error
            self.extra = extra
            self.done.set()


class PeerLink:
    """The link to the node at ``address``; :meth:`run` keeps it up until cancelled."""

    def __init__(self, address: tuple[str, int], node_id: str, connect_timeout: float,
                 on_hello: Callable[[PeerLink, Any], None], on_connected: Callable[[PeerLink], None],
                 *, secret: bytes = b"", ssl_context: ssl.SSLContext | None = None, lost_memory: bool = False,
                 local_address: str | None = None):
        self.address = address
        self.me = node_id
        #: the address this node dials from (its own, when it listens on one): peers see the node
        #: where it is, and a firewall can tell nodes apart
        self._local_address = local_address
        self._secret = secret  # the cluster's: proves each side to the other, never sent
        self._notices = Notices(log, REFUSAL_LOG)
        #: attempts that ended because this node and the peer did not accept each other
        self.refusals = 0
        self._ssl_context = ssl_context  # None: this node has no TLS, and the link is plain
        self.peer_id: str | None = None  # learned from the peer's IDENTIFY answer
        self.connected = False
        self.tried = trio.Event()  # the first attempt ended (connected, or failed)
        self.hello_at = -1.0  # when the peer last answered HELLO (trio time)
        self.failed_at = -1.0  # when an attempt to connect last ended without a HELLO
        self.failed_from = -1.0  # when that attempt began
        self._conn_scope: trio.CancelScope | None = None
        #: this node lost what it held in memory (a crash without --durable): said in HELLO
        #: until a HELLO of this link is answered
        self.lost_memory = lost_memory
        self.cancel_scope = trio.CancelScope()
        self._connect_timeout = connect_timeout
        self._on_hello = on_hello
        self._on_connected = on_connected
        self._requests: list[tuple[Request, int, Waiter | None]] = []  # queued, not yet sent
        self._posted: list[tuple[Request, int]] = []  # sent again after a reconnect until answered
        self._sent: dict[int, tuple[list[Waiter], list[tuple[Request, int]]]] = {}
        self._seq = 0
        self._wake = trio.Event()
        self._nop_due = False
        self._last_heard = 0.0
        self._early: list[tuple[int, bytes]] = []
        self._backlog = 0  # estimated bytes of the requests posted and not yet answered
        self._stream: trio.abc.Stream | None = None  # while connected
        self._sending = False  # a task is sending on the stream

    def __str__(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    # ---------------------------------------------------------------- requests

    def request(self, req: Request, size: int = 0, *, inline: bool = False) -> Waiter:
        """Queue ``req``; the waiter is settled by the peer's answer, or fails with the link.
        ``inline``: the caller sends it with :meth:`flush` (the writer is not woken)."""
        waiter = Waiter()
        if not self.connected:
            waiter.settle(NOT_SENT)
            return waiter
        self._requests.append((req, size, waiter))
        if not inline:
            self._wake.set()
        return waiter

    async def flush(self) -> None:
        """Send what is queued from the calling task when the link is free to (which saves
        waking the writer); else leave it to the writer."""
        stream = self._stream
        if stream is None or self._sending or len(self._sent) >= MAX_OUTSTANDING:
            self._wake.set()
            return
        if not (self._requests or self._posted):
            return
        self._sending = True
        try:
            with trio.CancelScope(shield=True):  # a send cut short would leave half a frame
                await stream.send_all(self._next_repl())
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the reader sees the connection end, and the link fails what waits
        finally:
            self._sending = False
            if self._requests or self._posted or self._nop_due:
                self._wake.set()  # what came meanwhile goes with the writer

    def post(self, req: Request, size: int = 0) -> None:
        """Queue ``req`` to be delivered at least once, across reconnects (while the peer is
        unreachable, the oldest are forgotten past :data:`MAX_BACKLOG` bytes)."""
        self._requests.append((req, size, None))
        self._backlog += size + 64
        if not self.connected and self._backlog > MAX_BACKLOG:
            self._forget_oldest()
        self._wake.set()

    def _forget_oldest(self) -> None:
        forgotten = 0
        while self._backlog > MAX_BACKLOG // 2 and (self._posted or self._requests):
            if self._posted:
                _req, size = self._posted.pop(0)
            else:
                _req, size, _waiter = self._requests.pop(0)
            self._backlog -= size + 64
            forgotten += 1
        log.warning("REPLICATION(%s): unreachable; forgot %d old requests (their copies may be delivered "
                    "again after a takeover)", self, forgotten)

    # ---------------------------------------------------------------- connection

    async def run(self) -> None:
        with self.cancel_scope:
            delay = 0.1
            while True:
                started = trio.current_time()
                most = 1.0  # a peer that is down is dialled again within a second
                try:
                    await self._connect_and_serve()
                    delay = 0.1
                except (PeerRefused, ssl.SSLError) as exc:
                    self.refusals += 1
                    self._notices.warn("refused", "REPLICATION(%s): not linked: %s", self, printable(exc))
                    most = REFUSED_REDIAL  # one that answers as no node of this cluster, less often
                except LINK_ERRORS as exc:
                    if self.connected or not self.tried.is_set():
                        log.info("REPLICATION(%s): link down: %s", self, printable(exc or type(exc).__name__))
                except Exception as exc:  # whatever a peer makes happen ends its link, never the node
                    self._notices.warn("fault", "REPLICATION(%s): link failed: %s", self, printable(repr(exc)))
                finally:
                    if self.hello_at < started:  # this attempt never got as far as HELLO
                        self.failed_at = trio.current_time()
                        self.failed_from = started
                    self._broken()
                await trio.sleep(delay)
                delay = min(most, delay * 2)

    @property
    def last_heard(self) -> float:
        """When the peer last sent bytes on this link (trio time; -1 before it ever did)."""
        return self._last_heard if self.peer_id is not None else -1.0

    def reconnect(self) -> None:
        """Drop the connection (if any): the link dials again and says HELLO."""
        if self._conn_scope is not None:
            self._conn_scope.cancel()

    def _broken(self) -> None:
        self.connected = False
        self._stream = None
        self._conn_scope = None
        self.tried.set()
        for waiters, posted in self._sent.values():
            for waiter in waiters:
                waiter.settle("connection lost")
            self._posted[:0] = posted  # sent again first
        self._sent.clear()
        kept: list[tuple[Request, int]] = []
        for req, size, pending in self._requests:
            if pending is None:
                kept.append((req, size))
            else:
                pending.settle("connection lost")
        self._posted.extend(kept)
        self._requests = []

    async def _connect_and_serve(self) -> None:
        with trio.fail_after(self._connect_timeout):
            stream, reader = await self._handshake()
        async with stream:
            with trio.fail_after(self._connect_timeout):
                await stream.send_all(encode_repl(pack([0, [encode_request(Hello(self.lost_memory))]])))
                while True:
                    kind, data = await self._next_frame(stream, reader)
                    if kind != 0:
                        raise LinkBroken(f"HELLO refused: {data.decode('utf-8', 'replace')}")
                    if data != _HEARTBEAT_DATA:
                        break
                    await stream.send_all(encode_nop())
                _seq, error, extra = _answer(data)
                if error:
                    raise LinkBroken(f"HELLO refused: {printable(error)}")
            self._on_hello(self, extra)
            self.lost_memory = False
            self.hello_at = trio.current_time()
            self.connected = True
            self._stream = stream
            self.tried.set()
            self._last_heard = trio.current_time()
            log.info("REPLICATION(%s): connected to node %s", self, self.peer_id)
            self._on_connected(self)
            try:
                async with trio.open_nursery() as nursery:
                    self._conn_scope = nursery.cancel_scope
                    nursery.start_soon(self._write_loop, stream)
                    nursery.start_soon(self._watch, nursery.cancel_scope)
                    await self._read_loop(stream, reader)
                    nursery.cancel_scope.cancel()
            except BaseExceptionGroup as group:
                leaves = _leaves(group)
                if all(isinstance(leaf, LINK_ERRORS) for leaf in leaves):
                    raise LinkBroken(str(leaves[0]) or type(leaves[0]).__name__) from None
                raise
        raise LinkBroken("closed by the peer")

    async def _handshake(self) -> tuple[trio.abc.Stream, FrameDecoder]:
        """Connect, and prove each side to the other (see the module docstring); the stream is
        the TLS stream when this node has TLS. Raises :class:`LinkBroken` (or what the
        connection raised) when the peer is not a proven node of this cluster."""
        host, port = self.address
        stream: trio.abc.Stream = await trio.open_tcp_stream(host, port, local_address=self._local_address)
        address = f"{host}:{port}"  # as the lookupds list the peer: bound into both proofs
        try:
            reader = FrameDecoder(_MAX_UNPROVEN_FRAME)
            self._early = []
            nonce = new_nonce()
            await stream.send_all(MAGIC_V2 + self._identify(**{"tls_v1": self._ssl_context is not None,
                                                               REPLICA_NONCE_FIELD: nonce,
                                                               REPLICA_ADDRESS_FIELD: address}))
            answer = await self._identify_answer(stream, reader)
            found_id, found_nonce = answer.get(REPLICA_IDENTIFY_FIELD), answer.get(REPLICA_NONCE_FIELD)
            if not is_valid_node_id(found_id) or not is_valid_nonce(found_nonce):
                raise LinkBroken("the peer does not replicate")
            peer_id, peer_nonce = str(found_id), str(found_nonce)
            if not proof_holds(answer.get(REPLICA_PROOF_FIELD), self._secret, ACCEPTOR, peer_nonce, nonce, peer_id,
                               self.me, address):
                raise PeerRefused(f"node {peer_id} did not prove it belongs to this cluster (is "
                                 "--replication-secret-file the same on both nodes?)")
            if self._ssl_context is not None:
                if answer.get("tls_v1") is not True:
                    raise PeerRefused("the peer offers no TLS, and this node links to its peers over TLS only")
                stream = trio.SSLStream(stream, self._ssl_context, server_hostname=host)
                try:
                    await stream.do_handshake()
                except trio.BrokenResourceError as exc:
                    if isinstance(exc.__cause__, ssl.SSLError):  # the peer's certificate, say
                        raise PeerRefused(f"TLS with the peer failed: {exc.__cause__}") from exc
                    raise
                reader = FrameDecoder(_MAX_UNPROVEN_FRAME)
                kind, data = await self._next_frame(stream, reader)
                if kind != 0 or data != b"OK":
                    raise LinkBroken(f"TLS upgrade refused: {data.decode('utf-8', 'replace')}")
            await stream.send_all(self._identify(**{REPLICA_PROOF_FIELD: proof(
                self._secret, CONNECTOR, nonce, peer_nonce, self.me, peer_id, address)}))
            answer = await self._identify_answer(stream, reader)
            if answer.get(REPLICA_IDENTIFY_FIELD) != peer_id:
                raise PeerRefused(f"node {peer_id} did not accept this node's proof (is --replication-secret-file "
                                 "the same on both nodes?)")
            reader.max_frame_size = _MAX_FRAME  # a proven peer's frames may be large
        except (ProtocolError, WireError, ValueError, TypeError) as exc:  # bytes no node sends
            await trio.aclose_forcefully(stream)
            raise PeerRefused(f"the peer's answer is not a node's: {exc}") from exc
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        if peer_id != self.peer_id and self.peer_id is not None:
            log.info("REPLICATION(%s): the peer is a new node %s (was %s)", self, peer_id, self.peer_id)
            self._posted.clear()  # what was meant for the old node
        self.peer_id = peer_id
        return stream, reader

    def _identify(self, **fields: object) -> bytes:
        return encode_identify({
            "client_id": "pynsqd-replica", "user_agent": "pynsqd-replica", "feature_negotiation": True,
            "heartbeat_interval": int(HEARTBEAT * 1000), REPLICA_IDENTIFY_FIELD: self.me, **fields})

    async def _identify_answer(self, stream: trio.abc.Stream, reader: FrameDecoder) -> dict:
        kind, data = await self._next_frame(stream, reader)
        if kind != 0:
            raise PeerRefused(f"IDENTIFY refused: {printable(data.decode('utf-8', 'replace'))}")
        try:
            answer = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise PeerRefused("IDENTIFY answer is not JSON an nsqd sends") from exc
        if not isinstance(answer, dict):
            raise LinkBroken("IDENTIFY answer is not a JSON object")
        return answer

    async def _next_frame(self, stream: trio.abc.Stream, reader: FrameDecoder) -> tuple[int, bytes]:
        """The next frame from the peer, before the link is up (later frames wait in ``_early``)."""
        while not self._early:
            data = await stream.receive_some(_READ_SIZE)
            if not data:
                raise LinkBroken("closed by the peer")
            self._early.extend(reader.feed_pairs(bytes(data)))
        return self._early.pop(0)

    async def _read_loop(self, stream: trio.abc.Stream, reader: FrameDecoder) -> None:
        frames, self._early = self._early, []
        while True:
            for kind, payload in frames:
                if kind != 0:
                    raise LinkBroken(f"error from the peer: {payload.decode('utf-8', 'replace')}")
                if payload == _HEARTBEAT_DATA:
                    self._nop_due = True
                    self._wake.set()
                    continue
                seq, error, extra = _answer(payload)
                sent = self._sent.pop(seq, None)
                if sent is None:
                    continue
                waiters, posted = sent
                self._backlog -= sum(size + 64 for _req, size in posted)
                for waiter in waiters:
                    waiter.settle(error, extra)
                self._wake.set()  # room for another frame
            data = await stream.receive_some(_READ_SIZE)
            if not data:
                return
            self._last_heard = trio.current_time()
            frames = reader.feed_pairs(bytes(data))

    async def _watch(self, scope: trio.CancelScope) -> None:
        while True:
            await trio.sleep(HEARTBEAT / 2)
            if trio.current_time() - self._last_heard > 2 * HEARTBEAT + 0.5:
                log.info("REPLICATION(%s): node %s silent for %.1fs", self, self.peer_id,
                         trio.current_time() - self._last_heard)
                self.connected = False
                scope.cancel()
                return

    async def _write_loop(self, stream: trio.abc.Stream) -> None:
        while True:
            if self._sending:  # a task is in flush: it wakes the writer when it is done
                pass
            elif self._nop_due:
                self._nop_due = False
                await self._send(stream, encode_nop())
                continue
            elif (self._requests or self._posted) and len(self._sent) < MAX_OUTSTANDING:
                await self._send(stream, self._next_repl())
                continue
            self._wake = trio.Event()
            await self._wake.wait()

    async def _send(self, stream: trio.abc.Stream, data: bytes) -> None:
        self._sending = True
        try:
            await stream.send_all(data)
        finally:
            self._sending = False

    def _next_repl(self) -> bytes:
        reqs: list[list] = []
        waiters: list[Waiter] = []
        posted: list[tuple[Request, int]] = []
        budget = FRAME_BUDGET
        while self._posted and (budget > 0 or not reqs):
            req, size = self._posted.pop(0)
            reqs.append(encode_request(req))
            posted.append((req, size))
            budget -= size + 64
        taken = 0
        for req, size, waiter in self._requests:
            alone = comes_alone(req)  # its answer is its own: in a frame of its own
            if reqs and (budget <= 0 or alone):
                break
            reqs.append(encode_request(req))
            if waiter is None:
                posted.append((req, size))
            else:
                waiters.append(waiter)
            budget -= size + 64
            taken += 1
            if alone:
                break
        del self._requests[:taken]
        self._seq += 1
        self._sent[self._seq] = (waiters, posted)
        return encode_repl(pack([self._seq, reqs]))
