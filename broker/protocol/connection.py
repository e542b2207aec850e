"""The server side of one V2 connection: bytes in, validated command events out.

:class:`ServerConnection` replicates what nsqd 1.3.0 checks before a command
reaches the domain (``nsqd/tcp.go`` for the magic, ``nsqd/protocol_v2.go``
``IOLoop``/``Exec`` and the per-command handlers for the rest), in nsqd's
order and with nsqd's exact error strings:

1. the magic ``"  V2"`` (anything else: ``E_BAD_PROTOCOL``, fatal);
2. a line is read up to ``\\n`` (at most ``max_line_length`` bytes, else the
   connection is closed silently, as nsqd's ``bufio: buffer full``); one
   trailing ``\\r`` is dropped; the line is split on single spaces;
3. the TLS policy (when :attr:`~ServerConnection.tls_required`), for every
   command but IDENTIFY, even unknown ones;
4. the command name (unknown or empty: ``E_INVALID invalid command X``);
5. the handler's checks: state, parameter count, names, numbers, then the body
   sizes and the body itself.

What is left to the owner: anything needing the broker or the options
(IDENTIFY range checks, AUTH, the auth checks of SUB/PUB/MPUB/DPUB, FIN/REQ/TOUCH
ownership, publish failures).
"""

from __future__ import annotations

from copy import copy

from .base10 import ms_to_duration_ns, to_int64
from .bodies import (
    AUTH_BODY,
    DPUB_BODY,
    IDENTIFY_BODY,
    PUB_BODY,
    BodySpec,
    KeyedMpubBody,
    MpubBody,
    SizedBody,
    one_message,
)
from .commands import Auth, Cls, Dpub, Fin, FinRun, Identify, Nop, Pub, Rdy, Req, Sub, Touch
from .errors import ProtocolError
from .finrun import FIN_LINE, fin_ids, fin_run_end, new_fins
from .frames import MAGIC_V2
from .identify import finish_identify, identify_or_defer
from .keys import MAX_KEY_LENGTH
from .lease import LEASE_OPS, Lease, is_valid_lease_token
from .limits import Limits
from .names import go_quote
from .params import invalid, message_id_param, name_param, number_param
from .priorities import PRIORITY_SIZE
from .replica import Repl
from .state import IGNORED_MOVES, LEGAL_STATES, State

__all__ = ["ServerConnection", "LINE_TOO_LONG", "finish_identify"]

#: The code of the error raised for an over-long command line. It never reaches
#: the wire: its payload is empty because nsqd closes without sending a frame.
LINE_TOO_LONG = "E_LINE_TOO_LONG"

_NS_PER_MS = 1_000_000
_NO_LIMIT = 1 << 62
_FIN_STATES = LEGAL_STATES[b"FIN"]

class ServerConnection:
    """One connection's parser and state machine (server side, no I/O).

    Feed bytes with :meth:`receive_data`; collect commands with
    :meth:`next_events`. ``state`` is INIT until a SUB is parsed, SUBSCRIBED
    after it, CLOSING after CLS. The owner sets ``heartbeats_enabled`` to False
    after an IDENTIFY with ``heartbeat_interval`` -1 (SUB then fails), and
    ``tls_required`` to True while ``--tls-required`` applies and the
    connection has not upgraded to TLS. With ``fin_runs`` set, consecutive
    well-formed FIN lines come as one :class:`FinRun` instead of one
    :class:`Fin` each (a consumer's chunk is mostly FINs).

    Every error is a :class:`ProtocolError` carrying nsqd's payload; all the
    parser raises are fatal. The parser holds at most one command line
    (``max_line_length``) or one body of a size the limits allow.
    """

    __slots__ = (
        "limits", "state", "heartbeats_enabled", "tls_required", "fin_runs", "keyed", "prioritised", "replica",
        "_buf", "_whole", "_searched", "_magic_seen", "_body", "_error", "_eof", "_paused", "_limited",
    )

    def __init__(self, limits: Limits = Limits()):
        self.limits = limits
        self.state = State.INIT
        self.heartbeats_enabled = True
        self.tls_required = False
        self.fin_runs = False
        #: keyed publishes were negotiated (:mod:`broker.protocol.keys`): every message is a key
        #: and a body, and a publish's event carries its keys
        self.keyed = False
        #: priorities were negotiated (:mod:`broker.protocol.priorities`): every message is a
        #: priority and a body, and a publish's event carries its priorities
        self.prioritised = False
        #: the node-to-node role was negotiated (:mod:`broker.protocol.replica`): REPL is a command
        self.replica = False
        # Received bytes not parsed yet. A chunk that arrives when nothing is
        # pending is kept as is (_whole) and parsed in place without a copy;
        # anything else accumulates in _buf, where appending is amortised O(1)
        # however small the pieces a client trickles in.
        self._buf = bytearray()
        self._whole: bytes | None = None
        self._searched = 0  # leading pending bytes known to hold no "\n"
        self._magic_seen = False
        self._body: SizedBody | MpubBody | None = None
        self._error: ProtocolError | None = None
        self._eof = False
        self._paused = False  # the last call stopped after an IDENTIFY
        self._limited = False  # the last call stopped at its limit of commands

    # ------------------------------------------------------------------ input

    def receive_data(self, data: bytes) -> None:
        """Buffer bytes from the client; ``b""`` marks the end of input.

        End of input is EOF, or a read deadline passing (nsqd's read fails the
        same way in both cases). Raises RuntimeError for data after the end.
        """
        if not data:
            self._eof = True
        elif self._eof:
            raise RuntimeError("data received after the end of input")
        elif self._whole is None and not self._buf and type(data) is bytes:
            self._whole = data
        else:
            if self._whole is not None:
                self._buf += self._whole
                self._whole = None
            self._buf += data

    def next_events(self, limit: int | None = None) -> list:
        """Every complete command buffered so far, in order; at most ``limit`` commands if given.

        A call parses at most ``limit`` commands (each FIN of a :class:`FinRun` and each
        message of an MPUB counts, and so does a line that yields no event; the messages
        of an MPUB count as they are decoded, so a huge one takes many calls), so that its
        owner can bound the work one call hands it and come back for the rest. Parsing pauses after an :class:`Identify` (the rest is returned by the
        next call), because what IDENTIFY negotiates changes how the following
        bytes are read: heartbeats (SUB), TLS, compression. If an error follows
        some good commands, those are returned and the error is raised on the
        next call; after an error every call raises it again. :attr:`has_more`
        tells whether another call is needed before more bytes are received.

        At the end of input, a command cut off inside its body raises the
        error nsqd sends when its body read fails; a partial line is dropped
        silently, as nsqd does.
        """
        if self._error is not None:
            raise copy(self._error)
        events: list = []
        self._paused = self._limited = False
        try:
            self._parse(events, _NO_LIMIT if limit is None else limit)
        except ProtocolError as exc:
            # kept without its traceback (whose frames hold this parser and its input): a
            # connection refused stays plain garbage, freed at once, not a cycle to collect
            self._error = copy(exc)
            if not events:
                raise
        return events

    @property
    def has_more(self) -> bool:
        """Whether the last :meth:`next_events` stopped short of what was received: after an
        IDENTIFY, at its limit, or before an error (the next call returns or raises it).
        Otherwise the next call returns nothing until more bytes are received."""
        return self._paused or self._limited or self._error is not None

    def take_trailing_data(self) -> bytes:
        """Return and forget the bytes received but not parsed yet.

        After an IDENTIFY that upgrades the stream (TLS, snappy, deflate) the
        bytes that follow belong to the upgraded stream: the owner decodes them
        and feeds the result back through :meth:`receive_data`.
        """
        if self._body is not None:
            raise RuntimeError("a command body is still being read")
        data = self._pending()
        self._buf = bytearray()
        self._whole = None
        self._searched = 0
        self._paused = self._limited = False
        return data

    def _pending(self) -> bytes:
        return self._whole if self._whole is not None else bytes(self._buf)

    def _pending_size(self) -> int:
        return len(self._whole) if self._whole is not None else len(self._buf)

    # ------------------------------------------------------------------ parsing

    def _parse(self, events: list, budget: int) -> None:
        if not self._magic_seen and not self._read_magic():
            return
        # a partial line or body is pending: check that it is complete before scanning it again
        if (self._searched or self._body is not None) and not self._ready():
            if self._eof and self._body is not None:
                raise self._body.eof_error()
            return
        data = self._pending()
        end = len(data)
        pos = 0
        cap = self.limits.max_line_length
        find = data.find
        startswith = data.startswith
        append = events.append
        handlers = _HANDLERS
        fin_fast = self.state in _FIN_STATES and not self.tls_required
        fin_runs = self.fin_runs
        line_open = False
        try:
            while True:
                if budget <= 0:
                    self._limited = pos < end
                    break
                body = self._body
                if body is not None:
                    if end - pos < body.need:
                        break
                    if type(body) is MpubBody:
                        # each message counts as it is decoded: a huge body takes many calls
                        decoded = len(body.bodies)
                        pos, event = body.advance(data, pos, end, budget)
                        budget -= len(body.bodies) - decoded
                        if event is None:
                            if budget <= 0:
                                continue
                            break
                    else:
                        pos, event = body.advance(data, pos, end)
                        if event is None:
                            break
                        budget -= 1
                    self._body = None
                    append(event)
                    if type(event) is Identify:
                        self._paused = True
                        break
                    continue
                if fin_fast and startswith(b"FIN ", pos):
                    stop = fin_run_end(data, pos, min(end, pos + budget * FIN_LINE))
                    if stop > pos:
                        ids = fin_ids(data, pos, stop)
                        budget -= len(ids)
                        if fin_runs:
                            append(FinRun(ids))
                        else:
                            events.extend(new_fins(ids))
                        pos = stop
                        continue
                nl = find(b"\n", pos, pos + cap)
                if nl < 0:
                    if end - pos >= cap:
                        raise self._line_too_long()
                    line_open = True
                    break
                line = data[pos:nl]
                pos = nl + 1
                if line[-1:] == b"\r":
                    line = line[:-1]
                params = line.split(b" ")
                name = params[0]
                if self.tls_required and name != b"IDENTIFY":
                    raise ProtocolError.with_raw_description(
                        "E_INVALID", b"cannot " + name + b" in current state (TLS required)"
                    )
                handler = handlers.get(name)
                if handler is None:
                    raise ProtocolError.with_raw_description("E_INVALID", b"invalid command " + name)
                event = handler(self, params)
                if event is not None:
                    append(event)
                if self._body is None:  # a command with a body counts when the body is read
                    budget -= 1
                fin_fast = self.state in _FIN_STATES and not self.tls_required
        finally:
            self._consume(data, pos)
        self._searched = end - pos if line_open else 0
        body = self._body
        if self._eof and body is not None and end - pos < body.need:
            raise body.eof_error()

    def _consume(self, data: bytes, pos: int) -> None:
        """Drop the first ``pos`` pending bytes (``data`` is the pending bytes)."""
        if self._whole is not None:
            self._whole = None
            if pos < len(data):
                self._buf = bytearray(memoryview(data)[pos:])
        else:
            del self._buf[:pos]  # cheap: bytearray moves its start instead of copying

    def _read_magic(self) -> bool:
        if self._pending_size() < 4:
            return False
        data = self._pending()
        if data[:4] != MAGIC_V2:
            magic = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in bytes(data[:4]).decode("latin-1"))
            raise ProtocolError("E_BAD_PROTOCOL", f"bad protocol magic '{magic}'", payload=b"E_BAD_PROTOCOL")
        self._magic_seen = True
        self._consume(data, 4)
        return True

    def _ready(self) -> bool:
        """Whether the pending bytes complete a line or the pending body's next step.

        The search for a newline resumes where the last one stopped, so a long
        line arriving in small pieces costs linear time. Raises for a line
        longer than the limit as soon as that many bytes are pending without
        a newline.
        """
        body = self._body
        if body is not None:
            return self._pending_size() >= body.need
        cap = self.limits.max_line_length
        pending = self._whole if self._whole is not None else self._buf
        if pending.find(b"\n", self._searched, cap) >= 0:
            return True
        size = len(pending)
        if size >= cap:
            raise self._line_too_long()
        self._searched = size
        return False

    def _line_too_long(self) -> ProtocolError:
        return ProtocolError(LINE_TOO_LONG, "failed to read command - bufio: buffer full", payload=b"")

    # ------------------------------------------------------------------ checks

    def _require_state(self, command: bytes) -> None:
        if self.state not in LEGAL_STATES[command]:
            raise invalid(f"cannot {command.decode('ascii')} in current state")

    # ------------------------------------------------------------------ handlers (one per wire command)

    def _identify(self, params: list[bytes]) -> None:
        self._require_state(b"IDENTIFY")
        self._body = SizedBody(IDENTIFY_BODY, self.limits.max_body_size, identify_or_defer)

    def _auth(self, params: list[bytes]) -> None:
        self._require_state(b"AUTH")
        if len(params) != 1:
            raise invalid("AUTH invalid number of parameters")
        self._body = SizedBody(AUTH_BODY, self.limits.max_body_size, Auth)

    def _sub(self, params: list[bytes]) -> Sub:
        self._require_state(b"SUB")
        if not self.heartbeats_enabled:
            raise invalid("cannot SUB with heartbeats disabled")
        if len(params) < 3:
            raise invalid("SUB insufficient number of parameters")
        topic = name_param(params[1], "SUB", "topic", "E_BAD_TOPIC")
        channel = name_param(params[2], "SUB", "channel", "E_BAD_CHANNEL")
        self.state = State.SUBSCRIBED
        return Sub(topic, channel)

    def _rdy(self, params: list[bytes]) -> Rdy | None:
        if (b"RDY", self.state) in IGNORED_MOVES:
            return None
        self._require_state(b"RDY")
        count = 1
        if len(params) > 1:
            count = to_int64(number_param(params[1], b"RDY could not parse count "))
        max_rdy_count = self.limits.max_rdy_count
        if count < 0 or count > max_rdy_count:
            raise invalid(f"RDY count {count} out of range 0-{max_rdy_count}")
        return Rdy(count)

    def _fin(self, params: list[bytes]) -> Fin:
        return Fin(self._only_message_id(b"FIN", params))

    def _req(self, params: list[bytes]) -> Req:
        self._require_state(b"REQ")
        if len(params) < 3:
            raise invalid("REQ insufficient number of params")
        msg_id = message_id_param(params[1])
        timeout_ns = ms_to_duration_ns(number_param(params[2], b"REQ could not parse timeout "))
        # nsqd clamps (and only logs) an out-of-range REQ timeout
        max_ns = self.limits.max_req_timeout_ms * _NS_PER_MS
        timeout_ns = min(max(timeout_ns, 0), max_ns)
        return Req(msg_id, timeout_ns // _NS_PER_MS)

    def _touch(self, params: list[bytes]) -> Touch:
        return Touch(self._only_message_id(b"TOUCH", params))

    def _only_message_id(self, command: bytes, params: list[bytes]) -> bytes:
        """The message id of a FIN or TOUCH line, checked as nsqd checks it."""
        self._require_state(command)
        if len(params) < 2:
            raise invalid(f"{command.decode()} insufficient number of params")
        return message_id_param(params[1])

    def _cls(self, params: list[bytes]) -> Cls:
        self._require_state(b"CLS")
        self.state = State.CLOSING
        return Cls()

    def _nop(self, params: list[bytes]) -> Nop:
        return Nop()

    def _lease(self, params: list[bytes]) -> Lease:
        self._require_state(b"LEASE")
        op = params[1].decode("ascii", "replace") if len(params) > 1 else ""
        if op not in LEASE_OPS:
            raise ProtocolError.with_raw_description(
                "E_INVALID", b"LEASE invalid operation " + go_quote(params[1] if len(params) > 1 else b""))
        if op == "AVAILABLE":
            return Lease(op)
        if len(params) < (4 if op == "REQ" else 3):
            raise invalid(f"LEASE {op} insufficient number of params")
        if not is_valid_lease_token(params[2].decode("ascii", "replace")):
            raise ProtocolError.with_raw_description(
                "E_INVALID", b"LEASE " + params[1] + b" invalid token " + go_quote(params[2]))
        token = params[2].decode("ascii")
        if op != "REQ":
            return Lease(op, token)
        timeout_ns = ms_to_duration_ns(number_param(params[3], b"LEASE REQ could not parse timeout "))
        timeout_ns = min(max(timeout_ns, 0), self.limits.max_req_timeout_ms * _NS_PER_MS)
        return Lease(op, token, timeout_ns // _NS_PER_MS)

    def _pub(self, params: list[bytes]) -> None:
        if len(params) < 2:
            raise invalid("PUB insufficient number of parameters")
        topic = name_param(params[1], "PUB", "topic", "E_BAD_TOPIC")
        self._body = SizedBody(PUB_BODY, self._max_message(), one_message(Pub, topic, 0, self.keyed, self.prioritised, self.limits.max_msg_size))

    def _mpub(self, params: list[bytes]) -> None:
        if len(params) < 2:
            raise invalid("MPUB insufficient number of parameters")
        # nsqd repeats the code inside the description for MPUB only
        topic = name_param(params[1], "MPUB", "topic", "E_BAD_TOPIC", prefix=b"E_BAD_TOPIC ")
        limits = self.limits
        body = KeyedMpubBody if self.keyed else MpubBody
        self._body = body(topic, limits.max_msg_size, limits.max_body_size, prioritised=self.prioritised)

    def _dpub(self, params: list[bytes]) -> None:
        if len(params) < 3:
            raise invalid("DPUB insufficient number of parameters")
        topic = name_param(params[1], "DPUB", "topic", "E_BAD_TOPIC")
        defer_ms = number_param(params[2], b"DPUB could not parse timeout ")
        defer_ns = ms_to_duration_ns(defer_ms)
        max_req_timeout_ms = self.limits.max_req_timeout_ms
        if defer_ns < 0 or defer_ns > max_req_timeout_ms * _NS_PER_MS:
            # nsqd prints the parsed (unsigned) milliseconds, not the wrapped duration
            raise invalid(f"DPUB timeout {defer_ms} out of range 0-{max_req_timeout_ms}")
        self._body = SizedBody(DPUB_BODY, self._max_message(), one_message(
            Dpub, topic, defer_ns // _NS_PER_MS, self.keyed, self.prioritised, self.limits.max_msg_size))

    def _repl(self, params: list[bytes]) -> None:
        if not self.replica:
            raise ProtocolError.with_raw_description("E_INVALID", b"invalid command REPL")
        self._body = SizedBody(REPL_BODY, self.limits.max_body_size * 2 + (1 << 20), Repl)

    def _max_message(self) -> int:
        """The longest PUB or DPUB body: a message, and on a keyed or prioritised connection its
        key and priority too."""
        return (self.limits.max_msg_size + (MAX_KEY_LENGTH + 1 if self.keyed else 0)
                + (PRIORITY_SIZE if self.prioritised else 0))


_HANDLERS = {
    b"IDENTIFY": ServerConnection._identify,
    b"AUTH": ServerConnection._auth,
    b"SUB": ServerConnection._sub,
    b"RDY": ServerConnection._rdy,
    b"FIN": ServerConnection._fin,
    b"REQ": ServerConnection._req,
    b"TOUCH": ServerConnection._touch,
    b"CLS": ServerConnection._cls,
    b"NOP": ServerConnection._nop,
    b"LEASE": ServerConnection._lease,
    b"PUB": ServerConnection._pub,
    b"MPUB": ServerConnection._mpub,
    b"DPUB": ServerConnection._dpub,
    b"REPL": ServerConnection._repl,
}

REPL_BODY = BodySpec("REPL", "E_BAD_BODY", "body", "body", too_big_first=False)
