"""V2 commands: the events the server-side parser yields, and the client-side encoders.

Wire syntax (``nsqd/protocol_v2.go``): a line of space-separated tokens ended
by ``\\n`` (a trailing ``\\r`` is dropped); IDENTIFY, AUTH, PUB and DPUB are
followed by ``[4-byte size][body]``, MPUB by
``[4-byte size][4-byte count]`` then ``count`` times ``[4-byte size][body]``.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable

from .frames import MSG_ID_LENGTH
from .names import is_valid_name

__all__ = [
    "Identify", "Auth", "Sub", "Publish", "Pub", "Mpub", "Dpub", "Rdy", "Fin", "FinRun", "Req", "Touch", "Cls", "Nop", "Command",
    "encode_identify", "encode_auth", "encode_sub", "encode_pub", "encode_mpub", "encode_dpub",
    "encode_rdy", "encode_fin", "encode_req", "encode_touch", "encode_cls", "encode_nop",
]


class _Event:
    """What the command events share: equal when of one type with equal fields, and a repr
    that names them. Plain classes with slots, not frozen dataclasses: the parser makes one
    per command, and a frozen dataclass's ``__init__`` costs 4.5 times as much (0.59 µs
    against 0.13 µs for two fields), besides 0.4 ms each at import. Nothing changes an
    event after the parser made it."""

    __slots__: tuple[str, ...] = ()
    #: the event's fields: its slots and its bases'
    _fields: tuple[str, ...] = ()

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        cls._fields = tuple(f for klass in reversed(cls.__mro__) for f in klass.__dict__.get("__slots__", ()))

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(getattr(self, f) == getattr(other, f) for f in self._fields)

    def __hash__(self) -> int:
        return hash((type(self), *(repr(getattr(self, f)) for f in self._fields)))

    def __repr__(self) -> str:
        fields = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields)
        return f"{type(self).__name__}({fields})"


class Identify(_Event):
    """IDENTIFY: ``data`` is the JSON body as nsqd's decoder sees it.

    Known fields appear under their canonical names with checked types (str,
    int or bool); a field sent as ``null`` or not sent is absent; unknown keys
    are dropped, as Go's ``json.Unmarshal`` ignores them. Range checks are the
    owner's (they depend on options). A body of
    :data:`~broker.protocol.identify.DECODE_INLINE_BELOW` bytes or more is left undecoded
    (``data`` None, the bytes in ``body``) for the owner to decode off the event
    loop with :func:`~broker.protocol.finish_identify`.
    """

    __slots__ = ("data", "body")

    def __init__(self, data: dict | None, body: bytes = b"") -> None:
        self.data = data
        self.body = body


class Auth(_Event):
    """AUTH with the secret body."""

    __slots__ = ("secret",)

    def __init__(self, secret: bytes) -> None:
        self.secret = secret


class Sub(_Event):
    """SUB to ``topic``/``channel`` (both valid names)."""

    __slots__ = ("topic", "channel")

    def __init__(self, topic: str, channel: str) -> None:
        self.topic = topic
        self.channel = channel


class Publish(_Event):
    """A publish: PUB, MPUB or DPUB over TCP, ``/pub`` or ``/mpub`` over HTTP, as one request.

    ``bodies`` (one or more, none empty, each within ``--max-msg-size``), ``keys`` (one per
    body, ``b""`` for an unkeyed one; None: the publish carries no keys, see
    :mod:`broker.protocol.keys`), ``priorities`` (one per body; None: none given, see
    :mod:`broker.protocol.priorities`) and ``defer_ms`` (0 or within ``--max-req-timeout``).
    Whatever a connection negotiated is cut off the bodies already: the broker's core takes
    this request as it is (:meth:`~broker.core.broker.Broker.publish`). ``verb`` names the
    command in its errors (``E_PUB_FAILED``, ``E_MPUB_FAILED``, ``E_DPUB_FAILED``).
    """

    __slots__ = ("topic", "bodies", "keys", "priorities", "defer_ms")
    verb = "PUB"

    def __init__(self, topic: str, bodies: list[bytes], keys: list[bytes] | None = None,
                 priorities: list[int] | None = None, defer_ms: int = 0) -> None:
        self.topic = topic
        self.bodies = bodies
        self.keys = keys
        self.priorities = priorities
        self.defer_ms = defer_ms


class Pub(Publish):
    """PUB of one body."""

    __slots__ = ()
    verb = "PUB"


class Mpub(Publish):
    """MPUB of one or more bodies, all validated before the event is yielded."""

    __slots__ = ()
    verb = "MPUB"


class Dpub(Publish):
    """DPUB: one body deferred by ``defer_ms``."""

    __slots__ = ()
    verb = "DPUB"


class Rdy(_Event):
    """RDY ``count`` (0..max_rdy_count; a bare ``RDY`` means 1)."""

    __slots__ = ("count",)

    def __init__(self, count: int) -> None:
        self.count = count


class Fin(_Event):
    """FIN of a 16-byte message id (its bytes are not checked to be hex)."""

    __slots__ = ("msg_id",)

    def __init__(self, msg_id: bytes) -> None:
        self.msg_id = msg_id


class FinRun(_Event):
    """Consecutive well-formed FIN lines, in order (only with ``ServerConnection.fin_runs``)."""

    __slots__ = ("msg_ids",)

    def __init__(self, msg_ids: list[bytes]) -> None:
        self.msg_ids = msg_ids


class Req(_Event):
    """REQ of a message; ``timeout_ms`` already clamped to [0, max_req_timeout_ms]."""

    __slots__ = ("msg_id", "timeout_ms")

    def __init__(self, msg_id: bytes, timeout_ms: int) -> None:
        self.msg_id = msg_id
        self.timeout_ms = timeout_ms


class Touch(_Event):
    """TOUCH: reset a message's in-flight timeout."""

    __slots__ = ("msg_id",)

    def __init__(self, msg_id: bytes) -> None:
        self.msg_id = msg_id


class Cls(_Event):
    """CLS: start closing (the parser has moved the connection to CLOSING)."""

    __slots__ = ()


class Nop(_Event):
    """NOP: no response."""

    __slots__ = ()


Command = Identify | Auth | Sub | Pub | Mpub | Dpub | Rdy | Fin | FinRun | Req | Touch | Cls | Nop

_SIZE = struct.Struct(">I")
_SIZE_AND_COUNT = struct.Struct(">II")


def _name(name: str) -> bytes:
    if not is_valid_name(name):
        raise ValueError(f"invalid topic or channel name {name!r}")
    return name.encode("ascii")


def _msg_id(msg_id: bytes | str) -> bytes:
    if isinstance(msg_id, str):
        msg_id = msg_id.encode("ascii")
    if len(msg_id) != MSG_ID_LENGTH:
        raise ValueError(f"message id must be {MSG_ID_LENGTH} bytes, got {len(msg_id)}")
    return bytes(msg_id)


def encode_identify(params: dict) -> bytes:
    """``IDENTIFY\\n`` + the JSON-encoded ``params`` as a sized body."""
    body = json.dumps(params, separators=(",", ":")).encode("utf-8")
    return b"IDENTIFY\n" + _SIZE.pack(len(body)) + body


def encode_auth(secret: bytes) -> bytes:
    """``AUTH\\n`` + the secret as a sized body."""
    if isinstance(secret, str):
        secret = secret.encode("utf-8")
    return b"AUTH\n" + _SIZE.pack(len(secret)) + secret


def encode_sub(topic: str, channel: str) -> bytes:
    """``SUB <topic> <channel>\\n``; raises ValueError for an invalid name."""
    return b"SUB " + _name(topic) + b" " + _name(channel) + b"\n"


def encode_pub(topic: str, body: bytes) -> bytes:
    """``PUB <topic>\\n[size][body]``."""
    return b"PUB " + _name(topic) + b"\n" + _SIZE.pack(len(body)) + body


def encode_mpub(topic: str, bodies: Iterable[bytes]) -> bytes:
    """``MPUB <topic>\\n[size][count]`` then each ``[size][body]``."""
    bodies = list(bodies)
    size = _SIZE.pack
    parts = [b""]
    total = 4
    for body in bodies:
        parts.append(size(len(body)))
        parts.append(body)
        total += 4 + len(body)
    parts[0] = b"MPUB " + _name(topic) + b"\n" + _SIZE_AND_COUNT.pack(total, len(bodies))
    return b"".join(parts)


def encode_dpub(topic: str, defer_ms: int, body: bytes) -> bytes:
    """``DPUB <topic> <defer_ms>\\n[size][body]``."""
    return b"DPUB " + _name(topic) + b" %d\n" % defer_ms + _SIZE.pack(len(body)) + body


def encode_rdy(count: int) -> bytes:
    """``RDY <count>\\n``."""
    return b"RDY %d\n" % count


def encode_fin(msg_id: bytes | str) -> bytes:
    """``FIN <id>\\n``; raises ValueError unless the id is 16 bytes."""
    return b"FIN " + _msg_id(msg_id) + b"\n"


def encode_req(msg_id: bytes | str, timeout_ms: int) -> bytes:
    """``REQ <id> <timeout_ms>\\n``."""
    return b"REQ " + _msg_id(msg_id) + b" %d\n" % timeout_ms


def encode_touch(msg_id: bytes | str) -> bytes:
    """``TOUCH <id>\\n``."""
    return b"TOUCH " + _msg_id(msg_id) + b"\n"


def encode_cls() -> bytes:
    """``CLS\\n``."""
    return b"CLS\n"


def encode_nop() -> bytes:
    """``NOP\\n``."""
    return b"NOP\n"
