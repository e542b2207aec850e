"""A test that skips says why: pytest's summary (``-rs``) shows the reason of a skip in an async
test as it shows a plain test's. pytest-trio alone reported such a skip as ``Skipped``, at a
line of pytest's own file."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.support.paths import REPO

_TESTS = textwrap.dedent("""
    import pytest
    import trio


    async def test_in_the_body():
        pytest.skip("the reason in the body")


    async def test_in_a_nursery():
        async with trio.open_nursery():
            pytest.skip("the reason in a nursery")


    def test_plain():
        pytest.skip("the reason of a plain test")
""")


def test_a_skip_in_an_async_test_reports_its_reason(tmp_path):
    (tmp_path / "test_skips.py").write_text(_TESTS)
    # the suite's configuration (trio mode) and its conftest, on a file of its own
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "tests.conftest",
         "-c", str(REPO / "pyproject.toml"), "--rootdir", str(tmp_path), "test_skips.py"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)
    summary = sorted(line for line in done.stdout.splitlines() if line.startswith("SKIPPED"))
    assert summary == ["SKIPPED [1] test_skips.py:12: the reason in a nursery",
                       "SKIPPED [1] test_skips.py:16: the reason of a plain test",
                       "SKIPPED [1] test_skips.py:7: the reason in the body"], done.stdout + done.stderr
