"""What a compacted replication log holds (see :mod:`.held`), record by record in the order
they are replayed: the channel lists of topics with copies, the takeovers remembered, the live
copies (read from the old log, with the channels that finished each), their channel states,
then their keys (a ``K`` record names copies held, so it comes after their ``A`` records).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Iterable

import trio

from broker.replication.copyset import TopicCopies
from broker.replication.heldkeys import HeldKeys
from broker.replication.wire import WireError, message_of, pack, pack_entries, packed_column, unpack, unpack_entries

__all__ = ["compacted"]

Origins = dict[str, dict[str, TopicCopies]]


async def compacted(origins: Origins, channels: dict[str, dict[str, list[str]]],
                    taken: dict[str, dict[str, set[bytes]]], taken_at: dict[tuple[str, str], int],
                    keys: HeldKeys, scan: Iterable[list[bytes]], *, taken_piece: int,
                    state_piece: int) -> AsyncGenerator[bytes, None]:
    """The records of the compacted log; ``scan`` reads the old one a batch at a time (other tasks
    run between batches). A record carries at most ``taken_piece`` takeovers or keys, or
    ``state_piece`` channel states."""
    for origin, lists in channels.items():
        for topic, names in lists.items():
            if origins.get(origin, {}).get(topic):
                yield pack(["C", origin, topic, names])
    for origin, topics in taken.items():
        for topic, ids in topics.items():
            when = taken_at.get((origin, topic), time.time_ns())
            ordered = sorted(ids)
            for start in range(0, len(ordered), taken_piece):  # each record within the log's bound
                yield pack(["T", origin, topic, ordered[start:start + taken_piece], when])
    for records in scan:
        for data in records:
            for record in _live(origins, data):
                yield record
        await trio.lowlevel.checkpoint()
    for record in _states(origins, state_piece):
        yield record
    for record in _keys(keys, taken_piece):
        yield record


def _live(origins: Origins, data: bytes) -> list[bytes]:
    """The live copies of an ``A`` record, with the channels that finished each: one record per
    holder list (a record carries one)."""
    try:
        record = unpack(data)
        copies = origins.get(record[1], {}).get(record[2]) if record[0] == "A" else None
        if not copies:
            return []
        ids = [msg_id for msg_id in record[4] if msg_id in copies.holders]
        if not ids:
            return []
        items = {item[0]: item for item in unpack_entries(record[5]) if item[0] in copies.holders}
    except (WireError, LookupError, TypeError, ValueError):
        return []  # what cannot be read back now could not be taken over either
    kept = [msg_id for msg_id in ids if msg_id in items]
    written = []
    for group in {copies.holders[msg_id] for msg_id in kept}:
        group_ids = [msg_id for msg_id in kept if copies.holders[msg_id] == group]
        entries = pack_entries([message_of(items[msg_id]) for msg_id in group_ids])
        dones = [sorted(copies.done.get(msg_id, ())) for msg_id in group_ids]
        written.append(pack(["A", record[1], record[2], list(group), group_ids, entries, dones]))
    return written


def _states(origins: Origins, piece: int) -> list[bytes]:
    """The channel states of the copies held."""
    written = []
    for origin, topics in origins.items():
        for topic, copies in topics.items():
            for channel, states in copies.state.items():
                items = list(states.items())
                for start in range(0, len(items), piece):
                    part = items[start:start + piece]
                    written.append(pack(["S", origin, topic, channel, [msg_id for msg_id, _ in part],
                                         packed_column([state[0] for _, state in part]),
                                         packed_column([state[1] for _, state in part])]))
    return written


def _keys(keys: HeldKeys, piece: int) -> list[bytes]:
    """The keys still within their window, grouped by origin and topic."""
    groups: dict[tuple[str, str], list[tuple[bytes, bytes, int]]] = {}
    for origin, topic, msg_id, key, expires in keys.live(time.time_ns()):
        groups.setdefault((origin, topic), []).append((msg_id, key, expires))
    written = []
    for (origin, topic), entries in groups.items():
        for start in range(0, len(entries), piece):
            part = entries[start:start + piece]
            written.append(pack(["K", origin, topic, [e[0] for e in part], [e[1] for e in part],
                                 [e[2] for e in part]]))
    return written
