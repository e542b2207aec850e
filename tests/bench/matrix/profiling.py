"""Profiles of pynsqd during a run: py-spy or cProfile, summarized."""

from __future__ import annotations

import collections
import pstats
import re
import signal
import subprocess
import time
from pathlib import Path


class Profiler:
    """py-spy attached to the broker for the measured phase of a scenario."""

    def __init__(self, kind: str | None, out_dir: Path | None, name: str, pid: int, rate: int):
        self.proc = None
        if kind == "py-spy" and out_dir is not None:
            self.path = out_dir / (re.sub(r"[^A-Za-z0-9]+", "_", name) + ".txt")
            self.proc = subprocess.Popen(
                ["py-spy", "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw",
                 "--output", str(self.path), "--nonblocking"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            time.sleep(0.5)  # let it attach before the load starts

    def stop(self) -> dict:
        """Stop sampling and summarise the collected stacks."""
        if self.proc is None:
            return {}
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if not self.path.exists():
            err = self.proc.stderr.read().decode(errors="replace").strip() if self.proc.stderr else ""
            return {"error": f"py-spy wrote no profile: {err}"}
        return summarize_stacks(self.path.read_text())


def summarize_stacks(collapsed: str, top: int = 15) -> dict:
    """Top functions of py-spy's raw (collapsed) output by own samples, with inclusive share.

    py-spy leaves out idle threads (a broker waiting in epoll), so the shares are
    of the samples in which the broker was busy.
    """
    own: collections.Counter = collections.Counter()
    inclusive: collections.Counter = collections.Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        total += n
        own[frames[-1]] += n
        for f in set(frames):
            inclusive[f] += n
    rows = [{"function": f, "self_pct": round(100 * n / total, 1),
             "inclusive_pct": round(100 * inclusive[f] / total, 1), "samples": n}
            for f, n in own.most_common(top)]
    return {"samples": total, "top": rows}


def summarize_cprofile(path: Path, top: int = 25) -> dict:
    """Top functions of a cProfile dump by own time (over the broker's whole life)."""
    stats = pstats.Stats(str(path))
    total = stats.total_tt or 1.0
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    return {"seconds": total,
            "top": [{"function": f"{func} ({Path(file).name}:{line})", "self_pct": round(100 * tt / total, 1),
                     "inclusive_pct": round(100 * ct / total, 1), "calls": nc}
                    for (file, line, func), (cc, nc, tt, ct, _) in rows]}
