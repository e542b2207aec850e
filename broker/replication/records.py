"""The records of the replication log (see :mod:`.held` for their meaning): each is checked
as strictly as a peer's request before it is applied at start, since the log is read back
from a disk that may have been damaged or written by another program.
"""

from __future__ import annotations

from broker.replication.wire import (
    MAX_ANSWER_IDS,
    WireError,
    check_channel,
    check_channels,
    check_holders,
    check_ids,
    check_keys,
    check_node,
    check_topic,
    check_update,
)

__all__ = ["checked_record"]

#: Each kind of record: how to check the fields after the kind, origin and topic.
_RECORD_FIELDS = {
    "A": (check_holders, check_ids, bytes, None),
    "F": (check_channel, check_ids),
    "D": (check_ids, int),
    "K": (check_ids, list, list),
    "C": (check_channels,),
    "T": (lambda ids: check_ids(ids, MAX_ANSWER_IDS), int),
    "U": (lambda ids: check_ids(ids, MAX_ANSWER_IDS),),
    "H": (check_holders, check_ids),
}


def checked_record(record: object) -> list:
    """``record`` when it is one :mod:`.held` writes (see its docstring); else raises
    :class:`WireError`. An ``A`` record's entries were checked when they arrived."""
    if type(record) is list and record[:1] == ["S"]:
        if len(record) != 7:
            raise WireError(f"a S record with {len(record)} fields")
        check_node(record[1])
        check_update(record[2:])  # topic, channel, ids, attempts, due times
        return record
    if type(record) is not list or len(record) < 3 or record[0] not in _RECORD_FIELDS:
        raise WireError(f"not a record: {record!r:.80}")
    checks = _RECORD_FIELDS[record[0]]
    rest = record[3:]
    optional = 1 if checks[-1] in (None, int) else 0  # an A record's done channels, a T record's time
    if not len(checks) - optional <= len(rest) <= len(checks):
        raise WireError(f"a {record[0]} record with {len(record)} fields")
    check_node(record[1])
    check_topic(record[2])
    for check, value in zip(checks, rest):
        if check is bytes:
            if type(value) is not bytes:
                raise WireError("entries must be bytes")
        elif check is int:
            if type(value) is not int:
                raise WireError(f"a {record[0]} record's last field must be an integer")
        elif check is list:  # a K record's keys, then their expiry (one, or one each)
            if value is rest[1]:
                check_keys(value, len(rest[0]))
            elif type(value) is not int and (type(value) is not list or len(value) != len(rest[0])
                                             or any(type(item) is not int for item in value)):
                raise WireError("a K record's expiry: one integer, or one per key")
        elif check is None:  # an A record's done channels, one list per copy
            if type(value) is not list or len(value) != len(record[4]):
                raise WireError("done channels: one list per copy")
            for done in value:
                check_channels(done)
        else:
            check(value)
    return record
