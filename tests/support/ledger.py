"""What a test's clients were told and given, by message body: the one ledger every
publishing and consuming test keeps (crash tests, disk-fault tests, the crash matrix).

Every count comes from what the clients saw, nothing from the broker's insides:

* ``acked``: bodies a publisher got ``OK`` for; ``refused``: each kind of publisher's
  answers when it did not (see :mod:`tests.support.publishers`);
* ``due``: the earliest wall-clock time a deferred body may be delivered; ``early``:
  the deliveries that came before it;
* ``deliveries``: how often each body was delivered; ``finished``: the bodies a FIN was
  sent for and not refused;
* ``run``: the broker's incarnation (a test that kills and restarts it counts them), so
  that a delivery after a FIN in an earlier run (``fin_undone``: the crash came before
  the FIN was on disk) is told from one in the same run (:meth:`copies`: two copies of
  one message).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

__all__ = ["CLOCK_SLACK_NS", "Ledger"]

#: Slack for comparing the test's wall clock with due times (same machine, same clock).
CLOCK_SLACK_NS = 20_000_000


@dataclass
class Ledger:
    """Every acknowledgement, refusal, delivery and answer the clients saw, by message body."""

    topic: str = "t"
    #: the length of the bodies :meth:`bodies` makes
    size: int = 1000
    acked: set[bytes] = field(default_factory=set)
    refused: dict[str, list[bytes]] = field(default_factory=dict)
    due: dict[bytes, int] = field(default_factory=dict)
    deliveries: Counter[bytes] = field(default_factory=Counter)
    early: list[str] = field(default_factory=list)
    run: int = 0
    #: body -> the runs in which a FIN was sent for it (and not refused)
    fin_runs: dict[bytes, set[int]] = field(default_factory=lambda: defaultdict(set))
    #: body -> (run, what the client did with it last)
    last: dict[bytes, tuple[int, str]] = field(default_factory=dict)
    fin_undone: int = 0
    redelivered: int = 0
    _suspects: list[tuple[bytes, int]] = field(default_factory=list)
    _failed_fins: set[tuple[bytes, int]] = field(default_factory=set)
    _numbers: Counter[str] = field(default_factory=Counter)

    # ---------------------------------------------------------------- publishing

    def bodies(self, kind: str, count: int) -> list[bytes]:
        """``count`` new bodies for ``kind``, each unique, padded to :attr:`size`."""
        start = self._numbers[kind]
        self._numbers[kind] += count
        return [f"{kind}-{n}-".encode().ljust(self.size, b"x") for n in range(start, start + count)]

    def refused_kinds(self) -> set[str]:
        """The kinds of publisher that were refused at least once."""
        return {kind for kind, answers in self.refused.items() if answers}

    def defer(self, body: bytes, defer_ms: int) -> None:
        """``body`` is about to be published deferred by ``defer_ms``: it may not come before then."""
        self.due[body] = time.time_ns() + defer_ms * 1_000_000

    # ---------------------------------------------------------------- consuming

    @property
    def finished(self) -> set[bytes]:
        """The bodies a FIN was sent for (and not refused with ``E_FIN_FAILED``)."""
        return set(self.fin_runs)

    @property
    def delivery_count(self) -> int:
        """Every delivery of every body."""
        return self.deliveries.total()

    def delivered(self, body: bytes) -> None:
        """A consumer was given ``body``."""
        now = time.time_ns()
        self.deliveries[body] += 1
        due = self.due.get(body)
        if due is not None and now < due - CLOCK_SLACK_NS:
            self.early.append(f"{body!r} delivered {(due - now) / 1e6:.0f} ms early")
        fins = self.fin_runs.get(body)
        if fins and self.run in fins:
            # a copy, unless the FIN comes back E_FIN_FAILED (it came after the timeout that
            # brought the message back; the two answers may come on different connections)
            self._suspects.append((body, self.run))
        elif fins:
            self.fin_undone += 1
        elif body in self.last:
            self.redelivered += 1
        self.last[body] = (self.run, "in flight")

    def answered(self, body: bytes, what: str) -> None:
        """The consumer answered ``body`` with ``what`` (``FIN``, ``REQ``, or ``timeout``: no answer)."""
        self.last[body] = (self.run, what)
        if what == "FIN":
            self.fin_runs[body].add(self.run)

    def fin_failed(self, body: bytes) -> None:
        """The broker answered E_FIN_FAILED (the message had timed out first): it comes back, rightly."""
        self._failed_fins.add((body, self.run))
        self.last[body] = (self.run, "timeout")
        runs = self.fin_runs.get(body)
        if runs is not None:
            runs.discard(self.run)
            if not runs:
                del self.fin_runs[body]

    def copies(self) -> list[tuple[bytes, int]]:
        """Deliveries after a FIN of the same message in the same run that the broker did not refuse."""
        return [(body, run) for body, run in self._suspects if (body, run) not in self._failed_fins]

    def report(self, label: str) -> str:
        """One line: how much was acknowledged, delivered and delivered more than once."""
        duplicated = [n for n in self.deliveries.values() if n > 1]
        return (f"{label}: {len(self.acked)} acknowledged, {len(self.deliveries)} delivered, "
                f"{sum(n - 1 for n in duplicated)} duplicate deliveries, {len(duplicated)} messages duplicated")
