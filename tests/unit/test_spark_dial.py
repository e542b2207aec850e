"""The ``client_id`` each connector connection IDENTIFYs with (``pyspark_nsq/dial.py``): readable, and within 64 characters."""

from __future__ import annotations

from pyspark_nsq.dial import MAX_CLIENT_ID, client_name


def test_parts_are_joined_by_spaces():
    assert client_name("stream", "3f2a9c1b0d4e", "batch", 7, "partition", 1) == (
        "stream 3f2a9c1b0d4e batch 7 partition 1")


def test_a_long_name_is_cut_to_the_limit():
    name = client_name("stream", "q" * 100, "batch", 7, "partition", 1)
    assert len(name) == MAX_CLIENT_ID == 64
    assert name == "stream " + "q" * 57
