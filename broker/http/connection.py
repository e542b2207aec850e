"""One server-side HTTP/1.x connection with no I/O: bytes in, requests out; responses in, bytes out.

The shape is h11's. Whoever does the I/O (:mod:`broker.http.server`, in a connection's task
or in the read poller's) feeds the bytes it received and asks what comes next::

    conn.receive_data(data)          # b"": the peer sent all it will
    event = conn.next_event()        # a Request, NEED_DATA or CLOSED
    data = conn.read_body(limit)     # the body of the request answered; None: NEED_DATA
    conn.send_response(response)
    out = conn.data_to_send()        # what to write, in order

and writes what :meth:`HTTPConnection.data_to_send` gives. A caller that cannot wait (the
poller's task) may instead have :meth:`HTTPConnection.answer_whole` answer, with a plain
function, the requests whose whole body is here: the same moves and bytes, in one pass.
Every decision about the bytes is made here, as Go's ``net/http`` server (which nsqd uses)
makes it:

* keep-alive: a connection stays open after a response unless the request asked for a
  close (``Connection: close``; HTTP/1.0 without ``Connection: keep-alive``), the server is
  shutting down (:attr:`HTTPConnection.closing`), or its body could not be read to its end;
  HTTP/1.0 is answered in HTTP/1.0. A response says ``Connection: close`` when it is the last;
* ``100 Continue`` goes out when a client waits for it and the body is first read (even if
  the body came anyway); a client whose body was never read leaves the stream in a state
  nobody knows, so its connection closes. Any other ``Expect`` is ``417`` and a close;
* drain: a body the handler left unread is discarded, up to :data:`MAX_DRAIN_BYTES`, before
  the response is written, so that the next request can be read; a longer one closes the
  connection, and so does a ``Content-Length`` that leaves at least that much unread;
* a head Go refuses (:mod:`broker.http.parser`), or a target with a bad escape, gets Go's
  plain-text answer and a close, the client's rest unread: :attr:`HTTPConnection.linger`
  then says the closer must let the client finish sending (else its kernel would answer
  with a reset that destroys the answer);
* a request line and headers may take ``max_header_bytes`` (:data:`MAX_HEADER_BYTES`).

The state machine, as a table (:data:`TRANSITIONS`); a move a state does not allow raises
:class:`IllegalMove` naming it:

=========  =================================================  =========
state      move                                               next state
=========  =================================================  =========
IDLE       request: a head handed out                         ANSWERING
IDLE       refuse: a head refused, an Expect failed, a bad    DONE
           target (the server's own answer queued)
IDLE       end of input, or a shutdown with nothing begun     DONE
ANSWERING  read body                                          ANSWERING
ANSWERING  respond: the connection kept                       IDLE
ANSWERING  respond and close                                  DONE
ANSWERING  drain: a response with the body left unread        DRAINING
DRAINING   respond: the body ended within the limit           IDLE
DRAINING   respond and close: the limit passed, a body error  DONE
=========  =================================================  =========

Plain functions only: nothing here awaits or touches a socket. Imported by
:mod:`broker.http.server`; imports the parser (:mod:`broker.http.parser`), the rendering
(:mod:`broker.http.render`) and the events (:mod:`broker.http.events`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from broker.core.maybe import Maybe
from broker.http.events import CLOSED, LEFT, NEED_DATA, BodyReadError, Request, Response, Signal
from broker.http.head import HeadError, ParsedRequest
from broker.http.parser import RequestParser
from broker.http.render import CONTINUE, ResponseRenderer, refusal
from broker.http.uri import DECODED, split_target

__all__ = ["HTTPConnection", "IllegalMove", "WholeAnswer", "MAX_HEADER_BYTES", "MAX_DRAIN_BYTES", "TRANSITIONS",
           "IDLE", "ANSWERING", "DRAINING", "DONE"]

log = logging.getLogger("pynsqd.http")

#: Request line plus headers: Go's ``http.DefaultMaxHeaderBytes`` (1 MiB) plus the 4 KiB
#: of slack its reader allows.
MAX_HEADER_BYTES = (1 << 20) + 4096
#: Unread request body discarded after a response so the connection can be reused
#: (Go's ``maxPostHandlerReadBytes``); more than this closes the connection.
MAX_DRAIN_BYTES = 256 * 1024

# the states
IDLE = "IDLE"  # between requests: the next one's head is awaited (or part of it came)
ANSWERING = "ANSWERING"  # a request was handed out; its body may be read, its response is awaited
DRAINING = "DRAINING"  # its response waits while the body left unread is discarded
DONE = "DONE"  # the last response is queued: write it and close

# the moves
_REQUEST = "request"
_REFUSE = "refuse"
_END = "end of input"
_READ = "read body"
_RESPOND = "respond"
_CLOSE = "respond and close"
_DRAIN = "drain"

#: state -> move -> next state; a move missing here is illegal in that state.
TRANSITIONS: dict[str, dict[str, str]] = {
    IDLE: {_REQUEST: ANSWERING, _REFUSE: DONE, _END: DONE},
    ANSWERING: {_READ: ANSWERING, _RESPOND: IDLE, _CLOSE: DONE, _DRAIN: DRAINING},
    DRAINING: {_RESPOND: IDLE, _CLOSE: DONE},
    DONE: {},
}

#: Where the moves of every request lead, read off the table once (a lookup per move would
#: cost more than the rest of the bookkeeping of a request); DRAINING moves as ANSWERING does.
_AFTER_REQUEST = TRANSITIONS[IDLE][_REQUEST]
_AFTER_RESPONSE = TRANSITIONS[ANSWERING][_RESPOND]
_AFTER_CLOSE = TRANSITIONS[ANSWERING][_CLOSE]

_EXPECTATION_FAILED = Response(417)
_BAD_REQUEST = HeadError(400)
#: Methods decoded once each: at most this many are kept.
_CACHED_METHODS = 64
_METHODS: dict[bytes, str] = {}
_RENDERER = ResponseRenderer()
_new_tuple = tuple.__new__
#: What :attr:`HTTPConnection._parsed` holds while no request is being answered.
_NO_REQUEST = ParsedRequest()


#: What :meth:`HTTPConnection.answer_whole` answers with: given a request and its whole body,
#: the response, an awaitable of it, or None to leave the request. Never raises.
WholeAnswer = Callable[[Request, bytes], Maybe[Response] | None]


class IllegalMove(RuntimeError):
    """The connection's owner asked for something its state does not allow (the message
    names the move and the state): a fault of the owner, never of the peer."""


class HTTPConnection:
    """The server's side of one HTTP/1.x connection, with no I/O.

    ``remote`` names the peer in :attr:`Request.remote` and in the log; ``max_header_bytes``
    bounds a head, ``max_drain_bytes`` what is discarded of an unread body; ``renderer``
    renders the responses (one per server shares its cache). :attr:`state` is one
    of :data:`TRANSITIONS`'s; :attr:`request` is the request being answered (ANSWERING and
    DRAINING). The owner sets :attr:`closing` when the server shuts down: an idle connection
    then ends (:data:`CLOSED`), a busy one after its response, which says so.
    """

    __slots__ = ("parser", "remote", "state", "closing", "linger", "output", "output_bytes", "request",
                 "_ready", "_max_drain_bytes", "_renderer", "_parsed", "_response", "_dropped")

    def __init__(self, remote: str = "", max_header_bytes: int = MAX_HEADER_BYTES,
                 renderer: ResponseRenderer = _RENDERER, max_drain_bytes: int = MAX_DRAIN_BYTES):
        self.parser = RequestParser(max_header_bytes)
        self._ready = self.parser.ready
        self.remote = remote
        self._max_drain_bytes = max_drain_bytes
        self.state = IDLE
        self.closing = False
        #: closing must wait for the client to stop sending (it may be sending still)
        self.linger = False
        #: bytes queued for the peer, in order (see :meth:`data_to_send`)
        self.output: list[bytes] = []
        self.output_bytes = 0  # of the responses in output
        self.request: Request | None = None
        self._renderer = renderer
        # the request being answered, as read, with how its body was read (_NO_REQUEST: none): a
        # read that met the end of input within a Content-Length body (cut_short) is taken by
        # Go's reader as the body's end (an error for the handler), so its answer does not
        # announce a close
        self._parsed = _NO_REQUEST
        self._response: Response | None = None  # the response waiting for the drain
        self._dropped = 0  # bytes the drain discarded

    # ------------------------------------------------------------------ input

    def receive_data(self, data: bytes) -> None:
        """Take bytes the peer sent; ``b""`` says it will send no more."""
        if data:
            self.parser.feed(data)
        else:
            self.parser.eof()  # a head cut short is still answered

    @property
    def idle(self) -> bool:
        """Between requests with nothing of the next one received: a wait for input here may
        end at shutdown."""
        return self.state is IDLE and self.parser.idle

    def next_event(self) -> Request | Signal:
        """What comes next: a :class:`Request` to answer (:meth:`send_response`), the
        :data:`NEED_DATA` signal (feed more, or the end of input), or :data:`CLOSED` (write
        what :meth:`data_to_send` gives, then close). A request the server answers itself (a
        refused head, an Expect it cannot meet, a bad target) queues that answer and gives
        :data:`CLOSED`. Raises :class:`IllegalMove` while a request waits for its response."""
        if self.state is not IDLE:
            signal = self._not_idle()
            if signal is not None:
                return signal
        ready = self._ready
        if not ready:
            parser = self.parser
            if parser.failed or (self.closing and parser.idle):
                self._move(_END)
                return CLOSED
            return NEED_DATA
        parsed = ready.popleft()
        if type(parsed) is not ParsedRequest or parsed.expect_failed:
            return self._refuse(parsed)
        target = DECODED.get(parsed.target)
        if target is None:  # not decoded yet, or a bad escape
            target = split_target(parsed.target)
            if target is None:
                return self._refuse(_BAD_REQUEST)
        method = _METHODS.get(parsed.method)
        if method is None:
            method = _method(parsed.method)
        # tuple.__new__: Request(...) costs a Python frame more, per request
        request = self.request = _new_tuple(Request, (method, target[0], target[1], parsed.headers,
                                                      parsed.content_length, self.remote))
        self._parsed = parsed
        self.state = _AFTER_REQUEST
        return request

    def answer_whole(self, answer: WholeAnswer, wait_for: int) -> Signal | Awaitable[Response]:
        """Answer with ``answer`` each request whose whole body is here, one after another, as
        :meth:`next_event` and :meth:`send_response` would (the same moves, the same bytes),
        never waiting: for a caller that cannot wait, which answers at once what it can.

        ``answer`` is given the request and its whole body, and returns the response, an
        awaitable of it, or None to leave the request to :meth:`next_event`. This stops at:

        * a request whose body is still arriving, announced as at most ``wait_for`` bytes:
          :data:`NEED_DATA` (feed the rest; it is answered here then);
        * any other request it does not answer at once (its body is larger or to be read
          with ``100 Continue``, the server answers it itself, ``answer`` leaves it): :data:`LEFT`,
          the request untouched, for :meth:`next_event`;
        * an awaitable from ``answer``: returned, the request handed out (ANSWERING), its
          response for :meth:`send_response` once awaited;
        * no request ready (:data:`NEED_DATA`), or the connection over (:data:`CLOSED`), as
          :meth:`next_event` says.
        """
        if self.state is not IDLE:
            signal = self._not_idle()
            if signal is not None:
                return signal
        ready = self._ready
        output = self.output
        render = self._renderer.render
        while ready:
            parsed = ready[0]
            if type(parsed) is not ParsedRequest or parsed.expect_failed or parsed.expect_continue:
                return LEFT
            if not parsed.complete:
                content_length = parsed.content_length
                if parsed.error is None and content_length is not None and content_length <= wait_for:
                    return NEED_DATA
                return LEFT
            target = DECODED.get(parsed.target)
            if target is None:
                target = split_target(parsed.target)
                if target is None:
                    return LEFT  # next_event refuses it
            method = _METHODS.get(parsed.method)
            if method is None:
                method = _method(parsed.method)
            request = _new_tuple(Request, (method, target[0], target[1], parsed.headers, parsed.content_length,
                                           self.remote))
            parts = parsed.parts
            answered = answer(request, parts[0] if len(parts) == 1 else b"".join(parts))
            if type(answered) is not Response:
                if answered is None:
                    return LEFT
                ready.popleft()
                self.request = request
                self._parsed = parsed
                self.state = _AFTER_REQUEST
                return answered  # type: ignore[return-value]  # an awaitable
            # the moves request and respond at once: IDLE -> ANSWERING -> IDLE (or DONE)
            ready.popleft()
            close = self.closing or not parsed.keep_alive
            data = render(answered, parsed.http10, close, parsed.method == b"HEAD")
            output.append(data)
            if close:
                self.state = _AFTER_CLOSE
                return CLOSED
            self.output_bytes += len(data)
        parser = self.parser
        if parser.failed or (self.closing and parser.idle):
            self._move(_END)
            return CLOSED
        return NEED_DATA

    def _not_idle(self) -> Signal | None:
        """:meth:`next_event` out of IDLE: the drain goes on (None once it is over and the
        connection is IDLE again)."""
        state = self.state
        if state is DRAINING:
            if not self._drain():
                return NEED_DATA
        elif state is ANSWERING:
            raise IllegalMove(f"next_event in state {state}: the request waits for its response")
        return CLOSED if self.state is DONE else None

    def _refuse(self, refused: ParsedRequest | HeadError) -> Signal:
        """Queue the server's own answer to a request it does not hand out, and close."""
        if type(refused) is HeadError:
            log.debug("HTTP: bad request from %s: %s %s", self.remote, refused.status, refused.text)
            self.output.append(refusal(refused))
            self.linger = True
        else:
            assert isinstance(refused, ParsedRequest)  # with an Expect it cannot meet
            self.output.append(self._renderer.render(_EXPECTATION_FAILED, refused.http10, True, False))
            self.linger = not refused.complete
        self._move(_REFUSE)
        return CLOSED

    # ------------------------------------------------------------------ the body

    def read_body(self, limit: int) -> bytes | None:
        """Up to ``limit`` bytes of the body of the request being answered (fewer only if the
        body is shorter), or None when more must be received first (:data:`NEED_DATA`).

        Like Go's ``io.LimitReader``: a result of exactly ``limit`` bytes means the body may
        be longer; callers pass their maximum plus one to detect that. The first read queues
        ``100 Continue`` for a client that waits for it. Raises :class:`BodyReadError` if the
        body cannot be read, :class:`IllegalMove` when no request is being answered.
        """
        if self.state is not ANSWERING:
            self._move(_READ)  # raises
        parsed = self._parsed
        if parsed.all_taken or limit <= 0:
            return b""
        if parsed.expect_continue:  # as Go: on the first read, even if the body came anyway
            parsed.expect_continue = False
            self.output.append(CONTINUE)
        if parsed.buffered < limit and not parsed.complete:
            if parsed.error is not None:
                parsed.cut_short = parsed.truncated
                raise BodyReadError(parsed.error)
            return None
        parts = parsed.parts
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        parts.clear()
        if len(data) > limit:
            parts.append(data[limit:])
            data = data[:limit]
        parsed.buffered -= len(data)
        parsed.taken += len(data)
        if parsed.complete and not parsed.buffered:
            parsed.all_taken = True
        return data

    def send_failed(self) -> None:
        """What was queued could not be written (the peer is gone): the body being read ends
        with an error."""
        if self._parsed is not _NO_REQUEST:
            self._parsed.error = "connection closed"

    # ------------------------------------------------------------------ output

    def send_response(self, response: Response) -> None:
        """Queue the response to the request being answered, once what is left of its body is
        discarded (DRAINING until then: see :meth:`next_event`). Raises :class:`IllegalMove`
        when no request waits for one."""
        if self.state is not ANSWERING:
            raise IllegalMove(f"send_response in state {self.state}")
        parsed = self._parsed
        if parsed.complete:
            close = self.closing or not parsed.keep_alive
        else:
            decided = self._close_or_drain(response, parsed)
            if decided is None:
                return
            close = decided
        # as _respond() (one call less per request)
        data = self._renderer.render(response, parsed.http10, close, parsed.method == b"HEAD")
        self.output.append(data)
        if close:
            self.linger = not parsed.complete
            self.state = _AFTER_CLOSE
        else:
            self.output_bytes += len(data)
            self.state = _AFTER_RESPONSE
        self._parsed = _NO_REQUEST

    def _close_or_drain(self, response: Response, parsed: ParsedRequest) -> bool | None:
        """Whether a response whose body did not all come closes the connection; None when the
        rest of the body is to be discarded first (DRAINING)."""
        if self.closing or not parsed.keep_alive:
            return True
        if parsed.cut_short:
            return False  # the handler saw the body end with the input: no close announced
        if parsed.error is not None:
            return True
        content_length = parsed.content_length
        if parsed.expect_continue:
            return True  # the client may or may not send the body now: the stream's state is unknown
        if content_length is not None and content_length - parsed.taken >= self._max_drain_bytes:
            return True
        self._response = response
        self._dropped = 0
        self._move(_DRAIN)
        return None

    def _drain(self) -> bool:
        """Discard what arrived of the body left unread; True once the response is queued."""
        parsed = self._parsed
        response = self._response
        assert response is not None
        self._dropped += parsed.buffered
        parsed.parts.clear()
        parsed.buffered = 0
        if parsed.complete:
            self._respond(response, parsed, False)
        elif parsed.error is not None or self._dropped > self._max_drain_bytes:
            self._respond(response, parsed, True)
        else:
            return False
        self._response = None
        return True

    def _respond(self, response: Response, parsed: ParsedRequest, close: bool) -> None:
        data = self._renderer.render(response, parsed.http10, close, parsed.method == b"HEAD")
        self.output.append(data)
        # ANSWERING and DRAINING (whose responses come here) both move alike
        if close:
            self.linger = not parsed.complete
            self.state = _AFTER_CLOSE
        else:
            self.output_bytes += len(data)
            self.state = _AFTER_RESPONSE
        self._parsed = _NO_REQUEST

    def data_to_send(self) -> bytes:
        """All the bytes queued for the peer, in order, taken from :attr:`output`."""
        output = self.output
        data = b"".join(output)  # one item: that very object, not a copy
        output.clear()
        self.output_bytes = 0
        return data

    def put_back(self, data: bytes) -> None:
        """Queue again, first, the end of what :meth:`data_to_send` gave that the peer did not take."""
        self.output.insert(0, data)

    def _move(self, move: str) -> None:
        try:
            self.state = TRANSITIONS[self.state][move]
        except KeyError:
            raise IllegalMove(f"{move} in state {self.state}") from None


def _method(raw: bytes) -> str:
    """A request method as text, kept for the next request that uses it."""
    if len(_METHODS) >= _CACHED_METHODS:
        _METHODS.clear()
    method = _METHODS[raw] = raw.decode("ascii", "replace")
    return method
