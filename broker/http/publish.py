"""nsqd's publishing endpoints: ``POST /pub`` and ``POST /mpub``.

Bodies are read with limits: a ``Content-Length`` above ``--max-msg-size``
(``/pub``) or ``--max-body-size`` (``/mpub``) is refused with 413 before any of
the body is read. Messages are queued by :meth:`Broker.publish`, as the
TCP ``PUB``/``MPUB``/``DPUB`` commands queue them. An ``/mpub`` body is split into
messages a bounded piece at a time, with a checkpoint between pieces: 5 MB of one-byte
lines are millions of messages, and the other connections must not wait for them all.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Awaitable, Iterator
from typing import TYPE_CHECKING, NoReturn

import trio

from broker.core.host import CopiesRefused
from broker.core.maybe import Maybe
from broker.core.publishing import PublishStopped
from broker.gocompat import MILLISECOND, parse_int64, to_ns, wrap_int64
from broker.http.query import first, parse_bool, query_params, request_params
from broker.http.responses import OK, APIError
from broker.http.router import Endpoint
from broker.http.server import BodyReadError, Request, RequestBody, Response
from broker.http.targets import new_topic, topic_name
from broker.protocol import Mpub, ProtocolError, Pub, Publish
from broker.protocol.bodies import MpubBody
from broker.protocol.keys import MAX_KEY_LENGTH, split_key
from broker.protocol.priorities import MAX_PRIORITY

if TYPE_CHECKING:
    from broker.core.broker import Broker
    from broker.core.topic import Topic

__all__ = ["PublishEndpoints", "read_text_mpub", "read_binary_mpub"]

log = logging.getLogger("pynsqd.http")

_LENGTH = struct.Struct(">i")
#: The header of the answer to a keyed publish: how many messages were duplicates.
DUPLICATES_HEADER = b"X-Duplicates"
#: Query strings of ``/pub`` whose parameters are kept parsed: at most this many, of at
#: most this length (publishers repeat theirs, so the parse is done once per publisher).
_CACHED_QUERIES = 1024
_CACHED_QUERY_LENGTH = 256
#: Messages of a binary ``/mpub`` decoded between checkpoints.
_BINARY_PIECE = 8192
#: Bytes of a text ``/mpub`` split into lines between checkpoints (a longer line is split whole).
_TEXT_PIECE = 32 * 1024


class PublishEndpoints:
    """``/pub`` and ``/mpub`` for one broker."""

    def __init__(self, broker: Broker):
        self.broker = broker
        self._pub_queries: dict[str, tuple[str, str | None]] = {}

    def routes(self) -> dict[tuple[str, str], Endpoint]:
        """This group's entries for the :class:`~broker.http.router.Router`."""
        return {("POST", "/pub"): self.pub, ("POST", "/mpub"): self.mpub}

    async def pub(self, request: Request, body: RequestBody, param: str) -> Response:
        """``POST /pub?topic=&defer=&key=&priority=``: the body is one message."""
        max_size = self.broker.options.max_msg_size
        if request.content_length is not None and request.content_length > max_size:
            raise APIError(413, "MSG_TOO_BIG")
        try:
            data = await body.read(max_size + 1)
        except BodyReadError:
            raise APIError(500, "INTERNAL_ERROR") from None
        answer = self.pub_whole(request, data)
        return answer if isinstance(answer, Response) else await answer

    def pub_whole(self, request: Request, data: bytes) -> Maybe[Response]:
        """:meth:`pub` for a request whose whole body is ``data``: the answer, or what to
        await for it (a durable publish, the first to a new topic). Raises :class:`APIError`
        as :meth:`pub` does."""
        opts = self.broker.options
        max_size = opts.max_msg_size
        if len(data) > max_size or (request.content_length is not None and request.content_length > max_size):
            raise APIError(413, "MSG_TOO_BIG")
        if not data:
            raise APIError(400, "MSG_EMPTY")
        raw_query = request.raw_query
        keys = None
        priority = None
        if "key=" in raw_query or "priority=" in raw_query:
            # a keyed publish: the key makes each query new, so it is not cached (nor a rare priority)
            params = query_params(raw_query)
            name, defer = topic_name(params), first(params, "defer")
            key = first(params, "key")
            if key is not None:
                keys = [_key(key.encode("utf-8", "surrogateescape"))]
            priority = _priority(params)
        else:
            name, defer = self._pub_query(raw_query)
        broker = self.broker
        topic = broker.topics.get(name)
        if topic is None:
            topic = broker.get_topic(name)
        defer_ns = 0
        if defer is not None:
            try:
                defer_ns = wrap_int64(parse_int64(defer) * MILLISECOND)
            except ValueError:
                raise APIError(400, "INVALID_DEFER") from None
            if defer_ns < 0 or defer_ns > to_ns(opts.max_req_timeout):
                raise APIError(400, "INVALID_DEFER")
        priorities = None if priority is None else [priority]
        return self._put(topic, Pub(name, [data], keys, priorities, defer_ns // MILLISECOND))

    def _pub_query(self, raw_query: str) -> tuple[str, str | None]:
        """The topic name (valid) and the ``defer`` value of a ``/pub`` query; raises
        :class:`APIError` as nsqd answers a bad one."""
        found = self._pub_queries.get(raw_query)
        if found is None:
            params = query_params(raw_query)
            found = (topic_name(params), first(params, "defer"))
            if len(raw_query) <= _CACHED_QUERY_LENGTH:
                if len(self._pub_queries) >= _CACHED_QUERIES:
                    self._pub_queries.clear()
                self._pub_queries[raw_query] = found
        return found

    async def mpub(self, request: Request, body: RequestBody, param: str) -> Response:
        """``POST /mpub?topic=&binary=&keyed=&priority=``: one message per line, or the binary
        ``MPUB`` body; ``priority`` is every message's."""
        opts = self.broker.options
        max_body = opts.max_body_size
        if request.content_length is not None and request.content_length > max_body:
            raise APIError(413, "BODY_TOO_BIG")
        params = request_params(request)
        topic = new_topic(self.broker, params)
        binary = False
        values = params.get("binary")
        if values is not None:
            given = parse_bool(values[0])
            if given is None:
                log.warning("deprecated value '%s' used for /mpub binary param", values[0])
            binary = True if given is None else given
        keyed = parse_bool(first(params, "keyed")) is True
        priority = _priority(params)
        # a keyed message is its key and its body: the body alone is bounded by --max-msg-size
        max_message = opts.max_msg_size + (MAX_KEY_LENGTH + 1 if keyed else 0)
        try:
            data = await body.read(max_body + 1)
        except BodyReadError:
            raise APIError(500, "INTERNAL_ERROR") from None
        if binary:
            if len(data) > max_body:
                raise APIError(413, "BODY_TOO_BIG")
            bodies = await read_binary_mpub(data, max_message, max_body)
        else:
            bodies = await read_text_mpub(data, max_message, max_body)
        keys = None
        if keyed:
            keys, bodies = _split_keyed(bodies, binary, opts.max_msg_size)
        priorities = None if priority is None else [priority] * len(bodies)
        answer = self._put(topic, Mpub(topic.name, bodies, keys, priorities))
        return answer if isinstance(answer, Response) else await answer

    def _put(self, topic: Topic, request: Publish) -> Maybe[Response]:
        """Queue ``request`` as one batch, as the TCP publishes are queued: the answer, or what
        to await for it (when the publish must be awaited); 503 EXITING if that fails, as nsqd
        answers every failed put.

        A keyed publish's answer has an ``X-Duplicates`` header: how many of the messages were
        duplicates of messages the topic stored (and were not stored).
        """
        broker = self.broker
        if broker.exiting:
            raise APIError(503, "EXITING")
        if not request.bodies:
            return OK
        try:
            duplicates, pending = broker.publish(topic, request)
        except Exception as exc:
            _put_failed(topic, exc)
        if pending is not None:
            return _stored(topic, pending, request.keys is not None, duplicates)
        return _answer(request.keys is not None, duplicates)


def _answer(keyed: bool, duplicates: int) -> Response:
    return OK._replace(headers=(*OK.headers, (DUPLICATES_HEADER, b"%d" % duplicates))) if keyed else OK


async def _stored(topic: Topic, pending: Awaitable[int | None], keyed: bool, duplicates: int) -> Response:
    """The answer once ``pending`` (a publish) is done (it may have found more duplicates: keys
    other nodes know); 503 EXITING if it fails."""
    try:
        duplicates += await pending or 0
    except Exception as exc:
        _put_failed(topic, exc)
    return _answer(keyed, duplicates)


def _put_failed(topic: Topic, exc: Exception) -> NoReturn:
    if isinstance(exc, PublishStopped):  # a topic deleted meanwhile: nsqd answers it without a log line
        raise APIError(503, "EXITING") from None
    log.error("HTTP: publish to %s failed: %s", topic.name, exc)
    if isinstance(exc, CopiesRefused):  # --replicas: too few nodes took a copy
        raise APIError(503, f"PUB_FAILED {exc}") from None
    raise APIError(503, "EXITING") from None


def _priority(params: dict[str, list[str]]) -> int | None:
    """The ``priority`` of a query: ``400 INVALID_PRIORITY`` unless a number from 0 to 4294967295."""
    value = first(params, "priority")
    if value is None:
        return None
    if not value.isdigit() or not value.isascii() or int(value) > MAX_PRIORITY:
        raise APIError(400, "INVALID_PRIORITY")
    return int(value)


def _key(key: bytes) -> bytes:
    """A key from a query or an ``/mpub`` line; ``400 INVALID_KEY`` unless 1 to 128 bytes."""
    if not key or len(key) > MAX_KEY_LENGTH:
        raise APIError(400, "INVALID_KEY")
    return key


def _split_keyed(messages: list[bytes], binary: bool, max_msg_size: int) -> tuple[list[bytes], list[bytes]]:
    """The keys and bodies of a keyed ``/mpub``: a binary message is a key length byte, the key and
    the body (as over TCP); a line is the key, a space and the body."""
    keys: list[bytes] = []
    bodies: list[bytes] = []
    for message in messages:
        if binary:
            try:
                key, body = split_key(message)
            except ValueError:
                raise APIError(400, "INVALID_KEY") from None
        else:
            key, space, body = message.partition(b" ")
            if not space:
                raise APIError(400, "INVALID_KEY")
            key = _key(key)
        if not body:
            raise APIError(400, "MSG_EMPTY")
        if len(body) > max_msg_size:
            raise APIError(413, "MSG_TOO_BIG")
        keys.append(key)
        bodies.append(body)
    return keys, bodies


async def read_text_mpub(data: bytes, max_msg_size: int, max_body_size: int) -> list[bytes]:
    """nsqd's text ``/mpub``: one message per line, empty lines skipped.

    ``data`` is at most ``max_body_size + 1`` bytes; reaching that many is
    ``BODY_TOO_BIG``, unless an earlier line already was ``MSG_TOO_BIG`` (nsqd checks
    line by line, in order). The lines are split a piece at a time, with a checkpoint between.
    """
    if len(data) > max_body_size:
        # The line holding the last byte is where nsqd notices the size; the lines
        # before it are checked first.
        end = data.rfind(b"\n", 0, len(data) - 1)
        for index, blocks in enumerate(_line_pieces(data, end) if end >= 0 else ()):
            if index:
                await trio.lowlevel.checkpoint()
            if max(map(len, blocks)) > max_msg_size:
                raise APIError(413, "MSG_TOO_BIG")
        raise APIError(413, "BODY_TOO_BIG")
    bodies: list[bytes] = []
    for index, blocks in enumerate(_line_pieces(data, len(data))):
        if index:
            await trio.lowlevel.checkpoint()
        if max(map(len, blocks)) > max_msg_size:
            raise APIError(413, "MSG_TOO_BIG")
        bodies.extend(filter(None, blocks))
    return bodies


def _line_pieces(data: bytes, end: int) -> Iterator[list[bytes]]:
    """``data[:end].split(b"\\n")``, about :data:`_TEXT_PIECE` bytes of lines at a time."""
    start = 0
    while True:
        cut = data.find(b"\n", min(start + _TEXT_PIECE, end), end)
        if cut < 0:
            yield data[start:end].split(b"\n")
            return
        yield data[start:cut].split(b"\n")
        start = cut + 1


async def read_binary_mpub(data: bytes, max_msg_size: int, max_body_size: int) -> list[bytes]:
    """nsqd's binary ``/mpub``: the TCP ``MPUB`` body from its message count on.

    The TCP command's parser reads it, so the checks are the same; its errors
    become 413 with the TCP code less ``E_`` (``BAD_BODY`` for the count,
    ``BAD_MESSAGE`` for a message). Bytes after the last message are ignored, as
    nsqd never reads them. The messages are decoded :data:`_BINARY_PIECE` at a time,
    with a checkpoint between.
    """
    reader = MpubBody("", max_msg_size, max_body_size)
    end = len(data)
    try:
        # the HTTP body lacks the TCP body's size field: announce the size it has
        reader.advance(_LENGTH.pack(end), 0, _LENGTH.size)
        pos, event = reader.advance(data, 0, end, _BINARY_PIECE)
        while event is None and end - pos >= reader.need:  # stopped at the piece's end
            await trio.lowlevel.checkpoint()
            pos, event = reader.advance(data, pos, end, _BINARY_PIECE)
        if not isinstance(event, Mpub):
            raise reader.eof_error()
    except ProtocolError as err:
        raise APIError(413, err.code.removeprefix("E_")) from None
    return event.bodies
