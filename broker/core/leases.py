"""A channel's leases: in-flight messages that belong to a token, not to a connection.

A consumer that negotiated a lease (see :mod:`broker.protocol.lease`) has each
message it is sent recorded here under its lease, with no owning client. A lease
is named by its owner and its token: the owner is who the consumer is (its AUTH
identity when auth servers are configured, else ``""`` for everyone), so the same
token taken by two identities names two leases, and one identity cannot settle
the other's messages by naming the token. The messages stay in the channel's
in-flight index and its timers as any other; this book only says which lease
holds which. A message leaves its lease when it is settled, when it times out
(it is then delivered again, perhaps under another lease), or when the channel
is emptied.
"""

from __future__ import annotations

from broker.core.message import Message

__all__ = ["Leases", "LeaseKey"]

#: (owner, token): who took the lease, and the token it was taken under.
LeaseKey = tuple[str, str]


class Leases:
    """(owner, token) -> leased messages, and the reverse; owned by one channel."""

    __slots__ = ("_held", "_lease_of", "_owners")

    def __init__(self) -> None:
        self._held: dict[LeaseKey, dict[bytes, Message]] = {}
        self._lease_of: dict[bytes, LeaseKey] = {}
        # token -> the owners holding a lease under it (almost always one)
        self._owners: dict[str, set[str]] = {}

    def __bool__(self) -> bool:
        return bool(self._lease_of)

    def __len__(self) -> int:
        """Messages currently leased."""
        return len(self._lease_of)

    def add(self, owner: str, token: str, msgs: list[Message]) -> None:
        """Record ``msgs`` (just delivered) as leased by ``owner`` under ``token``."""
        key = (owner, token)
        held = self._held.get(key)
        if held is None:
            held = self._held[key] = {}
            self._owners.setdefault(token, set()).add(owner)
        lease_of = self._lease_of
        for msg in msgs:
            held[msg.id] = msg
            lease_of[msg.id] = key

    def take(self, owner: str, token: str, in_flight: dict[bytes, Message]) -> list[Message]:
        """Remove and return the messages ``owner`` leased under ``token`` that are still in flight."""
        key = (owner, token)
        held = self._held.pop(key, None)
        if held is None:
            return []
        self._drop_owner(owner, token)
        lease_of = self._lease_of
        taken = []
        for msg_id, msg in held.items():
            if lease_of.get(msg_id) == key:
                del lease_of[msg_id]
                if in_flight.get(msg_id) is msg and msg.client is None:
                    taken.append(msg)
        return taken

    def peek(self, owner: str, token: str, in_flight: dict[bytes, Message]) -> list[Message]:
        """The messages ``owner`` leased under ``token`` that are still in flight, left leased."""
        key = (owner, token)
        held = self._held.get(key, {})
        lease_of = self._lease_of
        return [msg for msg_id, msg in held.items()
                if lease_of.get(msg_id) == key and in_flight.get(msg_id) is msg and msg.client is None]

    def held_by_others(self, owner: str, token: str, in_flight: dict[bytes, Message]) -> bool:
        """Whether an owner other than ``owner`` holds messages in flight under ``token``."""
        return any(self.peek(other, token, in_flight)
                   for other in self._owners.get(token, ()) if other != owner)

    def forget(self, msgs: list[Message]) -> None:
        """``msgs`` left flight (timed out): they are no longer leased."""
        lease_of = self._lease_of
        for msg in msgs:
            key = lease_of.pop(msg.id, None)
            if key is not None:
                held = self._held.get(key)
                if held is not None:
                    held.pop(msg.id, None)
                    if not held:
                        del self._held[key]
                        self._drop_owner(*key)

    def clear(self) -> None:
        """Drop every lease (the channel was emptied)."""
        self._held.clear()
        self._lease_of.clear()
        self._owners.clear()

    def _drop_owner(self, owner: str, token: str) -> None:
        owners = self._owners.get(token)
        if owners is not None:
            owners.discard(owner)
            if not owners:
                del self._owners[token]
