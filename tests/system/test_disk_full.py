"""A disk that fills up while pynsqd runs (a real process on a small tmpfs; mounting needs root).

A filler file leaves the data path about a megabyte; publishers of every kind (TCP ``PUB``,
``MPUB``, ``DPUB``, HTTP ``/pub``, ``/mpub``) publish until each has been refused. With
``--mem-queue-size=0`` every message goes through the disk, so the refusals come as soon as
the disk does. What a user must see, as with nsqd 1.3.0:

* TCP publishers get ``E_PUB_FAILED PUB failed write <segment>: no space left on device``
  (``E_MPUB_FAILED``, ``E_DPUB_FAILED``) and the connection is closed, as nsqd does; HTTP
  publishers get ``503 {"message":"EXITING"}`` and keep their connection;
* ``/ping`` answers ``500 NOK - <the error>`` while the disk refuses;
* a consumer keeps getting what its channel holds while the disk is full (with ``--durable``
  a message is in a channel once its copy is on disk: what the topic accepted but could not
  copy waits, and is copied after a restart);
* once the filler is deleted every kind of publish works again, without a restart, and
  ``/ping`` answers ``OK`` after the first write that succeeds;
* every message that got ``OK`` is delivered, and none that was refused; with ``--durable``
  also after a SIGKILL while the disk is full and a restart once space is free (that start cuts
  off what the killed broker's segments held ahead of their data; after a graceful stop, a
  start on a full disk is refused with nsqd's FATAL line: ``nsqd.dat`` cannot be written).

Where a tmpfs cannot be mounted, ``tests/integration/test_disk_faults_injected.py`` runs the
same publishers against an in-process broker whose disk refuses through ``diskqueue.fileops``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import trio

from tests.support.http_client import HTTPClient, request
from tests.support.mounts import fill, tmpfs
from tests.support.processes import BrokerProcess, run_to_exit
from tests.support.publishers import KINDS, Consumer, Ledger, publish_once, publish_until

#: Free space left by the filler: a hundred messages' worth.
ROOM = 1 << 20
#: Bodies larger than a page: a write that fits in what is left of a file's last page
#: succeeds on a full disk, and would make the refusals depend on the sizes of earlier writes.
SIZE = 5000


def check_refusals(ledger: Ledger, reason: bytes) -> None:
    """Each kind was refused with nsqd's answer for a failed put."""
    for kind in KINDS:
        for answer in ledger.refused[kind]:
            if kind.startswith("HTTP"):
                assert answer == b'503 {"message":"EXITING"}', (kind, answer)
            else:
                assert re.fullmatch(rb"E_%s_FAILED %s failed write \S+\.diskqueue\.\d{6}\.dat: %s"
                                    % (kind.encode(), kind.encode(), reason), answer), (kind, answer)


async def check_ping(http: tuple[str, int], healthy: bool, reason: bytes = b"") -> None:
    reply = await request(http, "GET", "/ping")
    if healthy:
        assert (reply.status, reply.body) == (200, b"OK")
    else:
        # the last failure: a write (nsqd's words), or a checkpoint the disk queue could not sync
        assert reply.status == 500 and reply.body.startswith(b"NOK - "), reply.body
        assert reason in reply.body.lower(), reply.body


@pytest.mark.parametrize("mode", ["default", "durable"])
async def test_a_full_disk_refuses_publishes_keeps_delivering_and_recovers(tmp_path: Path, mode: str) -> None:
    flags = ["--mem-queue-size=0"] + (["--durable"] if mode == "durable" else [])
    ledger = Ledger("t", SIZE)
    with tmpfs(tmp_path / "disk", "8m") as disk, trio.fail_after(120):
        proc = BrokerProcess(disk / "data", *flags, log_path=tmp_path / "broker.log").start()
        try:
            await request(proc.http, "POST", "/topic/create?topic=t")
            await request(proc.http, "POST", "/channel/create?topic=t&channel=c")
            filler = fill(disk / "filler", ROOM)

            await publish_until(proc.tcp, proc.http, ledger)
            check_refusals(ledger, b"no space left on device")
            assert len(ledger.acked) > 50
            await check_ping(proc.http, healthy=False, reason=b"no space left on device")
            async with HTTPClient(proc.http) as client:  # HTTP keeps the connection, as nsqd's does
                refused = await client.post("/pub?topic=t", b"refused".ljust(SIZE, b"x"))
                ping = await client.get("/ping")
                assert (refused.status, ping.status, ping.closed) == (503, 500, False)

            # what the channel holds is delivered while the disk is full (with --durable, messages
            # the topic could not copy to the channel wait for space: see the module docstring)
            stats = (await request(proc.http, "GET", "/stats?format=json&topic=t&channel=c")).json()
            queued = stats["topics"][0]["channels"][0]["depth"]
            assert queued >= 10, stats
            consumer = await Consumer.subscribe(proc.tcp, "t", "c")
            await consumer.take(queued)
            await check_ping(proc.http, healthy=False, reason=b"no space left on device")

            filler.unlink()  # space again: every kind publishes, no restart needed
            for kind in KINDS:
                assert await publish_once(kind, proc.tcp, proc.http, ledger) is None, kind
            await check_ping(proc.http, healthy=True)

            if mode == "durable":
                # full again, killed while full, restarted once space is back
                fill(disk / "filler", 0)
                await publish_until(proc.tcp, proc.http, ledger, refusals=2)
                await consumer.aclose()
                proc.kill()
                (disk / "filler").unlink()
                # the first start recovers: it cuts off the zero bytes the killed broker's durable
                # segments held ahead of their data, freeing their space; then a graceful stop
                proc = BrokerProcess(disk / "data", *flags, log_path=tmp_path / "recovered.log").start()
                assert proc.terminate() == 0
                # a start on the full disk is refused, as nsqd refuses it: nsqd.dat cannot be written
                fill(disk / "filler", 0)
                refused_start = run_to_exit(disk / "data", *flags)
                assert (refused_start.status, refused_start.fatal_lines) == (1, [
                    f"failed to persist metadata - write {disk}/data/nsqd.dat.tmp: no space left on device"
                ]), refused_start.output
                (disk / "filler").unlink()
                proc = BrokerProcess(disk / "data", *flags, log_path=tmp_path / "restarted.log").start()
                consumer = await Consumer.subscribe(proc.tcp, "t", "c", delivered=consumer.delivered)

            await consumer.drain(ledger.acked)
            for msg in await consumer.client.sync():  # whatever else was ready: nothing refused may be
                consumer.delivered[msg.body] += 1
            refused = consumer.delivered.keys() - ledger.acked
            assert not refused, sorted(refused)[:5]
            assert proc.terminate() == 0
        finally:
            proc.kill()
    for log in tmp_path.glob("*.log"):
        assert "Traceback" not in log.read_text(), log
