"""Fixtures for the interoperability tests: a broker process and a place for client logs."""

from __future__ import annotations

import pytest


@pytest.fixture
def broker(broker_process):
    """A real broker process with default options on a fresh data directory."""
    return broker_process()


@pytest.fixture
def logs(tmp_path):
    """Where the client processes' stderr goes (shown when a client fails)."""
    return tmp_path / "clients"
