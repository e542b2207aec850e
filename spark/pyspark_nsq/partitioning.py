"""How many messages each input partition reads: shares of a limit, and splits of a backlog."""

from __future__ import annotations

from .options import Address

__all__ = ["Pair", "allocate", "split", "ROWS_PER_PARTITION", "MIN_ROWS_TO_SPLIT"]

#: A partition reads at most this many messages: big enough to outweigh a task's
#: start-up (~0.1 s), small enough that a deep backlog spreads over the cores.
ROWS_PER_PARTITION = 50_000
#: From this many messages on, a pair (nsqd, topic) is read by two partitions at
#: least, so that two cores share even a moderate backlog.
MIN_ROWS_TO_SPLIT = 10_000

#: A channel to read from: (nsqd, topic).
Pair = tuple[Address, str]


def split(count: int) -> list[int]:
    """``count`` messages as the sizes of the partitions that read them."""
    parts = max(-(-count // ROWS_PER_PARTITION), 2 if count >= MIN_ROWS_TO_SPLIT else 1)
    share, extra = divmod(count, parts)
    return [share + (1 if index < extra else 0) for index in range(parts)]


def allocate(available: dict[Pair, int], budget: int | None) -> dict[Pair, int]:
    """Share ``budget`` messages among the pairs in proportion to what each holds."""
    total = sum(available.values())
    if budget is None or budget >= total:
        return dict(available)
    taken = {pair: count * budget // total for pair, count in available.items()}
    left = budget - sum(taken.values())
    for pair in sorted(available, key=lambda p: available[p] - taken[p], reverse=True):
        if left <= 0:
            break
        if taken[pair] < available[pair]:
            taken[pair] += 1
            left -= 1
    return taken
