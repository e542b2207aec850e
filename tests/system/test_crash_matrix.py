"""The crash matrix (``tests/bench/crash_matrix.py``) at CI size: two SIGKILL rounds in each of its 12 cells.

The full run (100 rounds per cell) is documented in the script and in deploy/README.md; here
every cell runs briefly against real ``pynsqd --durable`` processes, and what its
clients saw is checked: nothing acknowledged lost, no message delivered twice in a
run after its FIN, no deferred message early.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
MODULE = "tests.bench.crash_matrix"  # run from the repository root


def test_every_cell_keeps_every_acknowledged_message_and_delivers_no_copy():
    done = subprocess.run([sys.executable, "-m", MODULE, "--rounds=2", "--seed=11", "--json"],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    results = json.loads(done.stdout)
    assert len(results) == 12, done.stderr
    for cell in results:
        assert cell["acknowledged"] > 100, cell
        assert (cell["lost"], cell["copies"], cell["early"]) == (0, 0, 0), cell
    assert done.returncode == 0, done.stderr
    # the random consumers' REQs and timeouts brought messages back, as they should
    assert sum(cell["redelivered"] for cell in results if ":random:" in cell["cell"]) > 0
