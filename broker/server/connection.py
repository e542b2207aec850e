"""One V2 connection's negotiated state, RDY window, output buffer and counters.

Frames are appended to an output buffer (:mod:`broker.server.output`) by
synchronous code (command handlers, channel dispatch) and handed to the socket
in one write of the joined bytes: at the end of the reader's chunk for what the
connection's own commands queued, by the server's flusher (:mod:`broker.server.flush`)
for what other tasks queued, and by the connection's writer task for what the
socket did not take at once (and on a TLS or compressed stream). As nsqd's
``bufio.Writer`` does, a buffer that reaches ``output_buffer_size`` is handed
to the socket at once, and a client whose buffer stays full (its socket does
not drain) is given no more messages. A timer task sends heartbeats every
heartbeat interval, drops a client that sends nothing for two intervals and
one whose socket does not drain within one interval, as nsqd does (a stall of
the broker's own making does not count: :mod:`broker.server.deadline`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Protocol

import trio

from broker.config.options import NSQD_COMPAT_VERSION
from broker.protocol import HEARTBEAT_FRAME, OK_FRAME, ProtocolError, State, encode_error, encode_response
from broker.protocol.keys import DEDUP_WINDOW_FIELD, KEYS_IDENTIFY_FIELD
from broker.protocol.lease import LEASE_IDENTIFY_FIELD, is_valid_lease_token
from broker.protocol.priorities import DEFAULT_PRIORITY_FIELD, PRIORITIES_IDENTIFY_FIELD
from broker.protocol.replica import (
    REPLICA_ADDRESS_FIELD,
    REPLICA_IDENTIFY_FIELD,
    REPLICA_NONCE_FIELD,
    REPLICA_PROOF_FIELD,
    Challenge,
    is_valid_node_id,
    is_valid_nonce,
)
from broker.server.deadline import STALL_TOLERANCE, Deadline
from broker.server.output import OutputBuffer
from broker.server.tls import describe_session

if TYPE_CHECKING:
    import ssl

    from broker.core.broker import Broker
    from broker.core.channel import Channel
    from broker.core.message import Message
    from broker.server.auth import AuthClient, AuthState
    from broker.server.compression import Codec
    from broker.server.flush import Flusher
    from broker.server.upgrade import Upgrade

__all__ = ["Client", "ReplicaReceiver"]

log = logging.getLogger("pynsqd.client")

#: nsqd's output buffer size until IDENTIFY sets one, and the least IDENTIFY may set.
DEFAULT_OUTPUT_BUFFER_SIZE = 16 * 1024
MIN_OUTPUT_BUFFER_SIZE = 64
#: nsqd's deflate level when IDENTIFY asks for deflate without a level.
DEFAULT_DEFLATE_LEVEL = 6
#: Seconds to try telling a client its TLS handshake failed, in plain text as nsqd does.
UPGRADE_ERROR_GRACE = 1.0

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

    def opened(self, peer: str, link: Client) -> None:
        """A proven connection of ``peer`` opened; its ``last_read`` says when it last received bytes."""
        ...

    def receive(self, peer: str, body: bytes) -> bytes | Awaitable[bytes]: ...

    def closed(self, peer: str, link: Client, last_heard: float) -> None:
        """The connection ended; ``last_heard``: when it last received bytes (trio time)."""
        ...


def _identify_seconds(data: dict, key: str, low: float, high: float, what: str, *,
                      can_disable: bool = True) -> float | None:
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


class Client:
    """State of one TCP client; owned by its connection handler in :mod:`broker.server.tcp`."""

    def __init__(self, broker: Broker, stream: trio.abc.Stream, remote_address: str, client_number: int):
        opts = broker.options
        self.broker = broker
        self.options = opts
        self.stream = stream
        self.number = client_number
        self.remote_address = remote_address
        host = remote_address.rsplit(":", 1)[0]
        self.client_id = host
        self.hostname = host
        self.user_agent = ""
        self.heartbeat_interval = opts.client_timeout / 2
        self.output_buffer_size = DEFAULT_OUTPUT_BUFFER_SIZE
        self.output_buffer_timeout = opts.output_buffer_timeout
        self.msg_timeout = opts.msg_timeout
        self.sample_rate = 0
        self.feature_negotiation = False
        self.lease: str | None = None  # pynsqd's lease extension (broker.protocol.lease)
        self.publish_keys = False  # pynsqd's keyed publishes (broker.protocol.keys)
        self.priorities = False  # pynsqd's prioritised messages (broker.protocol.priorities)
        self.connect_ts = int(time.time())
        self.state = State.INIT
        self.channel: Channel | None = None
        self.rdy = 0
        self.in_flight_count = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.pub_counts: dict[str, int] = {}
        self.output = OutputBuffer()
        self._stalled = False  # refused messages while the output buffer was full
        self._out_event = trio.Event()
        self._closed = trio.Event()
        self._timer_scope: trio.CancelScope | None = None
        self._clock = trio.lowlevel.current_clock()
        self.last_read = self._clock.current_time()
        self.send_started: float | None = None
        self.closing = False
        self.batching = False  # the reader is applying a chunk of commands
        self.unapplied: list = []  # the answer of a command to await, then the rest of its turn's commands
        self._flush_pending = False
        self._sending = False  # the writer task is in a send: only it may write now
        self.flusher: Flusher | None = None  # the server's, which sends what other tasks queue
        self._marked = False  # the flusher is to flush this connection
        sock = getattr(stream, "socket", None)
        self.fd = sock.fileno() if sock is not None else -1  # the socket's, for the life of the connection
        self._fd = self.fd  # while output may go straight to the socket (no upgrade)
        # transport upgrades: the server's TLS context (None: no TLS), what IDENTIFY agreed
        self.ssl_context: ssl.SSLContext | None = None
        self.upgrade: Upgrade | None = None
        self.codec: Codec | None = None
        self.tls = False
        self.tls_version = ""
        self.tls_cipher_suite = ""
        self.tls_common_name = ""
        self.snappy = False
        self.deflate = False
        self.deflate_level = 0
        # AUTH: the secret the client sent and what the auth server answered
        self.authd: AuthClient | None = None
        #: the node's replication (None: it does not replicate), and the peer node this
        #: connection comes from once IDENTIFY negotiated the node-to-node role
        self.replicas: ReplicaReceiver | None = None
        self.replica: str | None = None
        #: the handshake's first step was answered and waits for the proof (None: no handshake)
        self.replica_challenge: Challenge | None = None
        self._challenge_issued = False  # the IDENTIFY being answered began a handshake
        self.auth_secret = ""
        self.auth_state: AuthState | None = None
        # the raw socket while the connection is plain: sends count the bytes handed over
        self._socket = sock

    # ---------------------------------------------------------------- IDENTIFY

    def identify(self, data: dict) -> bytes:
        """Apply an IDENTIFY body; returns the response payload.

        ``data`` comes from the parser with nsqd's field types already checked
        (:class:`~broker.protocol.Identify`); raises fatal ``E_BAD_BODY`` errors with
        nsqd's wording for out-of-range values.
        """
        opts = self.options
        self.client_id = data.get("client_id") or ""
        self.hostname = data.get("hostname") or ""
        self.user_agent = data.get("user_agent") or ""

        heartbeat = _identify_seconds(data, "heartbeat_interval", 1.0, opts.max_heartbeat_interval,
                                      "heartbeat interval")
        if heartbeat is not None:
            self.heartbeat_interval = heartbeat

        timeout = _identify_seconds(data, "output_buffer_timeout", opts.min_output_buffer_timeout,
                                    opts.max_output_buffer_timeout, "output buffer timeout")
        if timeout is not None:
            self.output_buffer_timeout = timeout
        size = data.get("output_buffer_size") or 0
        if size == -1:
            self.output_buffer_size = 1
            self.output_buffer_timeout = 0.0
        elif size == 0:
            pass
        elif MIN_OUTPUT_BUFFER_SIZE <= size <= opts.max_output_buffer_size:
            self.output_buffer_size = size
        else:
            raise ProtocolError("E_BAD_BODY", f"IDENTIFY output buffer size ({size}) is invalid")

        sample_rate = data.get("sample_rate") or 0
        if not 0 <= sample_rate <= 99:
            raise ProtocolError("E_BAD_BODY", f"IDENTIFY sample rate ({sample_rate}) is invalid")
        self.sample_rate = sample_rate

        msg_timeout = _identify_seconds(data, "msg_timeout", 1.0, opts.max_msg_timeout, "msg timeout",
                                        can_disable=False)
        if msg_timeout is not None:
            self.msg_timeout = msg_timeout

        lease = data.get(LEASE_IDENTIFY_FIELD)
        if lease is not None:
            if not is_valid_lease_token(lease):
                raise ProtocolError("E_BAD_BODY", f"IDENTIFY lease ({json.dumps(lease)}) is invalid")
            self.lease = lease
        if data.get(KEYS_IDENTIFY_FIELD):
            self.publish_keys = True
        if data.get(PRIORITIES_IDENTIFY_FIELD):
            self.priorities = True
        self._identify_replica(data)

        self.feature_negotiation = bool(data.get("feature_negotiation"))
        self.wake_timers()
        if not self.feature_negotiation:
            return b"OK"
        tls = self.ssl_context is not None and bool(data.get("tls_v1"))
        deflate = opts.deflate and bool(data.get("deflate"))
        deflate_level = DEFAULT_DEFLATE_LEVEL
        if deflate and (data.get("deflate_level") or 0) > 0:
            deflate_level = data["deflate_level"]
        deflate_level = min(deflate_level, opts.max_deflate_level)
        snappy = opts.snappy and bool(data.get("snappy"))
        if deflate and snappy:
            raise ProtocolError("E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression")
        response = self.identify_response(tls, deflate, deflate_level, snappy)
        if tls or deflate or snappy:
            # loaded by the first client that upgrades: a start does not pay for TLS and compression
            from broker.server.compression import DeflateCodec, SnappyCodec
            from broker.server.upgrade import Upgrade

            codec: Codec | None = DeflateCodec(deflate_level) if deflate else SnappyCodec() if snappy else None
            self.upgrade = Upgrade(tls, codec)
            self._fd = -1  # output must now go through the upgraded stream, never straight to the socket
            self._socket = None
        return response

    def _identify_replica(self, data: dict) -> None:
        """The node-to-node handshake (:mod:`broker.protocol.replica`): a first IDENTIFY naming a
        node is challenged, and the connection becomes that node's only when a later one
        proves it. Until then nothing changes: REPL stays an unknown command."""
        self._challenge_issued = False
        replicas = self.replicas
        replica = data.get(REPLICA_IDENTIFY_FIELD)
        if replica is None or replicas is None or self.replica is not None:
            return
        given, nonce = data.get(REPLICA_PROOF_FIELD), data.get(REPLICA_NONCE_FIELD)
        if given is None and nonce is None:
            return  # no handshake asked for: the key alone is ignored, as nsqd ignores it
        if not is_valid_node_id(replica) or replica == replicas.node_id:
            raise ProtocolError("E_BAD_BODY", f"IDENTIFY replica ({json.dumps(replica)}) is invalid")
        challenge, self.replica_challenge = self.replica_challenge, None  # one answer per challenge
        if given is not None:
            if replicas.proven(challenge, replica, given, self.remote_address):
                self.replica = replica
                replicas.opened(replica, self)
            return
        if not is_valid_nonce(nonce):
            raise ProtocolError("E_BAD_BODY", f"IDENTIFY replica_nonce ({json.dumps(nonce)}) is invalid")
        address = data.get(REPLICA_ADDRESS_FIELD)
        if not isinstance(address, str):
            raise ProtocolError("E_BAD_BODY", f"IDENTIFY replica_address ({json.dumps(address)}) is invalid")
        self.replica_challenge = replicas.challenge(replica, str(nonce), address, self.remote_address)
        self._challenge_issued = self.replica_challenge is not None

    def identify_response(self, tls: bool = False, deflate: bool = False, deflate_level: int = DEFAULT_DEFLATE_LEVEL,
                          snappy: bool = False) -> bytes:
        """The feature-negotiation JSON, in nsqd's key order, with what was agreed."""
        opts = self.options
        answer = {
            "max_rdy_count": opts.max_rdy_count,
            "version": NSQD_COMPAT_VERSION,
            "max_msg_timeout": int(opts.max_msg_timeout * 1000),
            "msg_timeout": int(self.msg_timeout * 1000),
            "tls_v1": tls,
            "deflate": deflate,
            "deflate_level": min(deflate_level, opts.max_deflate_level),
            "max_deflate_level": opts.max_deflate_level,
            "snappy": snappy,
            "sample_rate": self.sample_rate,
            "auth_required": bool(opts.auth_http_addresses),
            "output_buffer_size": self.output_buffer_size,
            "output_buffer_timeout": int(self.output_buffer_timeout * 1000),
        }
        if self.lease is not None:  # only a client that asked learns of the extension
            answer[LEASE_IDENTIFY_FIELD] = self.lease
        if self.publish_keys:  # the same for keyed publishes
            answer[KEYS_IDENTIFY_FIELD] = True
            answer[DEDUP_WINDOW_FIELD] = round(opts.dedup_window * 1000)
        if self.replicas is not None and (self.replica is not None or self._challenge_issued):
            answer[REPLICA_IDENTIFY_FIELD] = self.replicas.node_id
            if self._challenge_issued and self.replica_challenge is not None:
                answer[REPLICA_NONCE_FIELD] = self.replica_challenge.nonce
                answer[REPLICA_PROOF_FIELD] = self.replicas.accepting_proof(self.replica_challenge)
        if self.priorities:
            answer[PRIORITIES_IDENTIFY_FIELD] = True
            answer[DEFAULT_PRIORITY_FIELD] = opts.default_priority
        return json.dumps(answer, separators=(",", ":")).encode()

    @property
    def authed(self) -> bool:
        """Whether an auth server granted this client anything (``/stats``)."""
        return self.auth_state is not None and bool(self.auth_state.authorizations)

    @property
    def auth_identity(self) -> str:
        return self.auth_state.identity if self.auth_state is not None else ""

    @property
    def auth_identity_url(self) -> str:
        return self.auth_state.identity_url if self.auth_state is not None else ""

    @property
    def lease_owner(self) -> str:
        """Who this client's leases belong to (see :mod:`broker.core.leases`): ``""`` without auth
        servers, where a lease token is the only proof; else the AUTH identity, or, when the
        auth server names none, a digest of the secret, so that clients the server tells
        apart only by their secrets do not share leases."""
        state = self.auth_state
        if state is None:
            return ""
        if state.identity:
            return "identity:" + state.identity
        return "secret:" + hashlib.sha256(self.auth_secret.encode()).hexdigest()

    def mark_upgrade(self) -> None:
        """The IDENTIFY response is queued: what IDENTIFY agreed starts after it (see
        :mod:`broker.server.upgrade`)."""
        if self.upgrade is not None:
            self.upgrade.plain_frames = len(self.output.chunks)

    async def _perform_upgrade(self, upgrade: Upgrade) -> None:
        """Send the output queued up to the IDENTIFY response plain, then upgrade and send the
        framed ``OK`` of each step; the writer calls this. Marks the upgrade done either way."""
        from broker.server.compression import DeflateCodec
        from broker.server.upgrade import UpgradeFailed, tls_handshake

        chunks = self.output.chunks
        plain = b"".join(chunks[:upgrade.plain_frames])
        del chunks[:upgrade.plain_frames]
        try:
            if plain:
                # a second IDENTIFY's answer goes through the stream it replaces, as nsqd's does
                await self.stream.send_all(plain if self.codec is None else self.codec.compress(plain))
                self.output.handed(len(plain))
            if upgrade.tls:
                assert self.ssl_context is not None
                log.info("PROTOCOL(V2): [%s] upgrading connection to TLS", self.remote_address)
                try:
                    tls_stream = await tls_handshake(self.stream, upgrade.leftover, self.ssl_context)
                except UpgradeFailed as exc:
                    upgrade.failed = True
                    await self._refuse_upgrade(str(exc))
                    return
                upgrade.leftover = b""
                self.stream = tls_stream
                self.tls_version, self.tls_cipher_suite, self.tls_common_name = describe_session(tls_stream)
                self.tls = True
                await tls_stream.send_all(encode_response(b"OK"))
            codec = upgrade.codec
            if codec is not None:
                if isinstance(codec, DeflateCodec):
                    log.info("PROTOCOL(V2): [%s] upgrading connection to deflate (level %d)", self.remote_address,
                             codec.level)
                    self.deflate, self.deflate_level = True, codec.level
                else:
                    log.info("PROTOCOL(V2): [%s] upgrading connection to snappy", self.remote_address)
                    self.snappy = True
                self.codec = codec
                await self.stream.send_all(codec.compress(encode_response(b"OK")))
        except BaseException:
            upgrade.failed = True
            raise
        finally:
            self.upgrade = None
            upgrade.done.set()

    async def _refuse_upgrade(self, cause: str) -> None:
        """Tell the client its handshake failed, in plain text as nsqd does, and close."""
        log.info("TCP: client(%s) error: E_IDENTIFY_FAILED IDENTIFY failed %s", self.remote_address, cause)
        self.closing = True
        self.output.chunks.clear()
        with trio.move_on_after(UPGRADE_ERROR_GRACE):
            try:
                await self.stream.send_all(encode_error(b"E_IDENTIFY_FAILED IDENTIFY failed " + cause.encode()))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    # ---------------------------------------------------------------- output

    def send_messages(self, msgs: list[Message]) -> None:
        """Queue message frames (sent once the caller wakes the writer); they are now in flight.

        A buffer that reaches ``output_buffer_size`` is handed to the socket now,
        as nsqd's ``bufio.Writer`` does; what the socket does not take keeps the
        client from getting more (:meth:`ready_for_more`) until it drains.
        """
        output = self.output
        if self.priorities:
            output.add_prioritised(msgs, self.options.default_priority)
        else:
            output.add_messages(msgs)
        self.in_flight_count += len(msgs)
        self.message_count += len(msgs)
        if output.size >= self.output_buffer_size and not self._flush_now():
            self._stalled = True
            self._out_event.set()

    def output_room(self) -> int:
        """Bytes the output buffer takes before it is full (at most ``output_buffer_size``)."""
        return self.output_buffer_size - self.output.size

    def unsent(self, msgs: list[Message]) -> list[Message]:
        """Those of ``msgs`` (in flight to this client) whose frames were never wholly handed to the socket."""
        return self.output.unsent(msgs)

    def published(self, topic: str, count: int) -> None:
        """``count`` messages this client published to ``topic`` were stored (``/stats``'s
        ``pub_counts``, as nsqd's ``PublishedMessage``)."""
        if count:
            counts = self.pub_counts
            counts[topic] = counts.get(topic, 0) + count

    def send_response(self, data: bytes) -> None:
        """Queue a response frame and make the writer flush."""
        self.output.add(OK_FRAME if data == b"OK" else encode_response(data))
        self.wake_writer()

    def send_error(self, err: ProtocolError) -> None:
        """Queue an error frame and make the writer flush."""
        self.output.add(encode_error(err.payload))
        self.wake_writer()

    def wake_writer(self) -> None:
        """Have what is queued sent: at the end of the chunk the reader is applying, or, when
        another task queued it, by the server's flusher once that task yields (see
        :mod:`broker.server.flush`; without a running flusher, by the writer task)."""
        if self.batching:
            self._flush_pending = True
        elif self._marked:
            pass
        elif self.flusher is not None and self.flusher.running and not self.closing:
            self._marked = True
            self.flusher.mark(self)
        else:  # a closing connection's writer sends the rest and ends it
            self._out_event.set()

    def flush_marked(self, small: bool) -> bool:
        """The flusher's turn: hand what is queued to the socket, or wake the writer task
        to send what it does not take. Without ``small``, less than a quarter of the output
        buffer waits (False: the connection stays marked)."""
        if not small and self.output.size < self.output_buffer_size >> 2 and not self.closing:
            return False
        self._marked = False
        if self.batching:  # the reader sends it at the end of its chunk
            self._flush_pending = True
        elif self.closing or not self._flush_now():
            self._out_event.set()
        return True

    def end_batch(self) -> None:
        """The reader applied a chunk: send what it queued (see the module docstring)."""
        self.batching = False
        if not self._flush_pending:
            return
        self._flush_pending = False
        if not self._flush_now():
            self._out_event.set()

    def _flush_now(self) -> bool:
        """Hand what is queued to the socket without blocking; True if it took it all.

        Only while the writer task is not in a send (so bytes go out in order)
        and the stream is a plain socket; otherwise the writer sends it.
        """
        output = self.output
        if not output.chunks:
            return True
        if self._sending or self.closing or self._fd < 0:
            return False
        data = output.take()
        try:
            sent = os.write(self._fd, data)
        except OSError:  # would block, or broken: the writer's send deals with it
            sent = 0
        output.handed(sent)
        if sent == len(data):
            return True
        output.put_back(memoryview(data)[sent:])
        return False

    def ready_for_more(self) -> bool:
        """True while the RDY window and the output buffer have room and the client is not closing."""
        return (self.in_flight_count < self.rdy and self.output.size < self.output_buffer_size
                and self.state == State.SUBSCRIBED and not self.closing)

    def close_soon(self) -> None:
        """Ask the connection to flush what is queued and close (channel deleted, shutdown)."""
        self.closing = True
        self.wake_writer()

    @property
    def closed(self) -> trio.Event:
        return self._closed

    def note_read(self) -> None:
        """The connection received bytes: the read deadline starts again."""
        self.last_read = self._clock.current_time()

    def wake_timers(self) -> None:
        """Make the timer task re-plan (the heartbeat interval changed)."""
        scope = self._timer_scope
        if scope is not None:
            # a deadline of now, not cancel(): the task then knows when it was asked to wake
            scope.deadline = min(scope.deadline, self._clock.current_time())

    async def run_writer(self) -> None:
        """Send queued frames until closed; returns after the final flush.

        One task per connection; it waits on an event rather than a timeout, so
        sending costs no cancel scope. Deadlines are enforced by :meth:`run_timers`.
        On a plain socket it counts the bytes each send hands over, so the output
        buffer knows which message frames have gone; once a full buffer drains,
        the channel is asked for more messages.
        """
        output = self.output
        try:
            while True:
                if not output.chunks and not self.closing:
                    await self._out_event.wait()
                    self._out_event = trio.Event()
                if self.upgrade is not None and output.chunks:
                    await self._perform_upgrade(self.upgrade)
                    continue
                if output.chunks:
                    data = output.take()
                    self._sending = True
                    sock = self._socket
                    self.send_started = trio.current_time()
                    if sock is None:
                        size = len(data)
                        if self.codec is not None:  # the whole chunk at once: one sync flush, one snappy frame run
                            data = self.codec.compress(data)
                        await self.stream.send_all(data)
                        output.handed(size)
                    else:
                        view = memoryview(data)
                        while view:
                            sent = await sock.send(view)
                            output.handed(sent)
                            view = view[sent:]
                    self.send_started = None
                    self._sending = False
                elif self.closing:
                    return
                # The buffer drained: by this send, or by another task's non-blocking write
                # after the stall woke this one (then there was nothing left to send here).
                # More messages now go straight to the socket while it takes them.
                if self._stalled and self.ready_for_more():
                    self._stalled = False
                    if self.channel is not None:
                        self.channel.dispatch(self)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return
        finally:
            self.closing = True
            self._closed.set()

    async def run_timers(self, read_scope: trio.CancelScope, connection_scope: trio.CancelScope) -> None:
        """Heartbeats and nsqd's two deadlines, for the life of the connection.

        Every heartbeat interval a ``_heartbeat_`` frame is queued. When nothing
        was read for two intervals (``--client-timeout`` before IDENTIFY) the
        reader is cancelled, as nsqd's read deadline does; when one send has been
        blocked for an interval (the client stopped reading) the connection is
        cancelled. One task wakes per deadline instead of a cancel scope per I/O.
        A stall of the broker's own (this task woke late) does not count towards
        either deadline (:mod:`broker.server.deadline`).
        """
        interval = None
        next_heartbeat = math.inf
        reading, sending = Deadline(), Deadline()
        planned = math.inf
        while True:
            now = trio.current_time()
            late = now - planned
            if late <= STALL_TOLERANCE:
                late = 0.0
            if self.heartbeat_interval != interval:
                interval = self.heartbeat_interval
                next_heartbeat = now + interval if interval else math.inf
            if now >= next_heartbeat:
                self.output.add(HEARTBEAT_FRAME)
                self.wake_writer()
                next_heartbeat = now + interval
            reading_on = interval and not read_scope.cancel_called
            read_deadline = reading.at(self.last_read if reading_on else None, 2 * (interval or 0), now, late)
            if now >= read_deadline:
                log.info("client %s: no command for %.0fs; closing", self.remote_address, 2 * interval)
                read_scope.cancel()
                # the final flush still has the write deadline
                next_heartbeat = read_deadline = math.inf
            write_limit = interval or self.options.client_timeout
            write_deadline = sending.at(self.send_started, write_limit, now, late)
            if now >= write_deadline:
                log.warning("client %s: write timed out; closing", self.remote_address)
                connection_scope.cancel()
                return
            with trio.CancelScope(deadline=min(next_heartbeat, read_deadline, write_deadline,
                                               now + write_limit)) as self._timer_scope:
                await trio.sleep_forever()
            planned = self._timer_scope.deadline  # when it was to wake (wake_timers may bring it forward)
            self._timer_scope = None
