"""Fixtures of the unit tests: the fakes of :mod:`tests.support.fakes`, ready to use."""

from __future__ import annotations

import pytest

from tests.support.fakes import FakeHost, FakeSubscriber


@pytest.fixture
def make_host(tmp_path):
    """Factory: ``make_host(*flags)`` with the data in the test's temporary directory."""
    return lambda *flags: FakeHost(tmp_path, *flags)


@pytest.fixture
def subscriber():
    """Factory for :class:`FakeSubscriber`."""
    return FakeSubscriber


@pytest.fixture
def messages():
    """Factory: ``messages(b"a", b"b", due_ns=0)``, new messages with distinct ids and the current timestamp."""
    from broker.core.message import Message, now_ns

    counter = iter(range(1 << 30))

    def make(*bodies, due_ns=0):
        return [Message(b"%016x" % next(counter), body, now_ns(), 0, due_ns) for body in bodies]

    return make
