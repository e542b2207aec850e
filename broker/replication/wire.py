"""What nodes send each other inside ``REPL`` bodies (:mod:`broker.protocol.replica`).

A ``REPL`` body is one msgpack array ``[seq, [request, ...]]``; the peer answers each with
one response frame ``[seq, error, extra]`` (error None when every request was applied).
Requests are arrays whose first item is their kind:

======================================  ==================================================
``[HELLO]``, ``[HELLO, {"lost_memory":  the sender (re)connected: the answer's ``extra``
true}]``                                is ``[{topic: [id, ...]}, {origin: {topic: [id,
                                        ...]}}]``: the sender's messages the peer took
                                        over while the sender was gone, and all it took
                                        over from any node. ``lost_memory``: the sender
                                        crashed without ``--durable``; the peer first
                                        takes over its copies
``[ADD, topic, holders, ids, entries]``  hold copies of these messages (answered once
                                        they are stored, fsync'd with ``--durable``);
                                        ``entries`` is their entries packed as one
                                        msgpack array, which the holder keeps as it is
``[FIN, topic, channel, [id, ...]]``    the channel finished them
``[DROP, topic, [id, ...]]``            forget these copies (their publish failed)
``[CHANNELS, topic, [channel, ...]]``   the topic's channels on the sender
``[TAKEN, origin, topic, [id, ...]]``   the sender took over these copies of ``origin``
======================================  ==================================================

An entry is ``[id, body, timestamp, attempts, due_ns, priority, done]``: a message as the
core holds it, and the channels that finished it already (None: none). An ADD carries its
entries by columns (:func:`pack_entries`).
"""

from __future__ import annotations

from typing import Any

import msgpack

from broker.core.message import Message

__all__ = ["HELLO", "ADD", "FIN", "DROP", "CHANNELS", "TAKEN", "pack", "unpack", "pack_entries", "unpack_entries",
           "message_of",
           "WireError"]

HELLO, ADD, FIN, DROP, CHANNELS, TAKEN = range(1, 7)



class WireError(ValueError):
    """Bytes that are not what a peer sends."""


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def unpack(data: bytes) -> Any:
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise WireError(f"not msgpack: {exc}") from exc


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
