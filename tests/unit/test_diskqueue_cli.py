"""``python -m diskqueue``: its reports, exit statuses and help, run as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import trio

from broker.core.message import MAX_PREFIXES, RECORD_OVERHEAD
from diskqueue import DiskQueue
from tests.support.paths import REPO

#: The largest record a broker with the default --max-msg-size writes: body, header, prefixes.
LARGEST_BROKER_RECORD = 1048576 + RECORD_OVERHEAD + MAX_PREFIXES


def run_checker(*args: str) -> subprocess.CompletedProcess[str]:
    # argparse wraps --help to the terminal's width
    env = {**os.environ, "COLUMNS": "80"}
    return subprocess.run([sys.executable, "-m", "diskqueue", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env=env)


async def make_queue(path: Path, name: str, *bodies: bytes) -> None:
    with trio.fail_after(20):
        queue = DiskQueue(name, path, max_msg_size=LARGEST_BROKER_RECORD)
        for body in bodies:
            queue.put(body)
        await queue.close()


def test_a_queue_that_does_not_exist_is_an_error_listing_the_queues(tmp_path):
    trio.run(make_queue, tmp_path, "orders", b"x")
    trio.run(make_queue, tmp_path, "orders:billing", b"y")
    done = run_checker(str(tmp_path), "nosuchq")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == f"no disk queue named 'nosuchq' in {tmp_path} (queues found: orders, orders:billing)\n"


def test_no_queues_found_is_said_in_the_error(tmp_path):
    done = run_checker(str(tmp_path), "nosuchq")
    assert (done.returncode, done.stderr) == (2, f"no disk queue named 'nosuchq' in {tmp_path} (queues found: none)\n")


def test_an_unreadable_data_path_is_a_usage_error(tmp_path):
    done = run_checker(str(tmp_path / "missing"))
    assert done.returncode == 2
    assert done.stderr.startswith(f"cannot read {tmp_path / 'missing'}: ")


def test_existing_queues_are_checked_and_reported_ok(tmp_path):
    # a record as large as the broker writes for a deferred message of --max-msg-size bytes
    trio.run(make_queue, tmp_path, "orders", b"a", b"b" * (LARGEST_BROKER_RECORD))
    done = run_checker(str(tmp_path), "orders")
    assert done.returncode == 0, done.stdout
    assert done.stdout.splitlines()[0] == f"queue 'orders' in {tmp_path}: OK"
    assert "  readable records from the committed cursor: 2" in done.stdout


def test_help_is_plain_text_and_documents_every_option():
    done = run_checker("--help")
    assert done.returncode == 0
    text = done.stdout
    assert "``" not in text
    assert text.startswith("usage: python -m diskqueue [-h] [--min-msg-size BYTES] [--max-msg-size BYTES]\n")
    assert "  --min-msg-size BYTES  smallest valid record; shorter ones count as damage\n" in text
    assert "  --max-msg-size BYTES  largest valid record; longer ones count as damage\n" in text
    assert f"(default: {LARGEST_BROKER_RECORD}, the broker's default --max-msg-size" in text
    assert "exit status: 0 when every queue checked is OK, 1 when any has problems,\n" in text
