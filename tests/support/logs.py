"""What a test asserts of the broker's log when it fed it hostile input."""

from __future__ import annotations

import logging

import pytest

__all__ = ["no_traceback_logged"]


def no_traceback_logged(caplog: pytest.LogCaptureFixture) -> None:
    """No unexpected failure was logged (nsqd-like one-line ERRORs about the input are expected)."""
    bad = [r for r in caplog.records if r.exc_info or r.levelno >= logging.CRITICAL]
    assert not bad, [r.getMessage() for r in bad]
    assert "Traceback" not in caplog.text
