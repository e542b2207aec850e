"""``--durable`` publishes over HTTP, pipelined on one connection: each ``200 OK`` is sent only
once its message is on stable storage, so a broker killed with SIGKILL right after the
answers delivers every answered message after its restart."""

from __future__ import annotations

from tests.integration.test_http_inline import CLOSE, answers, exchange, pub
from tests.support.v2client import consume


async def test_answered_durable_publishes_survive_kill_9(broker_process, tmp_path):
    count = 500
    proc = broker_process("--durable")
    data = b"".join(pub("t", b"d%d" % i) for i in range(count)) + CLOSE
    got = answers(await exchange(proc.http, data))
    assert got == [(200, b"OK")] * (count + 1)
    proc.kill()
    proc = broker_process("--durable", data_path=proc.data_path)
    assert await consume(proc.tcp, "t", "c", count) == [b"d%d" % i for i in range(count)]
