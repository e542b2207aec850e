"""What the README's steps and a broker started in a checkout leave there: none of it is in the
repository, git ignores all of it (``git status`` stays clean), and an image build leaves it out
of its context (``.dockerignore``), ``.venv`` first (hundreds of MB).

A broker started without ``--data-path`` writes into the current directory, as nsqd does: in a
checkout, ``nsqd.dat`` and the disk queues land at its root.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.support.http_client import request
from tests.support.installs import checkout_files, copy_checkout, fresh_venv
from tests.support.paths import REPO
from tests.support.processes import BrokerProcess

pytestmark = pytest.mark.skipif(checkout_files() is None,
                                reason="needs a git checkout: it checks what git tracks and ignores")

#: The names a broker writes into its data directory (see ``diskqueue/format.py``,
#: ``broker/storage/metadata.py``, ``broker/storage/nsqdimport.py``, ``broker/replication``).
_BROKER_FILES = re.compile(r"nsqd\.dat(\..+)?|.+\.diskqueue\..+|.+\.nsqd-import\..+|replication\..+")


def _dockerignore_patterns() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert not [p for p in patterns if "[" in p or "\\" in p], "the matcher below does not read classes or escapes"
    return patterns


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """Docker's reading of a ``.dockerignore`` pattern (relative to the context's root): ``*``
    and ``?`` within one name, ``**`` across directories."""
    pattern = pattern.strip("/")
    out, index = "", 0
    while index < len(pattern):
        if pattern.startswith("**/", index):
            out, index = out + "(?:.*/)?", index + 3
        elif pattern.startswith("**", index):
            out, index = out + ".*", index + 2
        elif pattern[index] in "*?":
            out, index = out + ("[^/]*" if pattern[index] == "*" else "[^/]"), index + 1
        else:
            out, index = out + re.escape(pattern[index]), index + 1
    return re.compile(out)


def _left_out_of_image(path: str, patterns: list[str]) -> bool:
    """Whether an image build leaves ``path`` out of its context: the last pattern matching it
    or a directory above it decides, ``!`` taking it back in (Docker's ``PatternMatcher``)."""
    parts = path.strip("/").split("/")
    excluded = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        regex = _pattern_regex(pattern[1:] if negated else pattern)
        if any(regex.fullmatch("/".join(parts[:end])) for end in range(1, len(parts) + 1)):
            excluded = not negated
    return excluded


def test_no_file_a_broker_writes_is_in_the_repository():
    assert [name for name in checkout_files() or () if _BROKER_FILES.fullmatch(name.rpartition("/")[2])] == []


def test_the_image_build_context_keeps_every_file_of_the_repository():
    patterns = _dockerignore_patterns()
    assert [name for name in checkout_files() or () if _left_out_of_image(name, patterns)] == []


@pytest.mark.slow
async def test_what_the_readme_steps_and_a_broker_in_the_checkout_write_is_ignored(tmp_path):
    checkout = copy_checkout(tmp_path / "checkout")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(checkout), "-c", "user.name=test", "-c", "user.email=test@example.com",
                               *args], check=True, capture_output=True, text=True, env=env, timeout=60).stdout

    git("init", "-q")
    git("add", "-A")
    git("commit", "-q", "-m", "the checkout")
    # The README's set-up: python3 -m venv .venv && .venv/bin/pip install . && mkdir -p data &&
    # .venv/bin/pynsqd --data-path=data (the venv sees the test's packages: nothing to download
    # but the build backend; --ignore-installed: the test's Python may hold a pynsqd already)
    python = fresh_venv(checkout / ".venv")
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed", "."],
                   cwd=checkout, env=env, check=True, timeout=600)
    (checkout / "data").mkdir()
    started = [
        BrokerProcess(checkout / "data", program=[str(checkout / ".venv" / "bin" / "pynsqd")], cwd=checkout,
                      log_path=tmp_path / "readme.log"),
        # one started in the checkout with the data path left at the current directory
        BrokerProcess(checkout, program=[sys.executable, "-m", "broker"], cwd=checkout, log_path=tmp_path / "root.log"),
    ]
    for broker in started:
        try:
            broker.start()
            http = broker.http
            for target in ("/pub?topic=t", "/pub?topic=t&key=k", "/channel/create?topic=t&channel=c",
                           "/pub?topic=t&defer=60000"):
                assert (await request(http, "POST", target, b"message")).status == 200
            assert broker.terminate() == 0
        finally:
            broker.kill()
    at_root = {path.name for path in checkout.iterdir()}
    assert {"nsqd.dat", "t:c.diskqueue.meta.dat", "t#keys.diskqueue.meta.dat"} <= at_root
    assert {"nsqd.dat", "t:c.diskqueue.meta.dat"} <= {path.name for path in (checkout / "data").iterdir()}

    assert git("status", "--porcelain", "--untracked-files=all") == ""
    patterns = _dockerignore_patterns()
    ignored = [line[3:] for line in git("status", "--porcelain", "--ignored").splitlines()]
    assert ".venv/" in ignored and "nsqd.dat" in ignored
    assert [path for path in ignored if not _left_out_of_image(path, patterns)] == []
