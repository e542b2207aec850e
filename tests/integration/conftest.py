"""Fixtures of the integration tier."""

from __future__ import annotations

import pytest

from tests.support.replica_nodes import lookupd_running


@pytest.fixture
def lookupd(tmp_path):
    """nsq's nsqlookupd on loopback ports, stopped at the end (replication's nodes find each other through it)."""
    with lookupd_running(tmp_path) as program:
        yield program
