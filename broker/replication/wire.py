"""What nodes send each other inside ``REPL`` bodies (:mod:`broker.protocol.replica`), as typed
requests checked before anything acts on them.

A ``REPL`` body is one msgpack array ``[seq, [request, ...]]``; the peer answers each with
one response frame ``[seq, error, extra]`` (error None when every request was applied).
Requests are arrays whose first item is their kind:

======================================  ==================================================
``[HELLO]``, ``[HELLO, {"lost_memory":  :class:`Hello`: the sender (re)connected: the
true}]``                                answer's ``extra`` is ``[{topic: [id, ...]},
                                        {origin: {topic: [id, ...]}}, {topic: count}]``:
                                        the sender's messages the peer took over while the
                                        sender was gone, all it took over from any node,
                                        and how many copies of the sender's messages it
                                        holds, by topic.
                                        ``lost_memory``: the sender crashed without
                                        ``--durable``; the peer first takes over its copies
``[ADD, topic, holders, ids, entries]``  :class:`Add`: hold copies of these messages
                                        (answered once they are stored, fsync'd with
                                        ``--durable``); ``holders`` starts with the sender;
                                        ``entries`` is their entries packed as one msgpack
                                        array, which the holder keeps as it is
``[FIN, topic, channel, [id, ...]]``    :class:`Fin`: the channel finished them
``[DROP, topic, [id, ...]]``            :class:`Drop`: forget these copies (their publish
                                        failed)
``[CHANNELS, topic, [channel, ...]]``   :class:`Channels`: the topic's channels on the sender
``[TAKEN, origin, topic, [id, ...]]``   :class:`Taken`: the sender took over these copies
                                        of ``origin``
``[FORGET, topic, [id, ...]]``          :class:`Forget`: the sender learnt (in a HELLO's
                                        answer) that the receiver took these over from it,
                                        and skips them: the receiver need not say so again
``[GONE, node]``                        :class:`Gone`: does the receiver reach ``node``? The
                                        answer's ``extra`` is ``[reachable, seconds since it
                                        last heard from it or nil]`` (comes alone in its body)
``[KEYS, topic, [key, ...]]``           :class:`Keys`: which of these publish keys of the
                                        topic does the receiver know (stored within their
                                        dedup window, by it or by a node whose copies it
                                        holds)? The answer's ``extra`` is ``{topic: [key,
                                        ...]}``, the known keys of every KEYS of the body,
                                        each looked up where it stands among the body's
                                        requests (a KEYS before the ADD of the same publish
                                        does not find that ADD's keys)
``[UPDATE, topic, channel, [id, ...],   :class:`Update`: where these messages stand in the
attempts, due_ns]``                     channel (delivered, or back in its queue): their
                                        attempts and due times (0: ready), a column each
                                        (one value for all, or one per id)
``[HOLDS, topic, [id, ...]]``,          :class:`Holds`: which of these copies of the sender's
``[HOLDS, topic, [id, ...], holders]``  messages does the receiver hold? The answer's
                                        ``extra`` is one boolean per id. With ``holders``
                                        (the sender first, the receiver among the others):
                                        those it holds are held by ``holders`` from now on
                                        (answered once that is stored, as an ADD is). Comes
                                        alone in its body (see :mod:`.recopy`)
======================================  ==================================================

An ADD of keyed messages carries two more fields, ``keys`` (one per id, ``b""`` for an
unkeyed message) and ``expires`` (when each key's dedup window ends, in nanoseconds since
the epoch: one for all, or one each): the holder remembers the keys until then, so that a
retry of the publish on any node that reaches it is known as a duplicate after the origin
is gone.

An entry is ``[id, body, timestamp, attempts, due_ns, priority, done]``: a message as the
core holds it, and the channels that finished it already (None: none). An ADD carries its
entries by columns (:func:`pack_entries`).

:func:`decode_requests` checks every field of every request of a body (types, topic and
channel names, id sizes, counts, each entry's body against ``--max-msg-size``) and raises
:class:`WireError` for the first that is wrong, before any of them is applied or written:
what a peer sends is held to what a client may send.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from broker.core.message import Message
from broker.protocol.frames import MAX_ATTEMPTS
from broker.protocol.keys import MAX_KEY_LENGTH
from broker.protocol.names import is_valid_name
from broker.protocol.priorities import MAX_PRIORITY
from broker.protocol.replica import is_valid_node_id

__all__ = ["HELLO", "ADD", "FIN", "DROP", "CHANNELS", "TAKEN", "FORGET", "GONE", "KEYS", "UPDATE", "Hello", "Add", "Fin",
           "Drop", "Channels", "Taken", "Forget", "Gone", "Keys", "Update",
           "check_update", "packed_column", "unpacked_column",
           "HOLDS", "Holds", "comes_alone",
           "Request", "WireLimits", "encode_request", "decode_request", "decode_requests", "pack", "unpack",
           "pack_entries", "unpack_entries", "check_entries", "check_topic", "check_channel", "check_channels",
           "check_node", "check_ids", "check_holders", "message_of", "WireError"]

HELLO, ADD, FIN, DROP, CHANNELS, TAKEN, FORGET, GONE, KEYS, UPDATE = range(1, 11)
HOLDS = 11

#: Ids one request names at most (a FIN batch of a busy channel, an ADD of a large MPUB).
MAX_IDS = 1 << 20
#: Ids a HELLO's answer names for one topic at most (a frame of 64 MiB holds about 3.5 million).
MAX_ANSWER_IDS = 1 << 22
#: Requests one REPL body carries at most.
MAX_REQUESTS = 1 << 16
#: Nodes that hold one message at most.
MAX_HOLDERS = 64
#: Channels one topic has at most, as one node reports them.
MAX_CHANNELS = 1 << 16
_ID_SIZE = 16
INT64_MAX = (1 << 63) - 1


class WireError(ValueError):
    """Bytes that are not what a peer sends; the message says what is wrong, ``seq`` which
    ``REPL`` body it was in (0: not known)."""

    seq = 0


@dataclass(frozen=True, slots=True)
class WireLimits:
    """What a request may carry: bodies up to ``max_msg_size`` bytes (``--max-msg-size``)."""

    max_msg_size: int


@dataclass(frozen=True, slots=True)
class Hello:
    lost_memory: bool = False


@dataclass(frozen=True, slots=True)
class Add:
    topic: str
    holders: tuple[str, ...]
    ids: list[bytes]
    entries: bytes
    #: the channels that finished each already (from the entries; None: none did)
    dones: list[list[str] | None] | None = None
    #: each message's publish key (``b""``: none; None: no message has one), and when the
    #: keys' dedup window ends (one for all, or one each)
    keys: list[bytes] | None = None
    expires: int | list[int] = 0


@dataclass(frozen=True, slots=True)
class Fin:
    topic: str
    channel: str
    ids: list[bytes]


@dataclass(frozen=True, slots=True)
class Update:
    """Where messages of a channel stand: delivered (their attempts counted, due 0) or back in
    its queue, ready (due 0) or deferred until ``dues`` (wall-clock ns); one value per id."""

    topic: str
    channel: str
    ids: list[bytes]
    attempts: list[int]
    dues: list[int]


@dataclass(frozen=True, slots=True)
class Drop:
    topic: str
    ids: list[bytes]


@dataclass(frozen=True, slots=True)
class Channels:
    topic: str
    channels: list[str]


@dataclass(frozen=True, slots=True)
class Gone:
    node: str


@dataclass(frozen=True, slots=True)
class Forget:
    topic: str
    ids: list[bytes]


@dataclass(frozen=True, slots=True)
class Keys:
    topic: str
    keys: list[bytes]


@dataclass(frozen=True, slots=True)
class Taken:
    origin: str
    topic: str
    ids: list[bytes]


@dataclass(frozen=True, slots=True)
class Holds:
    topic: str
    ids: list[bytes]
    #: None: a question only; else those held are held by these nodes from now on
    holders: tuple[str, ...] | None = None


Request = Hello | Add | Fin | Drop | Channels | Taken | Forget | Gone | Keys | Update | Holds


def comes_alone(request: Request) -> bool:
    """Whether ``request`` is answered with an ``extra`` of its own, so comes alone in its body."""
    return type(request) in (Hello, Gone, Holds)


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def unpack(data: bytes) -> Any:
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False, max_array_len=MAX_ANSWER_IDS,
                               max_map_len=MAX_CHANNELS)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:  # TypeError: a list or map as a key
        raise WireError(f"not msgpack: {exc}") from exc


def encode_request(request: Request) -> list:
    """The wire form of ``request``."""
    if type(request) is Add:
        if request.keys is not None:
            return [ADD, request.topic, list(request.holders), request.ids, request.entries, request.keys,
                    request.expires]
        return [ADD, request.topic, list(request.holders), request.ids, request.entries]
    if type(request) is Keys:
        return [KEYS, request.topic, request.keys]
    if type(request) is Fin:
        return [FIN, request.topic, request.channel, request.ids]
    if type(request) is Drop:
        return [DROP, request.topic, request.ids]
    if type(request) is Channels:
        return [CHANNELS, request.topic, request.channels]
    if type(request) is Taken:
        return [TAKEN, request.origin, request.topic, request.ids]
    if type(request) is Forget:
        return [FORGET, request.topic, request.ids]
    if type(request) is Gone:
        return [GONE, request.node]
    if type(request) is Update:
        return [UPDATE, request.topic, request.channel, request.ids, packed_column(request.attempts),
                packed_column(request.dues)]
    if type(request) is Hello:
        return [HELLO, {"lost_memory": True}] if request.lost_memory else [HELLO]
    if type(request) is Holds:
        asked = [HOLDS, request.topic, request.ids]
        return asked if request.holders is None else [*asked, list(request.holders)]
    raise TypeError(f"not a request: {request!r}")


# ---------------------------------------------------------------- checks


def check_topic(value: object) -> str:
    if type(value) is not str or not is_valid_name(value):
        raise WireError(f"bad topic name {value!r:.80}")
    return value


def check_channel(value: object) -> str:
    if type(value) is not str or not is_valid_name(value):
        raise WireError(f"bad channel name {value!r:.80}")
    return value


def check_node(value: object) -> str:
    if not is_valid_node_id(value):
        raise WireError(f"bad node id {value!r:.80}")
    assert isinstance(value, str)
    return value


def check_ids(value: object, most: int = MAX_IDS) -> list[bytes]:
    if type(value) is not list or not value or len(value) > most:
        raise WireError(f"ids must be a list of 1 to {most} message ids")
    for msg_id in value:
        if type(msg_id) is not bytes or len(msg_id) != _ID_SIZE:
            raise WireError(f"bad message id {msg_id!r:.80}")
    return value


def check_channels(value: object) -> list[str]:
    if type(value) is not list or len(value) > MAX_CHANNELS:
        raise WireError("channels must be a list of at most 65536 names")
    for name in value:
        check_channel(name)
    return value


def check_holders(value: object) -> tuple[str, ...]:
    if type(value) is not list or not 2 <= len(value) <= MAX_HOLDERS:
        raise WireError(f"holders must be a list of 2 to {MAX_HOLDERS} node ids")
    holders = tuple(check_node(node) for node in value)
    if len(set(holders)) != len(holders):
        raise WireError("a node is named twice among the holders")
    return holders


def check_keys(value: object, count: int | None = None) -> list[bytes]:
    """Publish keys: ``count`` of them (one per message, ``b""`` for none) or, without ``count``,
    1 to :data:`MAX_IDS` keys none of which is empty; each at most :data:`MAX_KEY_LENGTH` bytes."""
    if type(value) is not list or (len(value) != count if count is not None else not 1 <= len(value) <= MAX_IDS):
        raise WireError(f"keys must be a list of {count if count is not None else f'1 to {MAX_IDS}'} keys")
    for key in value:
        if type(key) is not bytes or len(key) > MAX_KEY_LENGTH or (count is None and not key):
            raise WireError(f"bad publish key {key!r:.80}")
    return value


def _column(value: object, count: int, low: int, high: int, what: str, *, optional: bool = False) -> None:
    """An entries column of integers: one for all (``count`` equal values) or one each."""
    items = value if type(value) is list else [value]
    if type(value) is list and len(value) != count:
        raise WireError(f"{what}: {len(value)} values for {count} messages")
    for item in items:
        if item is None and optional:
            continue
        if type(item) is not int or not low <= item <= high:
            raise WireError(f"bad {what} {item!r:.80}")


def check_entries(entries: bytes, ids: list[bytes], limits: WireLimits) -> list[list[str] | None] | None:
    """Raise :class:`WireError` unless ``entries`` (see :func:`pack_entries`) are the entries of
    ``ids``, in order, with bodies within ``--max-msg-size`` and every field in range; their
    column of the channels that finished each (None: none did)."""
    columns = unpack(entries)
    if type(columns) is not list or len(columns) != 7:
        raise WireError("entries must be 7 columns")
    own_ids, bodies, timestamps, attempts, due, priorities, dones = columns
    if own_ids != ids:
        raise WireError("the entries are not those of the ids")
    count = len(ids)
    if type(bodies) is not list or len(bodies) != count:
        raise WireError("bodies: one per message")
    for body in bodies:
        if type(body) is not bytes or len(body) > limits.max_msg_size:
            raise WireError(f"a body is not bytes of at most {limits.max_msg_size}")
    _column(timestamps, count, 0, INT64_MAX, "timestamp")
    _column(attempts, count, 0, MAX_ATTEMPTS, "attempts")
    _column(due, count, 0, INT64_MAX, "due time")
    if priorities is not None:
        if type(priorities) is not list:
            raise WireError("priorities must be a list or nil")
        _column(priorities, count, 0, MAX_PRIORITY, "priority", optional=True)
    if dones is not None:
        if type(dones) is not list or len(dones) != count:
            raise WireError("done channels: one list (or nil) per message")
        for done in dones:
            if done is not None:
                check_channels(done)
    return dones


def decode_request(item: object, limits: WireLimits) -> Request:
    """The request ``item`` (an unpacked array) describes; raises :class:`WireError`."""
    if type(item) is not list or not item or type(item[0]) is not int:
        raise WireError(f"not a request: {item!r:.80}")
    kind, args = item[0], item[1:]
    shape = _SHAPES.get(kind)
    if shape is None:
        raise WireError(f"unknown request {kind}")
    if not shape[0] <= len(args) <= shape[1]:
        raise WireError(f"request {kind} has {len(args)} fields")
    if kind == ADD:
        topic, holders, ids, entries = check_topic(args[0]), check_holders(args[1]), check_ids(args[2]), args[3]
        if type(entries) is not bytes:
            raise WireError("entries must be bytes")
        dones = check_entries(entries, ids, limits)
        if len(args) == 4:
            return Add(topic, holders, ids, entries, dones)
        if len(args) != 6:
            raise WireError("an ADD's keys come with their expiry")
        keys, expires = check_keys(args[4], len(ids)), args[5]
        _column(expires, len(ids), 0, INT64_MAX, "key expiry")
        return Add(topic, holders, ids, entries, dones, keys, expires)
    if kind == KEYS:
        return Keys(check_topic(args[0]), check_keys(args[1]))
    if kind == FIN:
        return Fin(check_topic(args[0]), check_channel(args[1]), check_ids(args[2]))
    if kind == DROP:
        return Drop(check_topic(args[0]), check_ids(args[1]))
    if kind == CHANNELS:
        return Channels(check_topic(args[0]), check_channels(args[1]))
    if kind == TAKEN:
        return Taken(check_node(args[0]), check_topic(args[1]), check_ids(args[2]))
    if kind == FORGET:
        return Forget(check_topic(args[0]), check_ids(args[1]))
    if kind == GONE:
        return Gone(check_node(args[0]))
    if kind == HOLDS:
        return Holds(check_topic(args[0]), check_ids(args[1]), check_holders(args[2]) if len(args) > 2 else None)
    if kind == UPDATE:
        return check_update(args)
    flags = args[0] if args else {}
    if type(flags) is not dict:
        raise WireError("HELLO's flags must be a map")
    return Hello(flags.get("lost_memory") is True)


#: Each kind's fewest and most fields after the kind.
_SHAPES = {HELLO: (0, 1), ADD: (4, 6), FIN: (3, 3), DROP: (2, 2), CHANNELS: (2, 2), TAKEN: (3, 3), FORGET: (2, 2),
           GONE: (1, 1), KEYS: (2, 2), UPDATE: (5, 5), HOLDS: (2, 3)}


def check_update(args: list) -> Update:
    """The :class:`Update` of an UPDATE's fields ``[topic, channel, ids, attempts, dues]`` (the
    wire's, or a log record's); raises :class:`WireError`: attempts within ``MAX_ATTEMPTS``,
    due times within int64."""
    topic, channel, ids = check_topic(args[0]), check_channel(args[1]), check_ids(args[2])
    count = len(ids)
    _column(args[3], count, 0, MAX_ATTEMPTS, "attempts")
    _column(args[4], count, 0, INT64_MAX, "due time")
    return Update(topic, channel, ids, unpacked_column(args[3], count), unpacked_column(args[4], count))


def packed_column(values: list[int]) -> int | list[int]:
    """A column as it travels: one value when every one is the same."""
    first = values[0]
    return first if values.count(first) == len(values) else values


def unpacked_column(value: object, count: int) -> list[int]:
    """A column as :func:`_column` checked it, one value per message."""
    if isinstance(value, list):
        return value
    assert isinstance(value, int)
    return [value] * count


def decode_requests(body: bytes, limits: WireLimits) -> tuple[int, list[Request]]:
    """A ``REPL`` body's sequence number and requests, every one checked; raises :class:`WireError`."""
    document = unpack(body)
    if type(document) is not list or len(document) != 2 or type(document[0]) is not int:
        raise WireError("a REPL body is [seq, [request, ...]]")
    seq, items = document
    try:
        if type(items) is not list or len(items) > MAX_REQUESTS:
            raise WireError(f"a REPL body is [seq, [request, ...]] with at most {MAX_REQUESTS} requests")
        requests = [decode_request(item, limits) for item in items]
        if len(requests) > 1 and any(map(comes_alone, requests)):
            raise WireError("a HELLO, a GONE or a HOLDS comes alone in its body")
        return seq, requests
    except WireError as exc:
        exc.seq = seq
        raise


# ---------------------------------------------------------------- entries


def pack_entries(messages: list[Message], dones: list[list[str] | None] | None = None, *,
                 published: bool = False) -> bytes:
    """The entries of ``messages`` as one msgpack array of columns: ``[ids, bodies,
    timestamps, attempts, due times, priorities, dones]``, where a column all of whose values
    are equal (``published``: the messages of one publish share their timestamp and due
    time, and were never delivered) may be that one value, and priorities and dones None
    when none has one. ``dones``: the channels that finished each, or None."""
    priorities: list[int | None] | None = [m.priority for m in messages]
    if priorities is not None and priorities.count(None) == len(priorities):
        priorities = None
    ids = [m.id for m in messages]
    bodies = [m.body for m in messages]
    if published:
        first = messages[0]
        return pack([ids, bodies, first.timestamp, 0, first.due_ns, priorities, dones])
    return pack([ids, bodies, [m.timestamp for m in messages], [m.attempts for m in messages],
                 [m.due_ns for m in messages], priorities, dones])


def unpack_entries(data: bytes) -> list[list]:
    """The entries :func:`pack_entries` packed, one ``[id, body, timestamp, attempts, due_ns,
    priority, done]`` each."""
    columns = unpack(data)
    count = len(columns[0])
    whole = [column if isinstance(column, list) else [column] * count for column in columns]
    return [list(item) for item in zip(*whole)]


def message_of(item: list, msg_id: bytes | None = None) -> Message:
    """The message an entry describes (with ``msg_id`` instead of its own, when given)."""
    return Message(msg_id if msg_id is not None else item[0], item[1], item[2], item[3], item[4], item[5])
