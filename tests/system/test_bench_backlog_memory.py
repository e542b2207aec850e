"""``python -m tests.bench.bench_backlog_memory``: it builds the backlog it says, in every channel,
and prints the broker's memory at each step (a real broker process and the bench writer)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.support.paths import REPO

ROW = re.compile(r"^\| ([\d,]+) \| ([\d,]+) \| ([\d,]+) \| (\d+) \| (\d+) \| \d+ \|$", re.M)


@pytest.mark.parametrize("mode", [["--no-durable"], []], ids=["default", "durable"])
def test_the_backlog_bench_fills_every_channel_and_reports_memory(mode: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "tests.bench.bench_backlog_memory", "--channels", "4",
                           "--count", "4000", *mode], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [tuple(int(v.replace(",", "")) for v in m.groups()) for m in ROW.finditer(done.stdout)]
    assert rows, done.stdout
    published, first, last, rss, peak = rows[-1]
    assert (published, first, last) == (4000, 4000, 4000)
    assert 0 < rss <= peak
