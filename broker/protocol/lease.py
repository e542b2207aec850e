"""The lease extension of the V2 protocol (pynsqd only; nsqd has no such thing).

A consumer that sends ``"lease": "<token>"`` in IDENTIFY leases every message
delivered to it under that token: the message no longer belongs to the
connection but to the token, stays in flight when the connection closes (until
its msg_timeout) and is settled later, from any connection of the same channel
that negotiated a lease, by the ``LEASE`` command::

    LEASE FIN <token>\\n            finish every message leased under <token>
    LEASE REQ <token> <ms>\\n       requeue them (deferred by <ms>, clamped like REQ)
    LEASE TOUCH <token>\\n          restart their timeouts
    LEASE AVAILABLE\\n              how many messages the channel holds ready, and
                                   those its topic has yet to fan out

Each is answered by a response frame holding a decimal count: the messages
settled, or the ready depth. A lease belongs to its token and to who took it:
with auth servers configured, FIN, REQ and TOUCH settle only what the sender's
AUTH identity leased under the token, and naming a token under which only
another identity holds messages is refused with the non-fatal
``E_<OP>_FAILED LEASE <OP> <token> failed lease belongs to another identity``.
Without AUTH the token is the only proof, so it should hold a random part. On a leasing connection ``RDY n`` adds ``n`` to a
credit (at most ``--max-rdy-count``) that each delivery spends, rather than
setting a window: leased messages do not hold the connection's window. ``CLS``
ends the credit; every message sent before its ``CLOSE_WAIT`` is leased.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["Lease", "LEASE_OPS", "LEASE_IDENTIFY_FIELD", "is_valid_lease_token", "encode_lease"]

#: The IDENTIFY field that asks for leases, and echoes the token in the answer.
LEASE_IDENTIFY_FIELD = "lease"
#: The operations of the LEASE command; AVAILABLE takes no token.
LEASE_OPS = frozenset({"FIN", "REQ", "TOUCH", "AVAILABLE"})
#: Tokens are short names, so they fit on a command line and in a log.
_TOKEN = re.compile(r"[.a-zA-Z0-9_:-]{1,128}")


def is_valid_lease_token(token: object) -> bool:
    """True for 1-128 characters of ``[.a-zA-Z0-9_:-]``."""
    return isinstance(token, str) and _TOKEN.fullmatch(token) is not None


class Lease(NamedTuple):
    """``LEASE <op> [<token> [<timeout_ms>]]``; ``timeout_ms`` already clamped for REQ."""

    op: str
    token: str = ""
    timeout_ms: int = 0


def encode_lease(op: str, token: str = "", timeout_ms: int | None = None) -> bytes:
    """``LEASE <op> [<token>] [<timeout_ms>]\\n``; raises ValueError for a bad op or token."""
    if op not in LEASE_OPS:
        raise ValueError(f"unknown LEASE operation {op!r}")
    parts = [b"LEASE", op.encode("ascii")]
    if op != "AVAILABLE":
        if not is_valid_lease_token(token):
            raise ValueError(f"invalid lease token {token!r}")
        parts.append(token.encode("ascii"))
    if op == "REQ":
        parts.append(b"%d" % (timeout_ms or 0))
    return b" ".join(parts) + b"\n"
