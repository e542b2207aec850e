"""Message ids: nsqd's 64-bit snowflake layout, rendered as 16 hex characters.

    bits 63..22  milliseconds-ish (ns >> 20) since a fixed epoch
    bits 21..12  node id, 0..1023
    bits 11..0   sequence within the same tick

Ids increase monotonically for the life of a process. When the sequence of one
tick is used up, or the clock steps backwards, the generator borrows from the
next tick instead of failing, so ids stay unique; ids of a restarted broker are
unique as long as the restart takes longer than the ticks it borrowed.
"""

from __future__ import annotations

from broker.core.message import now_ns

__all__ = ["GuidFactory", "MAX_NODE_ID"]

MAX_NODE_ID = 1024
_EPOCH_TICKS = 1288834974288  # same fixed epoch nsqd uses (ms since unix epoch)
_SEQUENCE_BITS = 12
_SEQUENCE_MASK = (1 << _SEQUENCE_BITS) - 1
_SEQUENCE_HEX = [b"%03x" % n for n in range(_SEQUENCE_MASK + 1)]


class GuidFactory:
    """Hands out unique, increasing 16-byte ASCII hex ids for one node."""

    __slots__ = ("_node_bits", "_last_tick", "_sequence")

    def __init__(self, node_id: int):
        if not 0 <= node_id < MAX_NODE_ID:
            raise ValueError(f"node id {node_id} must be in [0, {MAX_NODE_ID})")
        self._node_bits = node_id << _SEQUENCE_BITS
        self._last_tick = -1
        self._sequence = 0

    def next_ids(self, count: int) -> list[bytes]:
        """``count`` fresh ids, in increasing order."""
        tick = (now_ns() >> 20) - _EPOCH_TICKS
        if tick > self._last_tick:
            self._last_tick = tick
            self._sequence = 0
        sequence = self._sequence
        if count == 1 and sequence <= _SEQUENCE_MASK:  # one PUB: the general loop costs it three times as much
            self._sequence = sequence + 1
            return [b"%016x" % ((self._last_tick << 22) | self._node_bits | sequence)]
        ids: list[bytes] = []
        node = self._node_bits
        while count:
            if self._sequence > _SEQUENCE_MASK:
                self._last_tick += 1
                self._sequence = 0
            # a run of consecutive sequence numbers within one tick: the sequence is the last
            # three hex digits, so the ids share their first 13 and are joined in one C loop
            take = min(count, _SEQUENCE_MASK + 1 - self._sequence)
            prefix = b"%013x" % (((self._last_tick << 22) | node) >> _SEQUENCE_BITS)
            ids.extend(map(prefix.__add__, _SEQUENCE_HEX[self._sequence:self._sequence + take]))
            self._sequence += take
            count -= take
        return ids

    def could_have_issued(self, msg_id: bytes) -> bool:
        """Whether ``msg_id`` is an id of this node's layout (its node id) from a tick that has
        begun: an id from elsewhere, or from the future, was never handed out here."""
        try:
            value = int(msg_id, 16)
        except ValueError:
            return False
        if len(msg_id) != 16 or value & ~_SEQUENCE_MASK & ((1 << 22) - 1) != self._node_bits:
            return False
        return value >> 22 <= max(self._last_tick, (now_ns() >> 20) - _EPOCH_TICKS)

    def next_id(self) -> bytes:
        """One fresh id."""
        return self.next_ids(1)[0]
