"""The leased source's offset: typed inside, the same JSON in Spark's checkpoint."""

from __future__ import annotations

import json

import pytest

from pyspark_nsq.lease_offset import LeaseOffset, PlannedRead

#: As the connector has written it into checkpoints since leased reads began.
CHECKPOINTED = ('{"offset": 12000, "query": "3f2a9c1b7d4e", "batch": 4, '
                '"reads": [["127.0.0.1:4150", "events", 5000], ["[::1]:4150", "events", 7000]]}')


def test_an_offset_from_an_existing_checkpoint_loads():
    offset = LeaseOffset.from_json(CHECKPOINTED)
    assert offset == LeaseOffset(12000, "3f2a9c1b7d4e", 4, (PlannedRead("127.0.0.1:4150", "events", 5000),
                                                             PlannedRead("[::1]:4150", "events", 7000)))
    assert offset.planned == 12000
    assert LeaseOffset.from_json(json.loads(CHECKPOINTED)) == offset


def test_it_is_written_back_in_the_same_shape():
    assert json.dumps(LeaseOffset.from_json(CHECKPOINTED).to_json()) == CHECKPOINTED


def test_the_initial_offset_has_no_reads():
    assert LeaseOffset(0, "q", 0).to_json() == {"offset": 0, "query": "q", "batch": 0, "reads": []}


@pytest.mark.parametrize("value", [{"offset": 7}, '{"offset": 7}'])
def test_an_offset_without_a_query_loads_as_one_without_a_plan(value):
    offset = LeaseOffset.from_json(value)
    assert offset == LeaseOffset(7)
    assert offset.to_json() == {"offset": 7}


def test_an_empty_offset_loads_as_nothing_read():
    assert LeaseOffset.from_json({}) == LeaseOffset()


@pytest.mark.parametrize("value", ['[1, 2]', {"offset": "many"}, {"offset": 1, "query": "q", "reads": [[1, 2]]}])
def test_a_malformed_offset_is_refused(value):
    with pytest.raises((TypeError, ValueError)):
        LeaseOffset.from_json(value)


def test_it_is_frozen():
    with pytest.raises(AttributeError):
        LeaseOffset().batch = 1  # type: ignore[misc]
