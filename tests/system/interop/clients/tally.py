"""What the asyncio client scripts (pynsq, ansq) share for ``consume``: counting FINs, and ending."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from report import EXIT_TIMEOUT, emit

__all__ = ["Tally", "finish_when_enough"]


class Tally:
    """Counts FINs across readers; sets ``enough`` once ``expect`` were sent."""

    def __init__(self, expect: int):
        self.expect = expect
        self.finished = 0
        self.enough = asyncio.Event()

    def on_finish(self, *args, **kwargs) -> None:
        """Count one FIN (a callback: whatever the library passes is ignored)."""
        self.finished += 1
        if self.finished >= self.expect:
            self.enough.set()


async def finish_when_enough(tally: Tally, config: dict, close: Callable[[], Awaitable[None]]) -> int:
    """Wait for ``expect`` FINs (``deadline`` s), linger, close; the script's exit status."""
    try:
        await asyncio.wait_for(tally.enough.wait(), config.get("deadline", 20))
    except TimeoutError:
        emit("timeout", finished=tally.finished)
        return EXIT_TIMEOUT
    await asyncio.sleep(config.get("linger", 0))
    await close()
    emit("done", finished=tally.finished)
    return 0
