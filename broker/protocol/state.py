"""The per-connection state machine: states and which command is legal in which.

State numbers are nsqd's (``nsqd/client_v2.go``: init 0, disconnected 1,
connected 2, subscribed 3, closing 4); ``/stats`` shows them. A V2 connection
only ever is in INIT, SUBSCRIBED or CLOSING.
"""

from __future__ import annotations

import enum

__all__ = ["State", "LEGAL_STATES", "IGNORED_MOVES"]


class State(enum.IntEnum):
    """Where a connection is: before SUB, subscribed, or closing after CLS."""

    INIT = 0
    SUBSCRIBED = 3
    CLOSING = 4


_ANY = frozenset(State)

#: The states in which each command is legal. Outside them nsqd answers the fatal
#: ``E_INVALID cannot <CMD> in current state`` -- except for the moves in
#: :data:`IGNORED_MOVES`. PUB, MPUB, DPUB and NOP have no state check in nsqd.
LEGAL_STATES: dict[bytes, frozenset[State]] = {
    b"IDENTIFY": frozenset({State.INIT}),
    b"AUTH": frozenset({State.INIT}),
    b"SUB": frozenset({State.INIT}),
    b"RDY": frozenset({State.SUBSCRIBED}),
    b"FIN": frozenset({State.SUBSCRIBED, State.CLOSING}),
    b"REQ": frozenset({State.SUBSCRIBED, State.CLOSING}),
    b"TOUCH": frozenset({State.SUBSCRIBED, State.CLOSING}),
    b"CLS": frozenset({State.SUBSCRIBED}),
    b"LEASE": frozenset({State.SUBSCRIBED, State.CLOSING}),
    b"PUB": _ANY,
    b"MPUB": _ANY,
    b"DPUB": _ANY,
    b"NOP": _ANY,
}

#: Illegal moves that nsqd silently ignores: RDY after CLS ("ignoring RDY after
#: CLS in state ClientStateV2Closing"), checked before anything else in RDY.
IGNORED_MOVES: frozenset[tuple[bytes, State]] = frozenset({(b"RDY", State.CLOSING)})
