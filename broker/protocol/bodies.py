"""Readers for the binary bodies that follow IDENTIFY, AUTH, PUB, DPUB and MPUB.

A reader is created once its command line has been validated. It checks each
4-byte size as soon as it is complete -- before any of the body it announces
is buffered -- and produces the command's event once the body is whole.
Sizes are read as nsqd's ``readLen`` reads them: big-endian, then cast to
``int32``, so ``0xFFFFFFFF`` is ``-1`` and fails the ``<= 0`` check.

Every reader has the same small interface, used by :class:`ServerConnection`:

* ``need``: how many bytes past the current position it needs to progress;
* ``advance(data, pos, end) -> (pos, event | None)``: consume what it can of
  ``data[pos:end]``; ``None`` means "more input needed" (:class:`MpubBody` takes
  a ``limit`` of messages too: then ``None`` with ``need`` bytes at hand means
  it stopped at the limit);
* ``eof_error()``: the error nsqd sends if the input ends now (its
  ``io.ReadFull`` fails with EOF or a read deadline).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

from .commands import Mpub, Publish
from .errors import ProtocolError
from .keys import MAX_KEY_LENGTH, cut_message
from .priorities import PRIORITY_SIZE, split_priorities

__all__ = ["BodySpec", "SizedBody", "MpubBody", "KeyedMpubBody", "one_message"]

_NO_LIMIT = 1 << 62
_LENGTH = struct.Struct(">i")
_unpack_length = _LENGTH.unpack_from
_new = object.__new__
_PUBLISH_FIELDS = Mpub.__mro__[1].__dict__  # the slots are Publish's
_set_mpub_topic = _PUBLISH_FIELDS["topic"].__set__
_set_mpub_bodies = _PUBLISH_FIELDS["bodies"].__set__
_set_mpub_keys = _PUBLISH_FIELDS["keys"].__set__
_set_mpub_priorities = _PUBLISH_FIELDS["priorities"].__set__
_set_mpub_defer = _PUBLISH_FIELDS["defer_ms"].__set__


class BodySpec(NamedTuple):
    """The wording of one command's body errors.

    nsqd words them ``<CMD> failed to read <noun> size``, ``<CMD> invalid
    <noun> size N``, ``<CMD> <big_noun> too big N > LIMIT`` and
    ``<CMD> failed to read <noun>``; IDENTIFY and AUTH test "too big" before
    "invalid", PUB and DPUB the other way round.
    """

    command: str
    code: str
    noun: str
    big_noun: str
    too_big_first: bool

    def check_size(self, size: int, limit: int) -> None:
        """Raise nsqd's error for a declared body ``size`` outside 1..``limit``."""
        if self.too_big_first:
            self._check_too_big(size, limit)
            self._check_positive(size)
        else:
            self._check_positive(size)
            self._check_too_big(size, limit)

    def _check_positive(self, size: int) -> None:
        if size <= 0:
            raise ProtocolError(self.code, f"{self.command} invalid {self.noun} size {size}")

    def _check_too_big(self, size: int, limit: int) -> None:
        if size > limit:
            raise ProtocolError(self.code, f"{self.command} {self.big_noun} too big {size} > {limit}")

    def read_size_error(self) -> ProtocolError:
        return ProtocolError(self.code, f"{self.command} failed to read {self.noun} size")

    def read_body_error(self) -> ProtocolError:
        return ProtocolError(self.code, f"{self.command} failed to read {self.noun}")


IDENTIFY_BODY = BodySpec("IDENTIFY", "E_BAD_BODY", "body", "body", too_big_first=True)
AUTH_BODY = BodySpec("AUTH", "E_BAD_BODY", "body", "body", too_big_first=True)
PUB_BODY = BodySpec("PUB", "E_BAD_MESSAGE", "message body", "message", too_big_first=False)
DPUB_BODY = BodySpec("DPUB", "E_BAD_MESSAGE", "message body", "message", too_big_first=False)
#: The whole body of an MPUB; its messages' errors name their index (see :class:`MpubBody`).
MPUB_BODY = BodySpec("MPUB", "E_BAD_BODY", "body", "body", too_big_first=False)


class SizedBody:
    """``[4-byte size][body]``; ``finish(body)`` turns the body into the event."""

    __slots__ = ("spec", "limit", "finish", "size", "need")

    def __init__(self, spec: BodySpec, limit: int, finish: Callable[[bytes], object]):
        self.spec = spec
        self.limit = limit
        self.finish = finish
        self.size = -1
        self.need = 4

    def advance(self, data: bytes, pos: int, end: int) -> tuple[int, object]:
        if self.size < 0:
            if end - pos < 4:
                return pos, None
            size = _unpack_length(data, pos)[0]
            if size <= 0 or size > self.limit:
                self.spec.check_size(size, self.limit)
            self.size = self.need = size
            pos += 4
        stop = pos + self.size
        if stop > end:
            return pos, None
        return stop, self.finish(data[pos:stop])

    def eof_error(self) -> ProtocolError:
        return self.spec.read_size_error() if self.size < 0 else self.spec.read_body_error()


def _go_div(a: int, b: int) -> int:
    """Go's integer division, which truncates toward zero."""
    q = abs(a) // b
    return -q if a < 0 else q


_BODY_SIZE, _COUNT, _MESSAGES = 0, 1, 2


class MpubBody:
    """``[4-byte size][4-byte count]`` then ``count`` x ``[4-byte size][body]``.

    As nsqd's ``readMPUB`` does, messages are read one after another from the
    stream: the declared body size is only checked (``> 0``,
    ``<= max_body_size``), it does not frame the messages. To keep memory
    bounded whatever that size claims, the bytes actually read (count field
    plus every size field and body) may not exceed ``max_body_size`` either --
    a bound nsqd lacks, which an honest client, whose declared size is the
    truth, can never hit.

    A call decodes at most ``limit`` messages, so that a body of a million tiny
    messages, received in one piece, is decoded a bounded piece at a time.

    On a connection that negotiated priorities (``prioritised``), each message is its
    priority and its body (:mod:`broker.protocol.priorities`): a message may be
    :data:`~broker.protocol.priorities.PRIORITY_SIZE` bytes longer than ``max_msg_size``,
    and the event carries the priorities cut off the bodies.
    """

    __slots__ = ("topic", "max_msg_size", "max_body_size", "phase", "count", "bodies", "total", "need",
                 "body_limit", "prioritised")

    def __init__(self, topic: str, max_msg_size: int, max_body_size: int, *, prioritised: bool = False):
        self.topic = topic
        self.body_limit = max_msg_size  # what the body itself may be, once cut
        self.prioritised = prioritised
        if prioritised:
            max_msg_size += PRIORITY_SIZE
        self.max_msg_size = max_msg_size
        self.max_body_size = max_body_size
        self.phase = _BODY_SIZE
        self.count = 0
        self.bodies: list[bytes] = []
        self.total = 4
        self.need = 4

    def advance(self, data: bytes, pos: int, end: int, limit: int = _NO_LIMIT) -> tuple[int, object]:
        if self.phase != _MESSAGES:
            pos = self._head(data, pos, end)
            if self.phase != _MESSAGES:
                return pos, None
        # The hot loop of a batch publish: locals only, one slice per message.
        bodies = self.bodies
        append = bodies.append
        index = len(bodies)
        count = min(self.count, index + limit)
        max_msg_size = self.max_msg_size
        unpack = _unpack_length
        # First the messages that are whole and within every limit, with the fewest checks:
        # none may end past what was received, nor past where the body would outgrow
        # max_body_size. The careful loop takes the first one that is not (it may only
        # need more bytes) and gives nsqd's error for it.
        first = pos
        stop_at = min(end, pos + self.max_body_size - self.total)
        while index < count:
            start = pos + 4
            if start > stop_at:
                break
            size = unpack(data, pos)[0]
            stop = start + size
            if size <= 0 or size > max_msg_size or stop > stop_at:
                break
            append(data[start:stop])
            pos = stop
            index += 1
        return self._careful(data, pos, end, index, count, self.total + pos - first)

    def _head(self, data: bytes, pos: int, end: int) -> int:
        """Read the body size and the message count, as far as ``data`` goes; the new position."""
        max_body_size = self.max_body_size
        if self.phase == _BODY_SIZE:
            if end - pos < 4:
                return pos
            size = _unpack_length(data, pos)[0]
            if size <= 0 or size > max_body_size:
                MPUB_BODY.check_size(size, max_body_size)
            pos += 4
            self.phase = _COUNT
        if end - pos < 4:
            return pos
        count = _unpack_length(data, pos)[0]
        # 4 bytes of count, then at least 5 bytes (size + 1) per message
        if count <= 0 or count > _go_div(max_body_size - 4, 5):
            raise ProtocolError("E_BAD_BODY", f"MPUB invalid message count {count}")
        self.count = count
        self.phase = _MESSAGES
        return pos + 4

    def _careful(self, data: bytes, pos: int, end: int, index: int, count: int, total: int) -> tuple[int, object]:
        """The messages from ``index`` one check at a time, each with nsqd's error; then the
        event, once all ``self.count`` are read."""
        max_msg_size, max_body_size = self.max_msg_size, self.max_body_size
        while index < count:
            if end - pos < 4:
                return self._wait(pos, total, 4)
            size = _unpack_length(data, pos)[0]
            if size <= 0:
                raise ProtocolError("E_BAD_MESSAGE", f"MPUB invalid message({index}) body size {size}")
            if size > max_msg_size:
                raise ProtocolError("E_BAD_MESSAGE", f"MPUB message too big {size} > {max_msg_size}")
            grown = total + 4 + size
            if grown > max_body_size:
                raise ProtocolError("E_BAD_BODY", f"MPUB body too big {grown} > {max_body_size}")
            start = pos + 4
            stop = start + size
            if stop > end:
                # leave the size unconsumed: it is cheap to re-read and keeps one position to resume from
                return self._wait(pos, total, 4 + size)
            self._take(data, start, stop, index)
            total = grown
            pos = stop
            index += 1
        if index < self.count:  # stopped at the limit
            return self._wait(pos, total, 4)
        return pos, self._event()

    def _take(self, data: bytes, start: int, stop: int, index: int) -> None:
        self.bodies.append(data[start:stop])

    def _event(self, keys: list[bytes] | None = None) -> object:
        # built field by field: the event's __init__ is a Python call
        event = _new(Mpub)
        _set_mpub_topic(event, self.topic)
        if self.prioritised:
            priorities, bodies = split_priorities("MPUB", self.bodies, self.body_limit)
            _set_mpub_bodies(event, bodies)
            _set_mpub_priorities(event, priorities)
        else:
            _set_mpub_bodies(event, self.bodies)
            _set_mpub_priorities(event, None)
        _set_mpub_keys(event, keys)
        _set_mpub_defer(event, 0)
        return event

    def _wait(self, pos: int, total: int, need: int) -> tuple[int, None]:
        """Stop at ``pos``, ``total`` bytes of the body read, until ``need`` bytes are at hand."""
        self.total = total
        self.need = need
        return pos, None

    def eof_error(self) -> ProtocolError:
        if self.phase == _BODY_SIZE:
            return MPUB_BODY.read_size_error()
        if self.phase == _COUNT:
            return ProtocolError("E_BAD_BODY", "MPUB failed to read message count")
        if self.need == 4:
            return ProtocolError("E_BAD_MESSAGE", f"MPUB failed to read message({len(self.bodies)}) body size")
        return ProtocolError("E_BAD_MESSAGE", "MPUB failed to read message body")


class KeyedMpubBody(MpubBody):
    """:class:`MpubBody` on a connection that negotiated keyed publishes: each message is a key
    length byte, the key and the body (:mod:`broker.protocol.keys`), cut into the two as it is
    read, and the event carries the keys. ``max_msg_size`` bounds the body; the message may be
    a key longer (and a priority, when ``prioritised``)."""

    __slots__ = ("keys", "max_body")

    def __init__(self, topic: str, max_msg_size: int, max_body_size: int, *, prioritised: bool = False):
        super().__init__(topic, max_msg_size, max_body_size, prioritised=prioritised)
        self.keys: list[bytes] = []
        self.max_body = self.max_msg_size  # the body with its priority, when there is one
        self.max_msg_size += MAX_KEY_LENGTH + 1

    def advance(self, data: bytes, pos: int, end: int, limit: int = _NO_LIMIT) -> tuple[int, object]:
        if self.phase != _MESSAGES:
            pos = self._head(data, pos, end)
            if self.phase != _MESSAGES:
                return pos, None
        add_body, add_key = self.bodies.append, self.keys.append
        index = len(self.bodies)
        count = min(self.count, index + limit)
        # a message no longer than the longest body plus its length byte cannot hold too long
        # a body, whatever its key: longer ones (near --max-msg-size) take the careful path
        fast_size = self.max_body + 1
        unpack = _unpack_length
        first = pos
        stop_at = min(end, pos + self.max_body_size - self.total)
        while index < count:  # MpubBody's fast loop, with the key cut off and checked
            key_at = pos + 5
            if key_at > stop_at:
                break
            size = unpack(data, pos)[0]
            stop = key_at - 1 + size
            length = data[key_at - 1] if size > 0 else 0
            body_at = key_at + length
            if size <= 0 or size > fast_size or stop > stop_at or length > MAX_KEY_LENGTH or body_at >= stop:
                break
            add_key(data[key_at:body_at])
            add_body(data[body_at:stop])
            pos = stop
            index += 1
        return self._careful(data, pos, end, index, count, self.total + pos - first)

    def _take(self, data: bytes, start: int, stop: int, index: int) -> None:
        key, body = cut_message("MPUB", index, data[start:stop], self.max_body)
        self.keys.append(key)
        self.bodies.append(body)

    def _event(self, keys: list[bytes] | None = None) -> object:
        return super()._event(self.keys)


def one_message(kind: type[Publish], topic: str, defer_ms: int, keyed: bool, prioritised: bool,
                max_msg_size: int) -> Callable[[bytes], Publish]:
    """What makes the event of a PUB or DPUB of ``kind`` from its body, a :class:`SizedBody`'s
    ``finish``: on a connection that negotiated keys or priorities, their prefixes are cut off
    the body and checked (nsqd's ``E_BAD_MESSAGE`` for a body that is then empty or too long)."""
    if not (keyed or prioritised):
        return partial(_plain_message, kind, topic, defer_ms)
    return partial(_cut_message, kind, topic, defer_ms, keyed, prioritised, max_msg_size)


def _plain_message(kind: type[Publish], topic: str, defer_ms: int, body: bytes) -> Publish:
    return kind(topic, [body], None, None, defer_ms)


def _cut_message(kind: type[Publish], topic: str, defer_ms: int, keyed: bool, prioritised: bool,
                 max_msg_size: int, message: bytes) -> Publish:
    """The event of a PUB or DPUB ``message`` with its key and priority cut off (see
    :func:`one_message`)."""
    keys = priorities = None
    if keyed:
        key, message = cut_message(kind.verb, 0, message, max_msg_size + (PRIORITY_SIZE if prioritised else 0))
        keys = [key]
    if prioritised:
        priorities, bodies = split_priorities(kind.verb, [message], max_msg_size)
        message = bodies[0]
    return kind(topic, [message], keys, priorities, defer_ms)
