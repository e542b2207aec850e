"""The answers to REPL requests that carry data of their own (HELLO, HOLDS, GONE, KEYS; see
:mod:`.wire`'s table), each checked as strictly as a request before it is used."""

from __future__ import annotations

from broker.replication.wire import INT64_MAX, MAX_ANSWER_IDS, WireError, check_ids, check_keys, check_node, check_topic

__all__ = ["decode_hello_answer", "decode_hello_holding", "decode_holds_answer", "decode_gone_answer",
           "decode_keys_answer"]


def decode_hello_answer(extra: object) -> tuple[dict[str, list[bytes]], dict[str, dict[str, list[bytes]]]]:
    """HELLO's answer (see :mod:`.wire`'s table), checked whole (its third item is
    :func:`decode_hello_holding`'s); raises :class:`WireError`."""
    decode_hello_holding(extra)
    assert isinstance(extra, list)
    mine, everything, _holding = extra
    return _taken_topics(mine), {check_node(origin): _taken_topics(topics)
                                 for origin, topics in _map(everything).items()}


def decode_hello_holding(extra: object) -> dict[str, int]:
    """The third item of HELLO's answer, checked: how many copies of the sender's messages the
    peer holds, by topic; raises :class:`WireError`."""
    if type(extra) is not list or len(extra) != 3:
        raise WireError("HELLO's answer is [mine, everything, holding]")
    holding = _map(extra[2])
    for topic, count in holding.items():
        check_topic(topic)
        if type(count) is not int or not 0 < count <= INT64_MAX:
            raise WireError(f"bad count of copies {count!r:.80}")
    return holding


def decode_holds_answer(extra: object, count: int) -> list[bool]:
    """HOLDS's answer: one boolean for each of the ``count`` ids asked about; raises :class:`WireError`."""
    if type(extra) is not list or len(extra) != count or any(type(held) is not bool for held in extra):
        raise WireError(f"HOLDS's answer is one boolean for each of {count} ids")
    return extra


def decode_gone_answer(extra: object) -> tuple[bool, float | None]:
    """GONE's answer: whether the peer reaches the node, and how long it has not heard from it
    (None: never); raises :class:`WireError`."""
    if type(extra) is not list or len(extra) != 2 or type(extra[0]) is not bool or not (
            extra[1] is None or type(extra[1]) in (int, float)):
        raise WireError("GONE's answer is [reachable, seconds or nil]")
    return extra[0], None if extra[1] is None else float(extra[1])


def decode_keys_answer(extra: object, topic: str, asked: list[bytes]) -> set[bytes]:
    """The keys of ``asked`` a KEYS' answer (see :mod:`.wire`'s table) says are known in ``topic``;
    raises :class:`WireError` for an answer that is not one, or names keys not asked."""
    if extra is None:
        return set()
    found = _map(extra).get(topic)
    if found is None:
        return set()
    known = set(check_keys(found)) if found else set()
    if not known.issubset(asked):
        raise WireError("a KEYS answer names keys that were not asked")
    return known


def _map(value: object) -> dict:
    if type(value) is not dict:
        raise WireError("a map was expected")
    return value


def _taken_topics(value: object) -> dict[str, list[bytes]]:
    # a takeover of a large backlog names millions of ids: the frame's size bounds them
    return {check_topic(topic): check_ids(ids, MAX_ANSWER_IDS) if ids else [] for topic, ids in _map(value).items()}
