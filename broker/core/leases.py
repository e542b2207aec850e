"""A channel's leases: in-flight messages that belong to a token, not to a connection.

A consumer that negotiated a lease (see :mod:`broker.protocol.lease`) has each
message it is sent recorded here under its token, with no owning client. The
messages stay in the channel's in-flight index and its timers as any other; this
book only says which token holds which. A message leaves its lease when it is
settled by token, when it times out (it is then delivered again, perhaps under
another lease), or when the channel is emptied.
"""

from __future__ import annotations

from broker.core.message import Message

__all__ = ["Leases"]


class Leases:
    """Token -> leased messages, and the reverse; owned by one channel."""

    __slots__ = ("_by_token", "_token_of")

    def __init__(self) -> None:
        self._by_token: dict[str, dict[bytes, Message]] = {}
        self._token_of: dict[bytes, str] = {}

    def __bool__(self) -> bool:
        return bool(self._token_of)

    def __len__(self) -> int:
        """Messages currently leased."""
        return len(self._token_of)

    def add(self, token: str, msgs: list[Message]) -> None:
        """Record ``msgs`` (just delivered) as leased under ``token``."""
        held = self._by_token.setdefault(token, {})
        token_of = self._token_of
        for msg in msgs:
            held[msg.id] = msg
            token_of[msg.id] = token

    def take(self, token: str, in_flight: dict[bytes, Message]) -> list[Message]:
        """Remove and return the messages leased under ``token`` that are still in flight."""
        held = self._by_token.pop(token, None)
        if not held:
            return []
        token_of = self._token_of
        taken = []
        for msg_id, msg in held.items():
            if token_of.get(msg_id) == token:
                del token_of[msg_id]
                if in_flight.get(msg_id) is msg and msg.client is None:
                    taken.append(msg)
        return taken

    def peek(self, token: str, in_flight: dict[bytes, Message]) -> list[Message]:
        """The messages leased under ``token`` that are still in flight, left leased."""
        held = self._by_token.get(token, {})
        token_of = self._token_of
        return [msg for msg_id, msg in held.items()
                if token_of.get(msg_id) == token and in_flight.get(msg_id) is msg and msg.client is None]

    def forget(self, msgs: list[Message]) -> None:
        """``msgs`` left flight (timed out): they are no longer leased."""
        token_of = self._token_of
        for msg in msgs:
            token = token_of.pop(msg.id, None)
            if token is not None:
                held = self._by_token.get(token)
                if held is not None:
                    held.pop(msg.id, None)
                    if not held:
                        del self._by_token[token]

    def clear(self) -> None:
        """Drop every lease (the channel was emptied)."""
        self._by_token.clear()
        self._token_of.clear()
