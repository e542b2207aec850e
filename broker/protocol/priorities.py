"""Prioritised messages, an extension of the V2 protocol (pynsqd only; nsqd has no such thing).

A client that sends ``"priorities": true`` in IDENTIFY (with
``feature_negotiation``) gets ``"priorities":true`` and ``"default_priority":<n>``
(the broker's ``--default-priority``) back in the answer. From then on, on that
connection, every message carries its priority, a big-endian unsigned 32-bit
number (0 the most urgent), just before its body, both ways:

* in every message of a ``PUB``, ``DPUB`` and ``MPUB`` the client sends::

      [4 bytes: priority][body]

  (on a connection that also negotiated ``publish_keys``, after the key:
  ``[key length][key][4 bytes: priority][body]``); the sizes on the wire count
  those 4 bytes, ``--max-msg-size`` bounds the body alone;

* in every message frame the client receives, the body is ``[4 bytes: priority][body]``
  (the message header before it is nsqd's).

A client that never asks sees nsqd's protocol unchanged.
"""

from __future__ import annotations

import struct

from .errors import ProtocolError

__all__ = ["PRIORITIES_IDENTIFY_FIELD", "DEFAULT_PRIORITY_FIELD", "PRIORITY_SIZE", "MAX_PRIORITY",
           "prefix_priority", "split_priority", "split_priorities"]

#: The IDENTIFY field that asks for priorities, echoed in the answer.
PRIORITIES_IDENTIFY_FIELD = "priorities"
#: The answer's field giving the broker's --default-priority.
DEFAULT_PRIORITY_FIELD = "default_priority"
#: Bytes a priority takes before a body.
PRIORITY_SIZE = 4
#: The least urgent priority.
MAX_PRIORITY = (1 << 32) - 1

_PRIORITY = struct.Struct(">I")


def prefix_priority(priority: int, body: bytes) -> bytes:
    """``body`` as a prioritised connection sends it. Raises ValueError (struct.error) for a
    priority outside 0..2**32-1."""
    return _PRIORITY.pack(priority) + body


def split_priority(raw: bytes) -> tuple[int, bytes]:
    """``(priority, body)`` of a message on a prioritised connection. Raises ValueError when it
    is shorter than a priority."""
    if len(raw) < PRIORITY_SIZE:
        raise ValueError(f"invalid message size {len(raw)} (a priority takes {PRIORITY_SIZE} bytes)")
    return _PRIORITY.unpack_from(raw)[0], raw[PRIORITY_SIZE:]


def split_priorities(verb: str, messages: list[bytes], max_body: int) -> tuple[list[int], list[bytes]]:
    """The priorities and bodies of ``verb``'s messages, each body checked as nsqd checks one:
    raises a fatal ``E_BAD_MESSAGE`` :class:`ProtocolError` in nsqd's words."""
    priorities: list[int] = []
    bodies: list[bytes] = []
    unpack = _PRIORITY.unpack_from
    for index, message in enumerate(messages):
        size = len(message) - PRIORITY_SIZE
        if size <= 0:
            where = f"message({index})" if verb == "MPUB" else "message"
            if size < 0:
                raise ProtocolError("E_BAD_MESSAGE", f"{verb} invalid {where} size {len(message)} "
                                                     f"(a priority takes {PRIORITY_SIZE} bytes)")
            raise ProtocolError("E_BAD_MESSAGE", f"{verb} invalid {where} body size 0")
        if size > max_body:
            raise ProtocolError("E_BAD_MESSAGE", f"{verb} message too big {size} > {max_body}")
        priorities.append(unpack(message)[0])
        bodies.append(message[PRIORITY_SIZE:])
    return priorities, bodies
