"""Topic and channel names: the validity rule and Go's quoting of bad names.

nsqd (``internal/protocol/names.go``) accepts ``^[.a-zA-Z0-9_-]+(#ephemeral)?$``
with a length of 1 to 64 bytes, for topics and channels alike. Error messages
quote a rejected name with Go's ``%q`` (``strconv.Quote``): :func:`go_quote`, re-exported
from :mod:`broker.gocompat`.
"""

from __future__ import annotations

import re

from broker.gocompat import go_quote

__all__ = ["is_valid_name", "is_ephemeral", "go_quote", "EPHEMERAL_SUFFIX", "MAX_NAME_LENGTH"]

EPHEMERAL_SUFFIX = "#ephemeral"
MAX_NAME_LENGTH = 64

# fullmatch, not "$": Go's "$" (without (?m)) only matches at the very end,
# while Python's would also accept a name followed by one "\n".
_NAME_BYTES = re.compile(rb"[.a-zA-Z0-9_-]+(?:#ephemeral)?")
_NAME_STR = re.compile(r"[.a-zA-Z0-9_-]+(?:#ephemeral)?", re.ASCII)


def is_valid_name(name: str | bytes) -> bool:
    """True if ``name`` is a valid topic or channel name (nsqd's rule)."""
    if isinstance(name, str):
        return 1 <= len(name) <= MAX_NAME_LENGTH and _NAME_STR.fullmatch(name) is not None
    return 1 <= len(name) <= MAX_NAME_LENGTH and _NAME_BYTES.fullmatch(name) is not None


def is_ephemeral(name: str) -> bool:
    """True if the topic or channel ``name`` ends in ``#ephemeral``."""
    return name.endswith(EPHEMERAL_SUFFIX)
