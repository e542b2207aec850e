"""The copies of one topic a node holds for one origin node (see :mod:`.held`)."""

from __future__ import annotations

__all__ = ["TopicCopies"]


class TopicCopies:
    """The copies of one topic held for one origin: each id's holders (one tuple shared by a
    whole ADD), for those some channel finished, which channels did, for keyed ones their
    publish key, and for those a channel delivered or requeued, their ``(attempts, due_ns)``
    there (``state``: channel -> id ->)."""

    __slots__ = ("holders", "done", "keys", "state")

    def __init__(self) -> None:
        self.holders: dict[bytes, tuple[str, ...]] = {}
        self.done: dict[bytes, set[str]] = {}
        self.keys: dict[bytes, bytes] = {}
        self.state: dict[str, dict[bytes, tuple[int, int]]] = {}

    def __len__(self) -> int:
        return len(self.holders)

    def discard(self, msg_id: bytes) -> None:
        if self.holders.pop(msg_id, None) is not None:
            self.done.pop(msg_id, None)
            self.keys.pop(msg_id, None)
            if self.state:
                for channel in list(self.state):
                    self.forget_state(channel, msg_id)

    def forget_state(self, channel: str, msg_id: bytes) -> None:
        states = self.state.get(channel)
        if states is not None and states.pop(msg_id, None) is not None and not states:
            del self.state[channel]

    def states_of(self, msg_id: bytes) -> dict[str, tuple[int, int]]:
        """The copy's ``(attempts, due_ns)`` in each channel that reported one."""
        return {channel: states[msg_id] for channel, states in self.state.items() if msg_id in states}
