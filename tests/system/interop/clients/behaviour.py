"""What a consuming client does with each delivery, decided from the delivery's attempt count.

Config keys (all optional):

- ``hold_below``: never answer deliveries with ``attempts < hold_below`` (they time out);
- ``requeue_below``: requeue deliveries with ``attempts < requeue_below``;
- ``requeue_delay_ms``: the delay asked for when requeueing;
- ``finish_after_ms``: wait this long before finishing (keeps a message in flight);
- ``touch_every_ms``: while waiting to finish, TOUCH the message this often.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Behaviour", "FINISH", "HOLD", "REQUEUE"]

FINISH = "fin"
HOLD = "hold"
REQUEUE = "req"


@dataclass(frozen=True, slots=True)
class Behaviour:
    """A consumer's policy, the same for every client library."""

    hold_below: int = 0
    requeue_below: int = 0
    requeue_delay_ms: int = 0
    finish_after_ms: int = 0
    touch_every_ms: int = 0

    @classmethod
    def from_config(cls, config: dict) -> Behaviour:
        return cls(**{key: int(config[key]) for key in cls.__slots__ if key in config})

    def action(self, attempts: int) -> str:
        if attempts < self.hold_below:
            return HOLD
        if attempts < self.requeue_below:
            return REQUEUE
        return FINISH
