"""SIGTERM with a full disk: everything that fits is written, the rest is counted, one line says so.

The data path is a small tmpfs (mounting one needs root; the test skips elsewhere), so
the disk really refuses with ENOSPC. Messages wait in memory (a large
``--mem-queue-size``) until the shutdown writes them out: the first channel's fit,
the second channel's and a channel-less topic's do not.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from tests.support.mounts import tmpfs
from tests.support.processes import BrokerProcess

BODY = b"x" * 1000
COUNT = 2000


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 3 MiB tmpfs: room for one queue of COUNT messages, not for two."""
    with tmpfs(tmp_path / "disk", "3m") as disk:
        yield disk


def _http(proc: BrokerProcess, target: str, body: bytes | None = None) -> bytes:
    """GET ``target``, or POST ``body``; the response body."""
    host, port = proc.http
    with urllib.request.urlopen(f"http://{host}:{port}{target}", data=body, timeout=30) as reply:
        return reply.read()


def test_sigterm_on_a_full_disk_writes_what_fits_counts_the_rest_and_exits_with_one_line(small_disk, tmp_path):
    proc = BrokerProcess(small_disk, "--mem-queue-size=100000", log_path=tmp_path / "broker.log").start()
    try:
        for topic in ("t", "u", "w"):
            _http(proc, f"/topic/create?topic={topic}", b"")
        for topic in ("t", "u"):
            _http(proc, f"/channel/create?topic={topic}&channel=c", b"")
        for topic in ("t", "u", "w"):
            assert _http(proc, f"/mpub?topic={topic}", b"\n".join([BODY] * COUNT)) == b"OK"
        status = proc.terminate()
    finally:
        proc.kill()

    log = proc.log_text()
    assert status == 1
    assert "Traceback" not in log
    assert f"channel t:c: wrote {COUNT} ready and 0 deferred messages to disk" in log
    assert f"ERROR: channel u:c: {COUNT} ready messages could not be written to disk: " in log
    assert f"ERROR: topic w: {COUNT} messages could not be written to disk: " in log
    assert "no space left on device" in log
    last = log.strip().splitlines()[-1]
    assert last.endswith(f"FATAL: shutdown incomplete: {2 * COUNT} messages could not be written to disk "
                         "(see the errors above)")

    # what was written is there after a restart, and the metadata still names every queue
    again = BrokerProcess(small_disk, log_path=tmp_path / "again.log").start()
    try:
        stats = json.loads(_http(again, "/stats?format=json&include_clients=false"))
    finally:
        again.terminate()
        again.kill()
    depths = {(t["topic_name"], c["channel_name"]): c["depth"] for t in stats["topics"] for c in t["channels"]}
    assert depths == {("t", "c"): COUNT, ("u", "c"): 0}
    assert sorted(t["topic_name"] for t in stats["topics"]) == ["t", "u", "w"]
