"""Shared fixtures: brokers in-process (on 127.0.0.1:0, tmp data path) and as real processes."""

from __future__ import annotations

import functools
import os
import sys
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from tests.support.processes import BrokerProcess, broker_args

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

#: The seconds an async test may take by tier, unless it says ``@pytest.mark.deadline(seconds)``:
#: the absolute bound around every I/O test, so that one waiting for what never comes fails
#: instead of hanging the run. A test's own ``trio.fail_after`` bounds a step more tightly.
DEADLINES = {"unit": 120.0, "integration": 300.0, "system": 900.0}


@asynccontextmanager
async def running_daemon(data_path: Path, *extra: str):
    """An in-process daemon; shut down gracefully on exit."""
    from broker.config.options import parse_args
    from broker.daemon import Daemon

    daemon = Daemon(parse_args(broker_args(data_path, *extra)))
    async with trio.open_nursery() as nursery:
        daemon.addresses = await nursery.start(daemon.run)
        try:
            yield daemon
        finally:
            daemon.request_shutdown()


@pytest.fixture
async def daemon(tmp_path):
    """A daemon with default options on a fresh data directory."""
    async with running_daemon(tmp_path / "data") as d:
        yield d


@pytest.fixture
def start_daemon(tmp_path):
    """Factory: ``async with start_daemon(*flags) as d`` on the test's data directory."""
    def factory(*extra: str, data_path: Path | None = None):
        return running_daemon(data_path or tmp_path / "data", *extra)
    return factory


@pytest.fixture
def broker_process(tmp_path):
    """Factory for real broker processes; every process started is killed at the end."""
    started: list[BrokerProcess] = []

    def factory(*extra: str, data_path: Path | None = None) -> BrokerProcess:
        proc = BrokerProcess(data_path or tmp_path / "data", *extra)
        started.append(proc)
        return proc.start()

    yield factory
    for proc in started:
        proc.kill()


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    """Keep the reason of a ``pytest.skip(reason)`` called in an async test.

    pytest-trio runs the test in a nursery; catching the exception group that carries the
    skip, it raises a new skip without the reason (the report reads ``Skipped``, in pytest's
    own file). The test's own skip is in that group: raise it instead."""
    try:
        return (yield)
    except pytest.skip.Exception as skipped:
        leaves, groups = [], [skipped.__context__]
        while groups:
            group = groups.pop()
            if isinstance(group, BaseExceptionGroup):
                groups.extend(group.exceptions)
            elif group is not None:
                leaves.append(group)
        if len(leaves) == 1 and isinstance(leaves[0], pytest.skip.Exception) and not skipped.msg:
            raise leaves[0] from None
        raise


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item):
    """Run every async test inside its deadline (:data:`DEADLINES`, or its ``deadline`` mark).

    Before pytest-trio wraps the test in ``trio.run`` (this wrapper runs first), the test
    function is replaced by one that awaits it inside a cancel scope with the deadline. A test
    on a mock clock is left alone: its time is virtual, and it bounds itself in it."""
    test = getattr(item, "obj", None)
    if item.get_closest_marker("trio") is not None and not hasattr(test, "hypothesis") and not any(
            isinstance(value, trio.abc.Clock) for value in item.funcargs.values()):
        marker = item.get_closest_marker("deadline")
        here = Path(__file__).parent
        tier = Path(item.path).relative_to(here).parts[0] if Path(item.path).is_relative_to(here) else ""
        seconds = marker.args[0] if marker is not None else DEADLINES.get(tier, max(DEADLINES.values()))
        item.obj = _within(test, seconds)
    return (yield)


def _within(test, seconds: float):
    @functools.wraps(test)
    async def bounded(**kwargs):
        with trio.CancelScope(deadline=trio.current_time() + seconds) as scope:
            return await test(**kwargs)
        if scope.cancelled_caught:
            raise trio.TooSlowError(f"the test ran past its deadline of {seconds:g} s "
                                    "(tests/conftest.py DEADLINES, or @pytest.mark.deadline(seconds))")
    return bounded
