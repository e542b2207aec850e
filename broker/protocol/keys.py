"""Keyed publishes, an extension of the V2 protocol (pynsqd only; nsqd has no such thing).

A publisher that sends ``"publish_keys": true`` in IDENTIFY (with
``feature_negotiation``) gets ``"publish_keys":true`` and ``"dedup_window":<ms>``
back in the answer. From then on, on that connection, every message of a
``PUB``, ``DPUB`` and ``MPUB`` carries a key before its body::

    [1 byte: key length k, 0..128][k bytes: key][body]

The sizes on the wire (``PUB``'s 4-byte size, each of an ``MPUB``'s message
sizes) count those bytes; ``k = 0`` is an unkeyed message. A message whose key
the topic already stored within ``--dedup-window`` is a *duplicate*: it is not
stored, and the publish still succeeds. The answers on such a connection say so:

    PUB, DPUB:  OK                stored
                DUPLICATE         a duplicate, nothing stored
    MPUB:       OK                every message stored
                DUPLICATE <n>     n of them were duplicates; the others were stored

A client that never asks sees nsqd's protocol unchanged.
"""

from __future__ import annotations

from .errors import ProtocolError

__all__ = [
    "KEYS_IDENTIFY_FIELD", "DEDUP_WINDOW_FIELD", "MAX_KEY_LENGTH", "DUPLICATE", "prefix_key", "split_key", "cut_message",
    "duplicates_in_answer",
]

#: The IDENTIFY field that asks for keyed publishes, echoed in the answer.
KEYS_IDENTIFY_FIELD = "publish_keys"
#: The answer's field giving the broker's --dedup-window in milliseconds.
DEDUP_WINDOW_FIELD = "dedup_window"
#: The longest key, in bytes.
MAX_KEY_LENGTH = 128
#: The answer to a keyed PUB or DPUB whose key was already stored (MPUB: ``DUPLICATE <n>``).
DUPLICATE = b"DUPLICATE"


def prefix_key(key: bytes | None, body: bytes) -> bytes:
    """``body`` as a keyed connection sends it: the key's length, the key, the body.

    ``None`` or ``b""`` sends the body unkeyed. Raises ValueError for a key over
    :data:`MAX_KEY_LENGTH` bytes.
    """
    if not key:
        return b"\x00" + body
    if len(key) > MAX_KEY_LENGTH:
        raise ValueError(f"a publish key is 1 to {MAX_KEY_LENGTH} bytes, got {len(key)}")
    return bytes((len(key),)) + key + body


def split_key(raw: bytes) -> tuple[bytes, bytes]:
    """``(key, body)`` of a message sent on a keyed connection (``key`` empty: unkeyed).

    Raises ValueError with the length at fault when the key length byte is over
    :data:`MAX_KEY_LENGTH` or the key runs past the message (the body may be empty:
    the caller refuses that as it refuses any empty body).
    """
    if not raw:
        raise ValueError("missing key length")
    length = raw[0]
    if length > MAX_KEY_LENGTH or length >= len(raw):
        raise ValueError(f"invalid key length {length}")
    if length == 0:
        return b"", raw[1:]
    end = length + 1
    return raw[1:end], raw[end:]


def cut_message(verb: str, index: int, message: bytes, max_body: int) -> tuple[bytes, bytes]:
    """``(key, body)`` of message ``index`` of a keyed ``verb``, checked as nsqd checks a body:
    raises a fatal ``E_BAD_MESSAGE`` :class:`ProtocolError` in nsqd's words (``<VERB> invalid key
    length N`` for a key)."""
    try:
        key, body = split_key(message)
    except ValueError as exc:
        raise ProtocolError("E_BAD_MESSAGE", f"{verb} {exc}") from None
    if not body:
        where = f"message({index})" if verb == "MPUB" else "message"
        raise ProtocolError("E_BAD_MESSAGE", f"{verb} invalid {where} body size 0")
    if len(body) > max_body:
        raise ProtocolError("E_BAD_MESSAGE", f"{verb} message too big {len(body)} > {max_body}")
    return key, body


def duplicates_in_answer(answer: bytes) -> int:
    """How many messages a keyed publish's answer reports as duplicates (``OK``: 0).

    ``DUPLICATE`` (an answer to PUB or DPUB) is 1. Raises ValueError for anything else.
    """
    if answer == b"OK":
        return 0
    if answer == DUPLICATE:
        return 1
    word, _, count = answer.partition(b" ")
    if word == DUPLICATE and count.isdigit():
        return int(count)
    raise ValueError(f"not an answer to a keyed publish: {answer[:64]!r}")
