"""One V2 connection's negotiated state, RDY window, output buffer and counters.

Frames are appended to an output list by synchronous code (command handlers,
channel dispatch) and sent by the connection's writer task with one
``send_all`` of the joined bytes. A timer task sends heartbeats every
heartbeat interval, drops a client that sends nothing for two intervals and
one whose socket does not drain within one interval, as nsqd does.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from typing import TYPE_CHECKING

import trio

from broker.config.options import NSQD_COMPAT_VERSION
from broker.protocol import HEARTBEAT_FRAME, ProtocolError, State, encode_error, encode_response, message_frame_header
from broker.protocol.lease import LEASE_IDENTIFY_FIELD, is_valid_lease_token

if TYPE_CHECKING:
    from broker.core.broker import Broker
    from broker.core.channel import Channel
    from broker.core.message import Message

__all__ = ["Client"]

log = logging.getLogger("pynsqd.client")

#: nsqd's output buffer size until IDENTIFY sets one, and the least IDENTIFY may set.
DEFAULT_OUTPUT_BUFFER_SIZE = 16 * 1024
MIN_OUTPUT_BUFFER_SIZE = 64

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
        self._out: list[bytes | memoryview] = []
        self._out_event = trio.Event()
        self._closed = trio.Event()
        self._timer_scope: trio.CancelScope | None = None
        self.last_read = trio.current_time()
        self.send_started: float | None = None
        self.closing = False
        self.batching = False  # the reader is applying a chunk of commands
        self._flush_pending = False
        self._writer_waiting = False
        sock = getattr(stream, "socket", None)
        self._fd = sock.fileno() if sock is not None else -1

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

        self.feature_negotiation = bool(data.get("feature_negotiation"))
        self.wake_timers()
        if not self.feature_negotiation:
            return b"OK"
        return self.identify_response()

    def identify_response(self) -> bytes:
        """The feature-negotiation JSON, in nsqd's key order."""
        opts = self.options
        answer = {
            "max_rdy_count": opts.max_rdy_count,
            "version": NSQD_COMPAT_VERSION,
            "max_msg_timeout": int(opts.max_msg_timeout * 1000),
            "msg_timeout": int(self.msg_timeout * 1000),
            "tls_v1": False,
            "deflate": False,
            "deflate_level": min(6, opts.max_deflate_level),
            "max_deflate_level": opts.max_deflate_level,
            "snappy": False,
            "sample_rate": self.sample_rate,
            "auth_required": False,
            "output_buffer_size": self.output_buffer_size,
            "output_buffer_timeout": int(self.output_buffer_timeout * 1000),
        }
        if self.lease is not None:  # only a client that asked learns of the extension
            answer[LEASE_IDENTIFY_FIELD] = self.lease
        return json.dumps(answer, separators=(",", ":")).encode()

    # ---------------------------------------------------------------- output

    def send_messages(self, msgs: list[Message]) -> None:
        """Queue message frames (sent once the caller wakes the writer); they are now in flight."""
        append = self._out.append
        header = message_frame_header
        for msg in msgs:
            body = msg.body
            append(header(msg.timestamp, msg.attempts, msg.id, len(body)))
            append(body)
        self.in_flight_count += len(msgs)
        self.message_count += len(msgs)

    def send_response(self, data: bytes) -> None:
        """Queue a response frame and make the writer flush."""
        self._out.append(encode_response(data))
        self.wake_writer()

    def send_error(self, err: ProtocolError) -> None:
        """Queue an error frame and make the writer flush."""
        self._out.append(encode_error(err.payload))
        self.wake_writer()

    def wake_writer(self) -> None:
        """Have what is queued sent: now, or at the end of the chunk the reader is applying."""
        if self.batching:
            self._flush_pending = True
        else:
            self._out_event.set()

    def end_batch(self) -> None:
        """The reader applied a chunk: send what it queued (see the module docstring)."""
        self.batching = False
        if not self._flush_pending:
            return
        self._flush_pending = False
        out = self._out
        if out and self._writer_waiting and not self.closing and self._fd >= 0:
            data = b"".join(out) if len(out) > 1 else out[0]
            try:
                sent = os.write(self._fd, data)
            except OSError:  # would block, or broken: the writer's send_all deals with it
                sent = 0
            if sent == len(data):
                out.clear()
                return
            out[:] = [memoryview(data)[sent:]]
        self._out_event.set()

    def ready_for_more(self) -> bool:
        """True while the RDY window has room and the client is not closing."""
        return self.in_flight_count < self.rdy and self.state == State.SUBSCRIBED and not self.closing

    def close_soon(self) -> None:
        """Ask the connection to flush what is queued and close (channel deleted, shutdown)."""
        self.closing = True
        self.wake_writer()

    @property
    def closed(self) -> trio.Event:
        return self._closed

    def note_read(self) -> None:
        """The connection received bytes: the read deadline starts again."""
        self.last_read = trio.current_time()

    def wake_timers(self) -> None:
        """Make the timer task re-plan (the heartbeat interval changed)."""
        if self._timer_scope is not None:
            self._timer_scope.cancel()

    async def run_writer(self) -> None:
        """Send queued frames until closed; returns after the final flush.

        One task per connection; it waits on an event rather than a timeout, so
        sending costs no cancel scope. Deadlines are enforced by :meth:`run_timers`.
        """
        try:
            while True:
                if not self._out and not self.closing:
                    self._writer_waiting = True
                    await self._out_event.wait()
                    self._writer_waiting = False
                    self._out_event = trio.Event()
                if self._out:
                    data = b"".join(self._out) if len(self._out) > 1 else self._out[0]
                    self._out.clear()
                    self.send_started = trio.current_time()
                    await self.stream.send_all(data)
                    self.send_started = None
                elif self.closing:
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
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
        """
        interval = None
        next_heartbeat = math.inf
        while True:
            now = trio.current_time()
            if self.heartbeat_interval != interval:
                interval = self.heartbeat_interval
                next_heartbeat = now + interval if interval else math.inf
            if now >= next_heartbeat:
                self._out.append(HEARTBEAT_FRAME)
                self.wake_writer()
                next_heartbeat = now + interval
            read_deadline = self.last_read + 2 * interval if interval else math.inf
            if now >= read_deadline:
                log.info("client %s: no command for %.0fs; closing", self.remote_address, 2 * interval)
                read_scope.cancel()
                return
            write_limit = interval or self.options.client_timeout
            started = self.send_started
            if started is not None and now - started >= write_limit:
                log.warning("client %s: write timed out; closing", self.remote_address)
                connection_scope.cancel()
                return
            wake = min(next_heartbeat, read_deadline, (started + write_limit) if started is not None else now + write_limit)
            with trio.CancelScope(deadline=wake) as self._timer_scope:
                await trio.sleep_forever()
            self._timer_scope = None
