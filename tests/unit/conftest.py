"""Fixtures of the unit tests: the fakes of :mod:`tests.support.fakes`, ready to use, and the logger reset."""

from __future__ import annotations

import logging

import pytest

from broker.config.log import LOGGER_NAME
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


@pytest.fixture
def pynsqd_logger():
    """Puts the ``pynsqd`` logger's handlers and level back as they were after the test."""
    logger = logging.getLogger(LOGGER_NAME)
    handlers, level = list(logger.handlers), logger.level
    yield
    for handler in list(logger.handlers):
        if handler not in handlers:
            logger.removeHandler(handler)
    logger.setLevel(level)
