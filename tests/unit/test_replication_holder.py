"""The holding side (broker/replication/holder.py) answering a peer's REPL bodies: the keys a
KEYS finds are those known where it stands among the body's requests."""

from __future__ import annotations

import time

import msgpack

from broker.config.options import parse_args
from broker.core.message import Message
from broker.replication.held import HeldCopies
from broker.replication.holder import Holder
from broker.replication.peers import Peers
from broker.replication.wire import Add, Drop, Forget, Hello, Keys, Taken, encode_request, pack, pack_entries

ME, PEER = "a" * 32, "b" * 32


async def _nothing(_node: str) -> None:
    pass


async def _holder(tmp_path) -> Holder:
    held = await HeldCopies.open(tmp_path, durable=False, max_record=1 << 20)
    holder = Holder(parse_args(["--replicas=2"]), Peers(), b"", _nothing, lambda node: None,
                    lambda topic, keys: held.known(topic, keys, time.time_ns()))
    holder.node_id, holder.held = ME, held
    return holder


def _add(keys: list[bytes], start: int = 0) -> Add:
    messages = [Message(b"%016d" % i, b"m", 1, 0, 0, None) for i in range(start, start + len(keys))]
    return Add("t", (PEER, ME), [m.id for m in messages], pack_entries(messages, published=True), None, keys,
               time.time_ns() + 10**12)


def _answer(holder: Holder, seq: int, *requests) -> list:
    answer = holder.receive(PEER, pack([seq, [encode_request(request) for request in requests]]))
    assert isinstance(answer, bytes)
    return msgpack.unpackb(answer, raw=False)


async def test_a_keys_request_finds_the_keys_known_where_it_stands_in_its_body(tmp_path):
    holder = await _holder(tmp_path)
    ask = Keys("t", [b"k1", b"k2", b"k3"])
    assert _answer(holder, 1, ask, _add([b"k1", b"k2"])) == [1, None, None]  # its own publish's ADD comes after
    assert _answer(holder, 2, ask) == [2, None, {"t": [b"k1", b"k2"]}]
    # a publish that failed takes its keys back, before a retry asks again in the same body
    assert _answer(holder, 3, Drop("t", [b"%016d" % 0]), ask, Keys("u", [b"k2"])) == [3, None, {"t": [b"k2"]}]
    assert holder.held is not None
    await holder.held.close()


async def test_a_takeover_a_peer_tells_is_said_to_the_origin_in_this_nodes_hello_answers(tmp_path):
    taker, origin = "c" * 32, "d" * 32
    holder = await _holder(tmp_path)
    ids = [b"%016d" % i for i in range(3)]
    answer = holder.receive(taker, pack([1, [encode_request(Taken(origin, "t", ids))]]))
    assert isinstance(answer, bytes) and msgpack.unpackb(answer, raw=False)[:2] == [1, None]
    holder.receive(taker, pack([2, [encode_request(Taken(ME, "t", ids))]]))  # of this node: its own HELLOs say it
    hello = holder.receive(origin, pack([3, [encode_request(Hello())]]))
    assert isinstance(hello, bytes)
    _seq, _error, [mine, everything, _holding] = msgpack.unpackb(hello, raw=False)
    assert sorted(mine["t"]) == ids  # the origin skips them, the taker out of its reach or not
    assert ME not in everything
    # the origin learnt of them: this node forgets them
    holder.receive(origin, pack([4, [encode_request(Forget("t", ids))]]))
    _seq, _error, [mine, _everything, _holding] = msgpack.unpackb(
        holder.receive(origin, pack([5, [encode_request(Hello())]])), raw=False)
    assert mine == {}
    assert holder.held is not None
    await holder.held.close()


async def test_with_durable_a_takeover_a_peer_tells_is_answered_once_its_record_is_synced(tmp_path):
    held = await HeldCopies.open(tmp_path, durable=True, max_record=1 << 20)
    holder = Holder(parse_args(["--replicas=2", "--durable"]), Peers(), b"", _nothing, lambda node: None,
                    lambda topic, keys: [])
    holder.node_id, holder.held = ME, held
    answer = holder.receive("c" * 32, pack([1, [encode_request(Taken("d" * 32, "t", [b"%016d" % 0]))]]))
    assert not isinstance(answer, bytes)  # it waits for the sync: the taker counts it towards its majority
    assert msgpack.unpackb(await answer, raw=False)[:2] == [1, None]
    await held.close()
    reopened = await HeldCopies.open(tmp_path, durable=True, max_record=1 << 20)
    assert reopened.taken == {"d" * 32: {"t": {b"%016d" % 0}}}  # on disk
    await reopened.close()
