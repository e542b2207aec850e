"""LEASE FIN, LEASE REQ and LEASE TOUCH: settling what a lease holds (:mod:`broker.core.leases`).

A base class of :class:`~broker.core.channel.Channel`, kept in its own module
because the lease extension is pynsqd's own: none of nsqd's commands go
through it. A settle names a lease by its owner and token, and acts on every
message the lease holds; the channel's own REQ and TOUCH do the moving.
"""

from __future__ import annotations

from collections.abc import Callable

from broker.core.leases import Leases
from broker.core.message import Message
from broker.protocol import command_failed

__all__ = ["LeaseSettlement"]

#: Why a LEASE FIN, REQ or TOUCH naming another identity's lease fails (cf. nsqd's "client does not own message").
_NOT_OWNER = b"lease belongs to another identity"


class LeaseSettlement:
    """The lease commands of a channel; what they use of it is declared here."""

    in_flight: dict[bytes, Message]
    leases: Leases
    exiting: bool
    requeue_count: int

    _retire_finished: Callable[[list[Message]], None]
    _move_back: Callable[[list[Message], int], bool]
    _extend: Callable[[list[Message], float], None]
    dispatch: Callable[[], None]

    def finish_lease(self, owner: str, token: str) -> int:
        """LEASE FIN: finish every message ``owner`` still leases under ``token``; returns how many.

        Raises the non-fatal ``E_FIN_FAILED`` when ``owner`` holds nothing under
        ``token`` but another owner does (nothing changes then).
        """
        finished = self._settle(owner, token, "E_FIN_FAILED", "LEASE FIN")
        for msg in finished:
            del self.in_flight[msg.id]
        if finished:
            self._retire_finished(finished)
        return len(finished)

    def requeue_lease(self, owner: str, token: str, delay_ms: int) -> int:
        """LEASE REQ: requeue what ``owner`` leases under ``token``, now or after ``delay_ms``;
        returns how many.

        Raises the non-fatal ``E_REQ_FAILED`` when exiting, when ``owner`` holds
        nothing under ``token`` but another owner does, or when the disk refuses
        the write (the messages then stay leased).
        """
        if self.exiting:
            raise command_failed("E_REQ_FAILED", "LEASE REQ", token.encode(), b"exiting")
        msgs = self._settle(owner, token, "E_REQ_FAILED", "LEASE REQ")
        if not msgs:
            return 0
        for msg in msgs:
            del self.in_flight[msg.id]
        if not self._move_back(msgs, delay_ms):
            for msg in msgs:
                msg.client = None
                self.in_flight[msg.id] = msg
            self.leases.add(owner, token, msgs)
            raise command_failed("E_REQ_FAILED", "LEASE REQ", token.encode(), b"disk write failed")
        self.requeue_count += len(msgs)
        self.dispatch()
        return len(msgs)

    def touch_lease(self, owner: str, token: str, msg_timeout: float) -> int:
        """LEASE TOUCH: restart the timeouts of what ``owner`` leases under ``token`` (never
        past delivery + max-msg-timeout); returns how many are leased.

        Raises the non-fatal ``E_TOUCH_FAILED`` when ``owner`` holds nothing under
        ``token`` but another owner does.
        """
        msgs = self.leases.peek(owner, token, self.in_flight)
        if not msgs:
            self._refuse_other_owners(owner, token, "E_TOUCH_FAILED", "LEASE TOUCH")
        self._extend(msgs, msg_timeout)
        return len(msgs)

    def _settle(self, owner: str, token: str, code: str, verb: str) -> list[Message]:
        """Take what ``owner`` leases under ``token`` out of its lease (still in flight)."""
        msgs = self.leases.take(owner, token, self.in_flight)
        if not msgs:
            self._refuse_other_owners(owner, token, code, verb)
        return msgs

    def _refuse_other_owners(self, owner: str, token: str, code: str, verb: str) -> None:
        """A token names a lease only for its owner: naming another's is refused, not answered 0,
        so that a client learns why its settle did nothing."""
        if self.leases.held_by_others(owner, token, self.in_flight):
            raise command_failed(code, verb, token.encode(), _NOT_OWNER)
