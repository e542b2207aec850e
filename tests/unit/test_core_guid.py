"""Message ids: 16 hex characters, unique and increasing, nsqd's bit layout."""

import re

import pytest

from broker.core.guid import MAX_NODE_ID, GuidFactory


def test_ids_are_sixteen_hex_characters_carrying_the_node_id():
    ids = GuidFactory(1023).next_ids(10)
    assert all(re.fullmatch(rb"[0-9a-f]{16}", i) for i in ids)
    assert {(int(i, 16) >> 12) & 0x3FF for i in ids} == {1023}


def test_ids_stay_unique_and_increasing_past_a_full_tick_of_sequence_numbers():
    factory = GuidFactory(7)
    ids = factory.next_ids(10_000) + [factory.next_id() for _ in range(100)] + factory.next_ids(5000)
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)


@pytest.mark.parametrize("node_id", [-1, MAX_NODE_ID])
def test_node_id_must_be_in_range(node_id):
    with pytest.raises(ValueError):
        GuidFactory(node_id)


def test_ids_taken_one_at_a_time_stay_unique_and_increasing_past_a_full_tick():
    factory = GuidFactory(3)
    ids = [factory.next_id() for _ in range(3 * 4096)]  # more than one tick's sequence numbers, whatever the clock
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
