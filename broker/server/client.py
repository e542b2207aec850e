"""One V2 connection's state: what it negotiated, its RDY window, output buffer and counters.

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

A :class:`Client` keeps flat what the hot paths touch (delivery, FIN, PUB: the RDY window,
the counters, the negotiated sizes and flags, the writer's state) and groups the rest:
its stream and what IDENTIFY made of it (:class:`~broker.server.transport.Transport`), and
its part in the node-to-node role (:class:`~broker.server.peer.PeerRole`). IDENTIFY itself
is applied by :mod:`broker.server.identify`, an upgrade performed by
:mod:`broker.server.upgrade`. Owned by its connection handler in :mod:`broker.server.tcp`;
the command handlers (:mod:`broker.server.handlers`) and the channels (as a
:class:`~broker.core.host.Subscriber`) act on it. The writer and timer tasks are async
(they wait for the socket and the clock); everything else is plain.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
from typing import TYPE_CHECKING

import trio

from broker.protocol import HEARTBEAT_FRAME, OK_FRAME, ProtocolError, State, encode_error, encode_response
from broker.server.deadline import STALL_TOLERANCE, Deadline
from broker.server.output import OutputBuffer
from broker.server.peer import PeerRole, ReplicaReceiver
from broker.server.transport import Transport

if TYPE_CHECKING:
    from broker.core.broker import Broker
    from broker.core.channel import Channel
    from broker.core.message import Message
    from broker.server.auth import AuthClient, AuthState
    from broker.server.flush import Flusher

__all__ = ["Client", "ReplicaReceiver"]

log = logging.getLogger("pynsqd.client")

#: nsqd's output buffer size until IDENTIFY sets one (:mod:`broker.server.identify`).
DEFAULT_OUTPUT_BUFFER_SIZE = 16 * 1024


class Client:
    """State of one TCP client; owned by its connection handler in :mod:`broker.server.tcp`."""

    def __init__(self, broker: Broker, stream: trio.abc.Stream, remote_address: str, client_number: int):
        opts = broker.options
        self.broker = broker
        self.options = opts
        self.number = client_number
        self.remote_address = remote_address
        self.connect_ts = int(time.time())

        # what IDENTIFY sets (:mod:`broker.server.identify`), nsqd's defaults until then
        host = remote_address.rsplit(":", 1)[0]
        self.client_id = host
        self.hostname = host
        self.user_agent = ""
        self.feature_negotiation = False
        self.heartbeat_interval = opts.client_timeout / 2
        self.output_buffer_size = DEFAULT_OUTPUT_BUFFER_SIZE
        self.output_buffer_timeout = opts.output_buffer_timeout
        self.msg_timeout = opts.msg_timeout
        self.sample_rate = 0
        self.lease: str | None = None  # pynsqd's lease extension (broker.protocol.lease)
        self.publish_keys = False  # pynsqd's keyed publishes (broker.protocol.keys)
        self.priorities = False  # pynsqd's prioritised messages (broker.protocol.priorities)

        # the subscription: its RDY window and counters, kept by the channel (a Subscriber)
        self.state = State.INIT
        self.channel: Channel | None = None
        self.rdy = 0
        self.in_flight_count = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.pub_counts: dict[str, int] = {}

        # output, and who hands it to the socket when (see the module docstring)
        self.output = OutputBuffer()
        self.closing = False
        self.batching = False  # the reader is applying a chunk of commands
        self.unapplied: list = []  # the answer of a command to await, then the rest of its turn's commands
        self._flush_pending = False
        self._sending = False  # the writer task is in a send: only it may write now
        self.flusher: Flusher | None = None  # the server's, which sends what other tasks queue
        self._marked = False  # the flusher is to flush this connection
        self._stalled = False  # refused messages while the output buffer was full
        self._out_event = trio.Event()
        self._closed = trio.Event()
        sock = getattr(stream, "socket", None)
        self.fd = sock.fileno() if sock is not None else -1  # the socket's, for the life of the connection
        # the fast ways out while the connection is plain (no upgrade): writes straight to the
        # descriptor, and the raw socket whose sends count the bytes handed over
        self._fd = self.fd
        self._socket = sock

        # the deadlines' clock (run_timers)
        self._timer_scope: trio.CancelScope | None = None
        self._clock = trio.lowlevel.current_clock()
        self.last_read = self._clock.current_time()
        self.send_started: float | None = None

        #: the stream and what IDENTIFY made of it (TLS, compression); the server sets its TLS context
        self.transport = Transport(stream)
        #: the node-to-node role (the server sets the node's replication, when it replicates)
        self.peer = PeerRole()
        # AUTH: the server's auth client (None: AUTH is disabled), the secret the client sent and
        # what the auth server answered (the command handlers keep them)
        self.authd: AuthClient | None = None
        self.auth_secret = ""
        self.auth_state: AuthState | None = None

    # ---------------------------------------------------------------- IDENTIFY, AUTH, transport

    def stop_plain_writes(self) -> None:
        """IDENTIFY agreed an upgrade: output must now go through the upgraded stream, never
        straight to the socket."""
        self._fd = -1
        self._socket = None

    @property
    def replicas(self) -> ReplicaReceiver | None:
        """The node's replication (None: it does not replicate)."""
        return self.peer.replicas

    @property
    def replica(self) -> str | None:
        """The peer node this connection comes from, once IDENTIFY proved it (None: a client)."""
        return self.peer.node

    # what /stats, /metrics and AUTH read of the transport
    @property
    def tls(self) -> bool:
        return self.transport.tls

    @property
    def tls_version(self) -> str:
        return self.transport.tls_version

    @property
    def tls_cipher_suite(self) -> str:
        return self.transport.tls_cipher_suite

    @property
    def tls_common_name(self) -> str:
        return self.transport.tls_common_name

    @property
    def snappy(self) -> bool:
        return self.transport.snappy

    @property
    def deflate(self) -> bool:
        return self.transport.deflate

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
        upgrade = self.transport.upgrade
        if upgrade is not None:
            upgrade.plain_frames = len(self.output.chunks)

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
        transport = self.transport
        try:
            while True:
                if not output.chunks and not self.closing:
                    await self._out_event.wait()
                    self._out_event = trio.Event()
                upgrade = transport.upgrade
                if upgrade is not None and output.chunks:
                    from broker.server.upgrade import perform  # loaded by the first upgrade: a start does not load TLS

                    await perform(self, upgrade)
                    continue
                if output.chunks:
                    data = output.take()
                    self._sending = True
                    sock = self._socket
                    self.send_started = trio.current_time()
                    if sock is None:
                        size = len(data)
                        codec = transport.codec
                        if codec is not None:  # the whole chunk at once: one sync flush, one snappy frame run
                            data = codec.compress(data)
                        await transport.stream.send_all(data)
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
