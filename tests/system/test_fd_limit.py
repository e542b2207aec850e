"""Started under a low ``ulimit -n``: the soft limit is raised and logged; when even the hard
limit is exhausted, the accept loop backs off and logs once per interval, not every retry."""

from __future__ import annotations

import re
import resource

import pytest
import trio

from tests.support.processes import BrokerProcess
from tests.support.v2client import V2Client, connect
from tests.support.waiting import wait_for

SOFT = 64
_, HARD = resource.getrlimit(resource.RLIMIT_NOFILE)


def _limit(soft: int, hard: int):
    def set_limits() -> None:  # runs in the child between fork and exec
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return set_limits


async def _identified(address: tuple[str, int]) -> V2Client:
    client = await connect(address)
    await client.identify(client_id="fd")
    return client


@pytest.mark.skipif(HARD != resource.RLIM_INFINITY and HARD < 4 * SOFT, reason=f"hard open-files limit {HARD} is too low")
async def test_a_low_soft_limit_is_raised_to_the_hard_limit(tmp_path) -> None:
    proc = BrokerProcess(tmp_path / "data", preexec_fn=_limit(SOFT, HARD)).start()
    try:
        log = proc.log_text()
        match = re.search(r"INFO: open files limit: (\d+) \(soft limit raised from 64\)", log)
        assert match, log
        assert HARD == resource.RLIM_INFINITY or int(match.group(1)) == HARD
        with trio.fail_after(30):
            clients = [await _identified(proc.tcp) for _ in range(3 * SOFT)]  # more than the old limit
            for client in clients:
                await client.aclose()
        assert "accept failed" not in proc.log_text()
        assert proc.terminate() == 0
    finally:
        proc.kill()


async def test_an_exhausted_limit_backs_off_and_logs_once_per_interval(tmp_path) -> None:
    limit = 48  # the broker needs about 20 descriptors of its own
    proc = BrokerProcess(tmp_path / "data", preexec_fn=_limit(limit, limit)).start()
    try:
        assert f"open files limit: {limit}\n" in proc.log_text()
        with trio.fail_after(30):
            streams = [await trio.open_tcp_stream(*proc.tcp) for _ in range(2 * limit)]
            for stream in streams:
                await stream.send_all(b"  V2")
            await wait_for(lambda: "accept failed: [Errno 24]" in proc.log_text(), timeout=10)
            await trio.sleep(3)  # the time window over which failures are counted, not a barrier
            failed = proc.log_text().count("accept failed")
            assert failed == 1, proc.log_text()  # retries back off; the next report comes after 10 s
            for stream in streams:
                await stream.aclose()
            late = await _identified(proc.tcp)  # served once descriptors are free again
            await late.aclose()
            for stream in streams[limit // 2 :]:
                await stream.aclose()
        assert proc.terminate() == 0
    finally:
        proc.kill()
