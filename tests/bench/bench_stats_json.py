"""Writing ``/stats?format=json`` for many topics: the standard library's C encoder made Go's
against the Go-style encoder written in Python, on the same document.

The document is what ``/stats`` shows for ``--topics`` topics of one channel each, without
e2e percentiles (the case the C encoder takes: the document then holds no float). Both
encoders must write the same bytes; the best of ``--rounds`` runs of each is printed.

Usage (from the repository root)::

    python -m tests.bench.bench_stats_json --topics 10000
"""

from __future__ import annotations

import argparse
import sys
import time

from broker.gocompat import go_json
from broker.observe.render_json import stats_document
from broker.observe.stats import E2eStats
from tests.support.snapshots import channel, snap, topic


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topics", type=int, default=10000, help="topics of one channel each (default 10000)")
    p.add_argument("--rounds", type=int, default=5, help="runs of each encoder; the best is shown (default 5)")
    opts = p.parse_args(sys.argv[1:] if argv is None else argv)
    no_latency = E2eStats(count=0, percentiles=None)
    document = stats_document(snap(topics=tuple(
        topic(f"topic_{i:05d}", e2e_processing_latency=no_latency,
              channels=(channel("ch", e2e_processing_latency=no_latency),))
        for i in range(opts.topics))))
    body = go_json(document, floats=False)
    if body != go_json(document):
        print("the two encoders disagree", file=sys.stderr)
        return 1
    best = {}
    for name, floats in (("C encoder made Go's", False), ("Go-style encoder in Python", True)):
        runs = []
        for _ in range(opts.rounds):
            start = time.perf_counter()
            go_json(document, floats=floats)
            runs.append(time.perf_counter() - start)
        best[name] = min(runs)
        print(f"{name}: {best[name] * 1000:.0f} ms for {len(body):,} bytes")
    fast, general = best.values()
    print(f"ratio: {fast / general:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
