"""The key store of keyed publishes: windows, the key limit, forgetting, reading back."""

from __future__ import annotations

import pytest

from broker.core.keys import NO_ID, RUN_NS, KeyStore, TopicKeys, decode_record, encode_record

S = 1_000_000_000
WINDOW = 10 * S


def store(max_keys: int = 100) -> KeyStore:
    return KeyStore(WINDOW, max_keys)


def test_new_keys_are_stored_and_repeats_are_duplicates_within_and_across_batches():
    keys, topic = store(), TopicKeys(None)
    assert keys.admit(topic, [b"a", b"b"], 0) == (None, WINDOW)
    stored, _ = keys.admit(topic, [b"b", b"c", b"c", b"", b""], S)
    assert stored == [False, True, False, True, True]
    assert (topic.received, topic.duplicates, topic.held, keys.held) == (5, 2, {b"a", b"b", b"c"}, 3)


def test_a_key_is_remembered_for_the_window_and_not_a_moment_longer():
    keys, topic = store(), TopicKeys(None)
    keys.admit(topic, [b"a"], 0)
    assert keys.admit(topic, [b"a"], WINDOW - 1)[0] == [False]
    assert keys.admit(topic, [b"a"], WINDOW)[0] is None  # stored again
    assert keys.held == 1


def test_keys_of_one_millisecond_share_a_run_whose_expiry_is_the_first():
    keys, topic = store(), TopicKeys(None)
    keys.admit(topic, [b"a"], 0)
    _, expires = keys.admit(topic, [b"b"], RUN_NS - 1)
    assert expires == WINDOW
    keys.expire(WINDOW)
    assert topic.held == set()


def test_keys_are_per_topic():
    keys, one, two = store(), TopicKeys(None), TopicKeys(None)
    keys.admit(one, [b"k"], 0)
    assert keys.admit(two, [b"k"], 0)[0] is None
    assert keys.admit(one, [b"k"], 0)[0] == [False]


def test_past_max_keys_the_oldest_are_evicted_and_counted():
    keys, one, two = store(max_keys=3), TopicKeys(None), TopicKeys(None)
    keys.admit(one, [b"a", b"b"], 0)
    keys.admit(two, [b"c", b"d"], S)
    assert (one.held, two.held, keys.evicted) == ({b"b"}, {b"c", b"d"}, 1)
    keys.admit(one, [b"a"], 2 * S)  # evicted early: stored again, evicting the next oldest
    assert (one.held, keys.evicted, keys.held) == ({b"a"}, 2, 3)


def test_forget_removes_the_entries_so_a_key_stored_again_lives_its_whole_window():
    keys, topic = store(), TopicKeys(None)
    keys.admit(topic, [b"x", b"a", b"y"], 0)
    stored, _ = keys.admit(topic, [b"a", b"b", b"z"], S)
    keys.forget(topic, [b"a", b"b", b"z"], stored)  # the second publish failed: b and z forgotten
    assert topic.held == {b"x", b"a", b"y"} and keys.held == 3
    keys.admit(topic, [b"b"], 5 * S)
    keys.expire(WINDOW + S)  # the first two runs are gone; b, stored again at 5 s, is not
    assert topic.held == {b"b"} and keys.held == 1
    keys.expire(WINDOW + 5 * S)
    assert topic.held == set() and keys.held == 0


def test_expiries_list_every_live_key_by_topic_and_skip_a_cleared_topic():
    keys, one, two = store(), TopicKeys(None), TopicKeys(None)
    keys.admit(one, [b"a"], 0)
    keys.admit(two, [b"b"], 2 * RUN_NS)
    keys.admit(one, [b"c"], 4 * RUN_NS)
    assert keys.expiries() == {one: [(WINDOW, b"a"), (WINDOW + 4 * RUN_NS, b"c")],
                               two: [(WINDOW + 2 * RUN_NS, b"b")]}
    two.held.clear()  # a deleted topic
    assert list(keys.expiries()) == [one]


def test_remember_takes_back_live_keys_in_order_and_drops_expired_ones():
    keys, topic = store(), TopicKeys(None)
    entries = [(S, b"old"), (5 * S, b"a"), (5 * S + 10, b"b"), (9 * S, b"c")]
    assert keys.remember([(expires, topic, key) for expires, key in entries], 2 * S) == 3
    assert topic.held == {b"a", b"b", b"c"}
    keys.expire(5 * S)
    assert topic.held == {b"c"}


def test_zero_window_remembers_nothing():
    keys, topic = KeyStore(0, 10), TopicKeys(None)
    assert keys.admit(topic, [b"a", b"a", b""], 0) == (None, 0)
    assert (keys.held, topic.received) == (0, 2)


def test_journal_records_round_trip_and_short_ones_are_refused():
    assert decode_record(encode_record(123, 45, b"key", b"0123456789abcdef")) == (123, 45, b"0123456789abcdef", b"key")
    assert decode_record(encode_record(0, -1, b"k")) == (0, -1, NO_ID, b"k")
    with pytest.raises(ValueError):
        decode_record(encode_record(1, 2, b""))
