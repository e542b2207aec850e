"""The parameters of a command line, read and refused as nsqd reads them: names, message ids
and decimal numbers, each with nsqd's error when it is not one."""

from __future__ import annotations

from functools import lru_cache

from .base10 import parse_base10
from .errors import ProtocolError
from .frames import MSG_ID_LENGTH
from .names import go_quote, is_valid_name

__all__ = ["invalid", "name_param", "message_id_param", "number_param"]


@lru_cache(maxsize=1024)
def _valid_name(raw: bytes) -> str | None:
    # Publishers name the same few topics over and over: remember the verdicts.
    return raw.decode("ascii") if is_valid_name(raw) else None


def invalid(description: str) -> ProtocolError:
    """nsqd's fatal ``E_INVALID`` with ``description``."""
    return ProtocolError("E_INVALID", description)


def name_param(raw: bytes, command: str, kind: str, code: str, prefix: bytes = b"") -> str:
    """The topic or channel name ``raw``; raises ``code`` (``E_BAD_TOPIC``, ``E_BAD_CHANNEL``)
    worded as nsqd's ``<COMMAND> <kind> name "<raw>" is not valid``."""
    name = _valid_name(raw)
    if name is None:
        raise ProtocolError.with_raw_description(
            code, prefix + f"{command} {kind} name ".encode("ascii") + go_quote(raw) + b" is not valid"
        )
    return name


def message_id_param(raw: bytes) -> bytes:
    """A message id: 16 bytes (nsqd does not check that they are hex)."""
    if len(raw) != MSG_ID_LENGTH:
        raise invalid("invalid message ID")
    return raw


def number_param(raw: bytes, what: bytes) -> int:
    """A decimal number as nsqd's ``strconv.ParseInt`` reads it; raises ``E_INVALID <what><raw>``."""
    value = parse_base10(raw)
    if value is None:
        raise ProtocolError.with_raw_description("E_INVALID", what + raw)
    return value
