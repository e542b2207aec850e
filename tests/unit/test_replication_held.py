"""The copies a node holds for others (broker/replication/held.py): what a restart replays,
when a copy is dropped, bodies read back for a takeover, and compaction with its crash points."""

from __future__ import annotations

import shutil
import time

import pytest
import trio

from broker.core.message import Message
from broker.replication import held as held_module
from broker.replication.held import HeldCopies
from broker.replication.wire import pack, pack_entries

ORIGIN, OTHER = "a" * 32, "b" * 32


def _add(held: HeldCopies, topic: str, n: int, start: int = 0) -> None:
    """Copies of ``n`` messages (ids and bodies numbered from ``start``), as an ADD brings them."""
    messages = [Message(b"%016d" % i, b"body %d" % i, 1_000 + i, 0, 0, None) for i in range(start, start + n)]
    held.add(ORIGIN, topic, [ORIGIN, OTHER], [m.id for m in messages], pack_entries(messages))


async def _open(path, durable=False) -> HeldCopies:
    return await HeldCopies.open(path, durable=durable, max_record=1 << 20)


async def _entries(held: HeldCopies, topic: str, ids: set[bytes]) -> dict[bytes, bytes]:
    """The bodies of the copies ``ids`` of ORIGIN in ``topic``, as a takeover reads them back."""
    return {item[0]: item[1] async for _origin, _topic, item in held.entries({(ORIGIN, topic): ids})}


async def test_a_restart_replays_adds_fins_drops_and_takeovers(tmp_path):
    held = await _open(tmp_path)
    held.set_channels(ORIGIN, "t", ["c1", "c2"])
    _add(held, "t", 5)
    held.finish(ORIGIN, "t", "c1", [b"%016d" % 0, b"%016d" % 1])
    held.finish(ORIGIN, "t", "c2", [b"%016d" % 0])  # both channels: dropped
    held.drop(ORIGIN, "t", [b"%016d" % 2])
    held.mark_taken(ORIGIN, "t", [b"%016d" % 3])
    await held.close()

    again = await _open(tmp_path)
    copies = again.origins[ORIGIN]["t"]
    assert sorted(copies.holders) == [b"%016d" % 1, b"%016d" % 4]
    assert copies.done == {b"%016d" % 1: {"c1"}}
    assert copies.holders[b"%016d" % 4] == (ORIGIN, OTHER)
    assert again.taken == {ORIGIN: {"t": {b"%016d" % 3}}}
    assert again.held_for_topic("t") == 2 and again.live() == 2
    await again.close()


async def test_a_copy_every_channel_finished_goes_also_when_a_channel_is_deleted(tmp_path):
    held = await _open(tmp_path)
    held.set_channels(ORIGIN, "t", ["c1", "c2"])
    _add(held, "t", 2)
    held.finish(ORIGIN, "t", "c1", [b"%016d" % 0])
    assert held.held_for_topic("t") == 2
    held.set_channels(ORIGIN, "t", ["c1"])  # c2 deleted: the copy c1 finished is done
    assert sorted(held.origins[ORIGIN]["t"].holders) == [b"%016d" % 1]
    await held.close()


async def test_fins_from_another_node_do_not_touch_the_origins_copies(tmp_path):
    held = await _open(tmp_path)
    held.set_channels(ORIGIN, "t", ["c"])
    _add(held, "t", 1)
    held.finish(OTHER, "t", "c", [b"%016d" % 0])
    assert held.held_for_topic("t") == 1
    await held.close()


async def test_bodies_are_read_back_from_the_log(tmp_path):
    held = await _open(tmp_path)
    _add(held, "t", 3)
    _add(held, "u", 3)
    found = await _entries(held, "t", {b"%016d" % 1, b"%016d" % 2})
    assert found == {b"%016d" % 1: b"body 1", b"%016d" % 2: b"body 2"}
    await held.close()


async def test_copies_relisted_keep_their_new_holders_through_a_restart_and_a_compaction(tmp_path):
    third = "c" * 32
    held = await _open(tmp_path)
    _add(held, "t", 3)
    ids = [b"%016d" % i for i in range(3)]
    depth = held.queue.depth
    # the origin asks which of these it holds, changing nothing
    assert held.relist(ORIGIN, "t", [ids[0], b"x" * 16], None) == [True, False] and held.queue.depth == depth
    assert held.relist(ORIGIN, "u", [ids[0]], None) == [False]
    # ... and names their holders after making copies again elsewhere: only what is held changes
    assert held.relist(ORIGIN, "t", [ids[0], ids[1], b"x" * 16], (ORIGIN, OTHER, third)) == [True, True, False]
    assert held.relist(ORIGIN, "t", [ids[0]], (ORIGIN, OTHER, third)) == [True]  # the same again: nothing written
    assert held.queue.depth == depth + 1
    assert held.held_for(ORIGIN) == {"t": 3} and held.held_for(OTHER) == {}
    await held.close()

    again = await _open(tmp_path)
    copies = again.origins[ORIGIN]["t"]
    assert copies.holders == {ids[0]: (ORIGIN, OTHER, third), ids[1]: (ORIGIN, OTHER, third), ids[2]: (ORIGIN, OTHER)}
    await again.compact()
    await again.close()
    compacted = await _open(tmp_path)
    assert compacted.origins[ORIGIN]["t"].holders == copies.holders
    assert await _entries(compacted, "t", set(ids)) == {ids[0]: b"body 0", ids[1]: b"body 1", ids[2]: b"body 2"}
    await compacted.close()


async def test_compaction_keeps_what_is_live_and_shrinks_the_log(tmp_path, monkeypatch):
    monkeypatch.setattr(held_module, "COMPACT_MIN", 50)
    held = await _open(tmp_path, durable=True)
    held.set_channels(ORIGIN, "t", ["c"])
    for i in range(200):
        _add(held, "t", 1, i)
        if i % 10 != 9:  # one in ten stays
            held.finish(ORIGIN, "t", "c", [b"%016d" % i])
    held.mark_taken(OTHER, "t", [b"x" * 16])
    held.finish(ORIGIN, "t", "other", [b"%016d" % 9])  # a channel the origin no longer lists
    assert held.queue.depth == 1 + 200 + 180 + 2 and held.needs_compaction()
    await held.compact()
    assert held.queue.depth == 1 + 1 + 20 and not held.needs_compaction()
    await held.close()

    again = await _open(tmp_path)
    copies = again.origins[ORIGIN]["t"]
    assert sorted(copies.holders) == [b"%016d" % i for i in range(9, 200, 10)]
    assert copies.done == {b"%016d" % 9: {"other"}}
    assert again.taken == {OTHER: {"t": {b"x" * 16}}}
    bodies = await _entries(again, "t", set(copies.holders))
    assert bodies[b"%016d" % 199] == b"body 199" and len(bodies) == 20
    await again.close()


@pytest.mark.parametrize("step", ["new written, old still there", "old removed, new not renamed"])
async def test_a_compaction_interrupted_at_either_step_loses_nothing(tmp_path, step):
    held = await _open(tmp_path)
    held.set_channels(ORIGIN, "t", ["c"])
    _add(held, "t", 4)
    held.finish(ORIGIN, "t", "c", [b"%016d" % 0])
    await held.close()
    # a copy of the finished compaction's result, put where the interrupted one left it
    work = tmp_path / "work"
    shutil.copytree(tmp_path / "replication", work / "replication")
    compacted = await _open(work)
    await compacted.compact()
    await compacted.close()
    shutil.copytree(work / "replication", tmp_path / "replication.new")
    if step == "old removed, new not renamed":
        shutil.rmtree(tmp_path / "replication")

    again = await _open(tmp_path)
    assert sorted(again.origins[ORIGIN]["t"].holders) == [b"%016d" % i for i in (1, 2, 3)]
    assert not (tmp_path / "replication.new").exists()
    await again.close()


async def test_durable_changes_are_synced_on_request(tmp_path):
    held = await _open(tmp_path, durable=True)
    _add(held, "t", 1)
    assert held.commit.syncs == 0
    await held.synced()
    assert held.commit.syncs == 1
    await held.close()


def test_entries_travel_by_columns_and_come_back_one_per_message():
    from broker.replication.wire import message_of, unpack_entries

    published = [Message(b"%016d" % i, b"b%d" % i, 5, 0, 9, None if i else 7) for i in range(3)]
    items = unpack_entries(pack_entries(published, published=True))
    assert items == [[b"%016d" % i, b"b%d" % i, 5, 0, 9, None if i else 7, None] for i in range(3)]
    taken = [Message(b"a" * 16, b"x", 1, 3, 0, None), Message(b"b" * 16, b"y", 2, 0, 4, None)]
    items = unpack_entries(pack_entries(taken, [["c1"], None]))
    assert items == [[b"a" * 16, b"x", 1, 3, 0, None, ["c1"]], [b"b" * 16, b"y", 2, 0, 4, None, None]]
    again = message_of(items[0], b"n" * 16)
    assert (again.id, again.body, again.timestamp, again.attempts) == (b"n" * 16, b"x", 1, 3)


async def test_one_pass_reads_back_the_copies_of_several_topics_and_origins(tmp_path):
    held = await _open(tmp_path)
    _add(held, "t", 3)
    _add(held, "u", 3, start=10)
    held.add(OTHER, "t", [OTHER, ORIGIN], [b"%016d" % 20], pack_entries([Message(b"%016d" % 20, b"o", 1)]))
    got = [(origin, topic, item[1]) async for origin, topic, item in held.entries({
        (ORIGIN, "t"): {b"%016d" % 2}, (ORIGIN, "u"): {b"%016d" % 10, b"%016d" % 12}, (OTHER, "t"): {b"%016d" % 20}})]
    assert sorted(got) == [(ORIGIN, "t", b"body 2"), (ORIGIN, "u", b"body 10"), (ORIGIN, "u", b"body 12"),
                           (OTHER, "t", b"o")]
    await held.close()


async def test_what_is_written_while_a_compaction_runs_is_in_the_new_log(tmp_path, monkeypatch):
    monkeypatch.setattr(held_module, "COMPACT_MIN", 10)
    monkeypatch.setattr(held_module, "SCAN_BATCH", 5)
    held = await _open(tmp_path)
    held.set_channels(ORIGIN, "t", ["c"])
    for i in range(60):
        _add(held, "t", 1, i)
        held.finish(ORIGIN, "t", "c", [b"%016d" % i])
    _add(held, "t", 1, 100)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(held.compact)
        await trio.sleep(0)  # the compaction has begun and yields between batches
        _add(held, "t", 1, 200)
        held.finish(ORIGIN, "t", "c", [b"%016d" % 100])
    await held.close()
    again = await _open(tmp_path)
    assert sorted(again.origins[ORIGIN]["t"].holders) == [b"%016d" % 200]
    assert (await _entries(again, "t", {b"%016d" % 200})) == {b"%016d" % 200: b"body 200"}
    await again.close()


async def test_channel_lists_and_takeovers_beyond_the_copies_do_not_make_compaction_run_again(tmp_path, monkeypatch):
    monkeypatch.setattr(held_module, "COMPACT_MIN", 50)
    held = await _open(tmp_path)
    for n in range(300):  # topics whose copies are all gone: their channel lists are not kept
        held.set_channels(ORIGIN, f"t{n}", ["c"])
    for n in range(60):  # takeovers are kept
        held.mark_taken(OTHER, f"t{n}", [b"x" * 16])
    assert held.needs_compaction()
    await held.compact()
    assert held.queue.depth == 60 and not held.needs_compaction()
    await held.close()


async def test_a_node_drops_for_a_taker_only_the_copies_the_taker_held_too(tmp_path):
    held = await _open(tmp_path)
    _add(held, "t", 2)  # holders: ORIGIN, OTHER
    held.add(ORIGIN, "t", [ORIGIN, "c" * 32], [b"%016d" % 9], pack_entries([Message(b"%016d" % 9, b"z", 1)]))
    held.drop(ORIGIN, "t", [b"%016d" % 0, b"%016d" % 9], by=OTHER)
    assert sorted(held.origins[ORIGIN]["t"].holders) == [b"%016d" % 1, b"%016d" % 9]
    await held.close()


async def test_a_takeover_is_forgotten_once_its_origin_learnt_of_it_or_after_a_day(tmp_path, monkeypatch):
    held = await _open(tmp_path)
    held.mark_taken(ORIGIN, "t", [b"%016d" % i for i in range(3)])
    held.mark_taken(OTHER, "t", [b"x" * 16])
    held.forget_taken(ORIGIN, "t", [b"%016d" % 0, b"%016d" % 1])
    assert held.taken == {ORIGIN: {"t": {b"%016d" % 2}}, OTHER: {"t": {b"x" * 16}}}
    await held.close()
    again = await _open(tmp_path)
    assert again.taken == {ORIGIN: {"t": {b"%016d" % 2}}, OTHER: {"t": {b"x" * 16}}}
    monkeypatch.setattr(held_module, "TAKEN_RETENTION", -1.0)  # a day has passed
    await again.compact()
    assert again.taken == {}
    await again.close()


async def test_a_takeover_of_millions_is_compacted_in_records_the_log_takes(tmp_path, monkeypatch):
    monkeypatch.setattr(held_module, "TAKEN_PIECE", 1000)
    held = await HeldCopies.open(tmp_path, durable=False, max_record=40_000)  # about 2,000 ids a record
    ids = [b"%016d" % i for i in range(5_000)]
    for start in range(0, len(ids), 1_000):
        held.mark_taken(ORIGIN, "t", ids[start:start + 1_000])
    await held.compact()
    await held.close()
    again = await _open(tmp_path)
    assert again.taken == {ORIGIN: {"t": set(ids)}}
    await again.close()


def _id(n: int) -> bytes:
    return b"%016d" % n


async def test_channel_states_are_replayed_at_a_start_and_go_with_the_channels_fin_or_the_copy(tmp_path):
    held = await _open(tmp_path)
    held.set_channels(ORIGIN, "t", ["c1", "c2"])
    _add(held, "t", 4)
    held.update(ORIGIN, "t", "c1", [_id(0), _id(1), _id(2)], [2, 1, 3], [0, 5_000, 0])
    held.update(ORIGIN, "t", "c2", [_id(0), _id(3)], [1, 1], [0, 0])
    held.update(ORIGIN, "t", "c1", [_id(0)], [3], [7_000])  # the latest state wins
    held.finish(ORIGIN, "t", "c1", [_id(1)])  # c1 finished it: nothing of it left in c1
    held.finish(ORIGIN, "t", "c1", [_id(3)])
    held.finish(ORIGIN, "t", "c2", [_id(3)])  # both channels: the copy and its states go
    held.drop(ORIGIN, "t", [_id(2)])
    await held.close()

    again = await _open(tmp_path)
    copies = again.origins[ORIGIN]["t"]
    assert copies.state == {"c1": {_id(0): (3, 7_000)}, "c2": {_id(0): (1, 0)}}
    assert copies.states_of(_id(0)) == {"c1": (3, 7_000), "c2": (1, 0)} and copies.states_of(_id(1)) == {}
    await again.close()


async def test_an_update_of_copies_not_held_or_finished_in_that_channel_writes_nothing(tmp_path):
    held = await _open(tmp_path)
    held.set_channels(ORIGIN, "t", ["c1", "c2"])
    _add(held, "t", 2)
    held.finish(ORIGIN, "t", "c1", [_id(0)])
    depth = held.queue.depth
    held.update(ORIGIN, "t", "c1", [_id(0), _id(9)], [1, 1], [0, 0])  # finished there; never held
    held.update(ORIGIN, "u", "c1", [_id(1)], [1], [0])  # a topic with no copies
    held.update(OTHER, "t", "c1", [_id(1)], [1], [0])  # another node's word on the origin's copies
    assert held.queue.depth == depth and held.origins[ORIGIN]["t"].state == {}
    held.update(ORIGIN, "t", "c1", [_id(0), _id(1)], [4, 2], [0, 9])  # the copy c1 has not finished is kept
    assert held.queue.depth == depth + 1 and held.origins[ORIGIN]["t"].state == {"c1": {_id(1): (2, 9)}}
    await held.close()


async def test_an_update_of_many_ids_is_written_in_records_the_log_takes(tmp_path, monkeypatch):
    monkeypatch.setattr(held_module, "STATE_PIECE", 100)
    held = await _open(tmp_path)
    _add(held, "t", 250)
    held.update(ORIGIN, "t", "c", [_id(n) for n in range(250)], [n % 7 for n in range(250)], [0] * 250)
    assert held.queue.depth == 1 + 3
    await held.close()
    again = await _open(tmp_path)
    assert again.origins[ORIGIN]["t"].state == {"c": {_id(n): (n % 7, 0) for n in range(250)}}
    await again.close()


async def test_compaction_keeps_the_states_of_the_copies_held_and_no_others(tmp_path, monkeypatch):
    monkeypatch.setattr(held_module, "COMPACT_MIN", 50)
    monkeypatch.setattr(held_module, "STATE_PIECE", 3)
    held = await _open(tmp_path)
    held.set_channels(ORIGIN, "t", ["c"])
    for i in range(100):
        _add(held, "t", 1, i)
        held.update(ORIGIN, "t", "c", [_id(i)], [1], [0])
        held.update(ORIGIN, "t", "c", [_id(i)], [2], [i])
        if i % 20:  # one in twenty stays, with its state
            held.finish(ORIGIN, "t", "c", [_id(i)])
    assert held.needs_compaction()
    await held.compact()
    # the channel list, 5 copies, their 5 states in records of 3
    assert held.queue.depth == 1 + 5 + 2 and not held.needs_compaction()
    await held.close()
    again = await _open(tmp_path)
    assert again.origins[ORIGIN]["t"].state == {"c": {_id(i): (2, i) for i in range(0, 100, 20)}}
    await again.close()


async def test_a_state_record_that_is_not_what_this_node_writes_is_skipped(tmp_path):
    held = await _open(tmp_path)
    _add(held, "t", 1)
    for record in (["S", ORIGIN, "t", "c", [_id(0)], 70_000, 0], ["S", ORIGIN, "t", "bad/name", [_id(0)], 1, 0],
                   ["S", ORIGIN, "t", "c", [_id(0)], 1, -5], ["S", ORIGIN, "t", "c", [_id(0)], 1]):
        held.queue.put(pack(record))
    held.queue.put(pack(["S", ORIGIN, "t", "c", [_id(0)], 2, 0]))
    await held.close()
    again = await _open(tmp_path)
    assert again.records_skipped == 4 and again.origins[ORIGIN]["t"].state == {"c": {_id(0): (2, 0)}}
    await again.close()


def _add_keyed(held: HeldCopies, topic: str, keys: list[bytes], start: int = 0, expires: int | list[int] = 0,
               origin: str = ORIGIN) -> list[bytes]:
    """Keyed copies (``b""``: a message without a key), their window ending at ``expires``
    (default: in an hour); returns their ids."""
    messages = [Message(b"%016d" % i, b"body %d" % i, 1_000 + i, 0, 0, None) for i in range(start, start + len(keys))]
    ids = [m.id for m in messages]
    held.add(origin, topic, [origin, OTHER], ids, pack_entries(messages), None, keys,
             expires or time.time_ns() + 3600 * 10**9)
    return ids


async def test_keys_outlive_their_copies_until_their_window_ends_and_a_failed_publish_takes_them_back(tmp_path):
    held = await _open(tmp_path)
    held.set_channels(ORIGIN, "t", ["c"])
    finished, failed, taken, by_other, unkeyed = _add_keyed(held, "t", [b"fin", b"fail", b"took", b"other", b""])
    held.finish(ORIGIN, "t", "c", [finished])  # delivered: the key stays known
    held.drop(ORIGIN, "t", [failed])  # its publish was refused: the retry must be stored
    held.mark_taken(ORIGIN, "t", [taken])  # this node took it over: delivered here
    held.drop(ORIGIN, "t", [by_other], by=OTHER)  # OTHER took it over: delivered there
    assert held.key_of(ORIGIN, "t", unkeyed) is None and held.key_of(ORIGIN, "t", taken) is None
    asked = [b"fin", b"fail", b"took", b"other", b"never"]
    assert held.known("t", asked, time.time_ns()) == [b"fin", b"took", b"other"]
    assert held.known("u", asked, time.time_ns()) == [] and held.keys_held == 3
    await held.close()

    again = await _open(tmp_path)
    assert again.known("t", asked, time.time_ns()) == [b"fin", b"took", b"other"]
    later = time.time_ns() + 3601 * 10**9
    assert again.known("t", asked, later) == []  # the window ended
    await again.close()


async def test_a_copys_key_and_expiry_go_with_it_to_a_takeover(tmp_path):
    held = await _open(tmp_path)
    soon = time.time_ns() + 10**9
    ids = _add_keyed(held, "t", [b"a", b"", b"c"], expires=[soon, 0, soon + 1])
    assert [held.key_of(ORIGIN, "t", msg_id) for msg_id in ids] == [(b"a", soon), None, (b"c", soon + 1)]
    await held.close()


async def test_keys_are_bounded_by_max_keys_and_their_expiry(tmp_path):
    held = await HeldCopies.open(tmp_path, durable=False, max_record=1 << 20, max_keys=3)
    now = time.time_ns()
    _add_keyed(held, "t", [b"gone"], expires=now - 1)
    _add_keyed(held, "t", [b"k%d" % i for i in range(5)], start=1)
    assert held.known("t", [b"gone", *(b"k%d" % i for i in range(5))], now) == [b"k2", b"k3", b"k4"]
    assert held.keys_evicted == 2 and held.keys_held == 3
    await held.close()


async def test_compaction_keeps_the_keys_still_in_their_window(tmp_path, monkeypatch):
    monkeypatch.setattr(held_module, "COMPACT_MIN", 50)
    held = await _open(tmp_path)
    held.set_channels(ORIGIN, "t", ["c"])
    now = time.time_ns()
    for i in range(200):
        [msg_id] = _add_keyed(held, "t", [b"key %d" % i], start=i, expires=now + (3600 if i % 2 else 1) * 10**9)
        if i:  # all but the first finished
            held.finish(ORIGIN, "t", "c", [msg_id])
    monkeypatch.setattr(time, "time_ns", lambda: now + 2 * 10**9)  # the even keys' window ended
    assert held.needs_compaction()
    await held.compact()
    assert held.queue.depth == 1 + 1 + 1  # the channels, the live copy, one K record of 100 keys
    await held.close()

    again = await _open(tmp_path)
    asked = [b"key %d" % i for i in range(200)]
    assert again.known("t", asked, time.time_ns()) == asked[1::2]
    assert again.key_of(ORIGIN, "t", b"%016d" % 0) is None  # its key's window ended; the copy is still held
    assert again.held_for_topic("t") == 1
    await again.close()


async def test_the_copies_of_a_retry_dropped_as_duplicates_do_not_take_the_key_away(tmp_path):
    held = await _open(tmp_path)
    _add_keyed(held, "t", [b"k"], origin=ORIGIN)
    retried = _add_keyed(held, "t", [b"k"], start=1, origin=OTHER)  # a retry on another node, then dropped there
    held.drop(OTHER, "t", retried)
    assert held.known("t", [b"k"], time.time_ns()) == [b"k"]
    await held.close()
    again = await _open(tmp_path)
    assert again.known("t", [b"k"], time.time_ns()) == [b"k"]
    await again.close()
