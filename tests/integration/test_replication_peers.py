"""Who may speak as a node (``--replicas``): the handshake of broker/protocol/replica.py against a
plain client, a wrong secret, a replayed proof, a node id read from ``/stats`` and a rogue node
registered with the same nsqlookupd; every field of every REPL request checked before it is
written; a replication log that cannot be read back whole, said loudly; peer links over TLS,
the peer's certificate verified. Nodes are daemons in this process, found through nsq's own
nsqlookupd."""

from __future__ import annotations

import os
from contextlib import AsyncExitStack
from pathlib import Path

import msgpack
import pytest
import trio

from broker.core.message import Message
from broker.protocol import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE, encode_pub
from broker.protocol.replica import CONNECTOR, encode_repl, new_nonce, proof
from broker.replication.held import HeldCopies
from broker.replication.wire import ADD, CHANNELS, DROP, FIN, HELLO, HOLDS, TAKEN, pack_entries
from tests.conftest import running_daemon
from tests.support.http_client import request
from tests.support.nsq_programs import nsq_bin_missing
from tests.support.replica_nodes import (
    copies_held,
    holder_of,
    linked,
    node_flags,
    node_replication,
    topic_replication,
)
from tests.support.rogue_node import RogueNode
from tests.support.transports import make_certificates
from tests.support.v2client import V2Client, connect, consume, publish
from tests.support.waiting import wait_for, wait_until

pytestmark = pytest.mark.skipif(nsq_bin_missing() is not None, reason=nsq_bin_missing() or "")

SECRET = b"the cluster's secret"
STRANGER = "5" * 32  # a node id nobody runs


def _secret_file(folder: Path, secret: bytes = SECRET) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "replication.secret"
    path.write_bytes(secret + b"\n")
    os.chmod(path, 0o600)
    return f"--replication-secret-file={path}"


def _replicating(lookupd, folder: Path, *extra: str, secret: bytes = SECRET) -> list[str]:
    return node_flags(lookupd, "--replicas=2", _secret_file(folder, secret), *extra)


async def _repl(client: V2Client, *requests: list, seq: int = 1) -> tuple[int, str | None, object]:
    """Send one REPL carrying ``requests``; its answer ``(seq, error, extra)``."""
    await client.send(encode_repl(msgpack.packb([seq, list(requests)], use_bin_type=True)))
    frame = await client.read_frame()
    assert frame.frame_type == FRAME_TYPE_RESPONSE, frame
    return tuple(msgpack.unpackb(frame.data, raw=False))  # type: ignore[return-value]


async def _repl_refused_as_unknown(client: V2Client) -> None:
    await client.send(encode_repl(msgpack.packb([1, [[HELLO]]])))
    await client.expect_error(b"E_INVALID invalid command REPL")


async def _log_depth(data_path: Path) -> int:
    """Records in the node's replication log, read from its files (the node is stopped)."""
    held = await HeldCopies.open(data_path, durable=False, max_record=1 << 20)
    try:
        return held.queue.depth
    finally:
        await held.close()


def _entries(n: int, size: int = 10, start: int = 0) -> tuple[list[bytes], bytes]:
    messages = [Message(b"%016x" % (start + i), b"x" * size, 1_000, 0, 0, None) for i in range(n)]
    return [m.id for m in messages], pack_entries(messages, published=True)


async def test_a_client_that_only_names_a_node_changes_nothing(tmp_path, lookupd):
    async with running_daemon(tmp_path / "a", *_replicating(lookupd, tmp_path)) as a:
        client = await connect(a.addresses.tcp)
        answer = await client.identify(feature_negotiation=True, replica=STRANGER)
        assert "replica" not in answer and "replica_nonce" not in answer
        await _repl_refused_as_unknown(client)


async def test_a_wrong_secret_a_replayed_proof_and_a_stolen_node_id_are_refused(tmp_path, lookupd):
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(running_daemon(tmp_path / "a", *_replicating(lookupd, tmp_path)))
        b = await stack.enter_async_context(running_daemon(tmp_path / "b", *_replicating(lookupd, tmp_path)))
        await wait_until(lambda: linked(a, b))
        stolen = (await node_replication(b))["node_id"]  # /stats shows it to anyone
        assert stolen in {peer["node_id"] for peer in (await node_replication(a))["peers"]}

        # a node id alone, and a proof made with the wrong secret
        for secret in (b"", b"a guess"):
            client = await connect(a.addresses.tcp)
            answer = await _prove_with(client, stolen, secret)
            assert "replica" not in answer
            await _repl_refused_as_unknown(client)

        # a proof that held on one connection, replayed on another with the same nonce
        first = await connect(a.addresses.tcp)
        nonce = new_nonce()
        challenge = await first.identify(feature_negotiation=True, replica=STRANGER, replica_nonce=nonce,
                                         replica_address=_dialled(first))
        good = proof(SECRET, CONNECTOR, nonce, challenge["replica_nonce"], STRANGER, challenge["replica"],
                     _dialled(first))
        assert (await first.identify(feature_negotiation=True, replica=STRANGER, replica_proof=good))["replica"]
        again = await connect(a.addresses.tcp)
        await again.identify(feature_negotiation=True, replica=STRANGER, replica_nonce=nonce,
                             replica_address=_dialled(again))
        answer = await again.identify(feature_negotiation=True, replica=STRANGER, replica_proof=good)
        assert "replica" not in answer
        await _repl_refused_as_unknown(again)
        # a proof with no challenge before it
        bare = await connect(a.addresses.tcp)
        assert "replica" not in await bare.identify(feature_negotiation=True, replica=STRANGER, replica_proof=good)
        await _repl_refused_as_unknown(bare)

        assert (await node_replication(a))["handshakes_refused"] == 4
        # the real node is still a's peer: a publish to a is acknowledged with b's copy
        await publish(a, "t", b"kept")
        await wait_until(lambda: copies_held(b, "t", 1))


def _dialled(client: V2Client) -> str:
    assert client.address is not None
    return "%s:%d" % client.address


async def _prove_with(client: V2Client, node: str, secret: bytes) -> dict:
    """The handshake as ``node`` with ``secret``, whatever the broker's proof said."""
    nonce = new_nonce()
    challenge = await client.identify(feature_negotiation=True, replica=node, replica_nonce=nonce,
                                      replica_address=_dialled(client))
    made = proof(secret, CONNECTOR, nonce, challenge["replica_nonce"], node, challenge["replica"], _dialled(client))
    return await client.identify(feature_negotiation=True, replica=node, replica_proof=made)


FORGED = [
    ("CHANNELS with a number for its list", [CHANNELS, "t", 5]),
    ("CHANNELS with a bad channel name", [CHANNELS, "t", ["c", "bad/name"]]),
    ("FIN with a number for its ids", [FIN, "t", "c", 7]),
    ("FIN of an id of the wrong size", [FIN, "t", "c", [b"short"]]),
    ("DROP of no ids", [DROP, "t", []]),
    ("TAKEN from itself", [TAKEN, STRANGER, "t", [b"0" * 16]]),
    ("TAKEN from a bad node id", [TAKEN, "nobody", "t", [b"0" * 16]]),
    ("an unknown kind", [99, "t"]),
    ("HELLO with a list for its flags", [HELLO, [1]]),
    ("a request that is a string", "ADD"),
]


async def test_every_kind_of_forged_request_is_refused_before_it_is_written(tmp_path, lookupd):
    flags = _replicating(lookupd, tmp_path, "--max-msg-size=1000")
    async with running_daemon(tmp_path / "a", *flags) as a:
        me = (await node_replication(a))["node_id"]
        client = await connect(a.addresses.tcp)
        assert (await client.identify_as_node(STRANGER, SECRET))["replica"] == me
        ids, entries = _entries(2)
        adds = [
            ("ADD to a bad topic name", [ADD, "bad/name", [STRANGER, me], ids, entries]),
            ("ADD to a 300-character topic", [ADD, "t" * 300, [STRANGER, me], ids, entries]),
            ("ADD of a body past --max-msg-size", [ADD, "t", [STRANGER, me], *_entries(1, size=50_000)]),
            ("ADD whose entries are not those of its ids", [ADD, "t", [STRANGER, me], ids[:1], entries]),
            ("ADD with an integer body", [ADD, "t", [STRANGER, me], ids[:1],
                                          msgpack.packb([ids[:1], [7], 1, 0, 0, None, None])]),
            ("ADD for another origin", [ADD, "t", ["6" * 32, me], ids, entries]),
            ("ADD this node does not hold", [ADD, "t", [STRANGER, "6" * 32], ids, entries]),
            ("ADD with entries that are not msgpack", [ADD, "t", [STRANGER, me], ids, b"\xc1"]),
            ("HOLDS naming another origin first", [HOLDS, "t", ids, ["6" * 32, me]]),
            ("HOLDS naming holders without this node", [HOLDS, "t", ids, [STRANGER, "6" * 32]]),
        ]
        for seq, (what, forged) in enumerate([*FORGED, *adds], start=1):
            answered_seq, error, _extra = await _repl(client, forged, seq=seq)
            assert error and error.startswith("bad request: "), what
            assert answered_seq == seq, what
        # one bad request spoils its whole body: the good CHANNELS beside it is not applied either
        _seq, error, _extra = await _repl(client, [CHANNELS, "t", ["c"]], [CHANNELS, "t", 5])
        assert error
        node = await node_replication(a)
        assert node["requests_refused"] == len(FORGED) + len(adds) + 1 and node["copies_held"] == 0
        # the connection still works, and a good ADD is taken; a TAKEN naming this node is news
        # every peer gets (it took over this node's messages), not a fault
        assert (await _repl(client, [ADD, "t", [STRANGER, me], ids, entries]))[1] is None
        assert (await _repl(client, [TAKEN, me, "t", [b"0" * 16]], [FIN, "t", "c", ids[:1]]))[1] is None
        assert (await node_replication(a))["copies_held"] == 2
        # which copies it holds, and their holders named anew: a HOLDS comes alone in its body
        assert (await _repl(client, [HOLDS, "t", [*ids, b"9" * 16]]))[1:] == (None, [True, True, False])
        assert (await _repl(client, [HOLDS, "t", ids[:1], [STRANGER, "6" * 32, me]]))[1:] == (None, [True])
        assert (await _repl(client, [HOLDS, "t", ids], [FIN, "t", "c", ids]))[1].startswith("bad request: ")
        assert (await node_replication(a))["copies_held"] == 2
    # the good ADD, FIN and new holders alone reached the disk
    assert await _log_depth(tmp_path / "a") == 3
    async with running_daemon(tmp_path / "a", *flags) as a:  # and the node starts again
        assert (await node_replication(a))["copies_held"] == 2


async def test_a_record_that_cannot_be_applied_is_skipped_at_start_and_counted(tmp_path, lookupd):
    data = tmp_path / "a"
    data.mkdir()
    held = await HeldCopies.open(data, durable=False, max_record=1 << 20)
    ids, entries = _entries(3)
    # what unchecked requests once wrote: a CHANNELS with a number, an ADD to a bad topic name
    held.queue.put(msgpack.packb(["C", STRANGER, "t", 5]))
    held.queue.put(msgpack.packb(["A", STRANGER, "bad/name", [STRANGER, "6" * 32], ids, entries]))
    held.add(STRANGER, "t", [STRANGER, "6" * 32], ids, entries)
    await held.close()
    async with running_daemon(data, *_replicating(lookupd, tmp_path)) as a:
        node = await node_replication(a)
        assert node["log_records_skipped"] == 2 and node["copies_held"] == 3
        metrics = (await request(a.addresses.http, "GET", "/metrics")).text
        assert "nsq_replication_log_records_skipped 2.0" in metrics


async def test_a_damaged_replication_log_is_said_loudly(tmp_path, lookupd, caplog):
    data = tmp_path / "a"
    data.mkdir()
    held = await HeldCopies.open(data, durable=False, max_record=1 << 20)
    for n in range(300):
        ids, entries = _entries(1, start=n)
        held.add(STRANGER, "t", [STRANGER, "6" * 32], ids, entries)
    await held.close()
    [segment] = (data / "replication").glob("*.000000.dat")
    damaged = bytearray(segment.read_bytes())
    middle = len(damaged) // 2
    damaged[middle:middle + 3] = bytes(b ^ 0xFF for b in damaged[middle:middle + 3])
    segment.write_bytes(bytes(damaged))
    async with running_daemon(data, *_replicating(lookupd, tmp_path)) as a:
        node = await node_replication(a)
        assert node["log_records_lost"] >= 1 and node["copies_held"] == 300 - node["log_records_lost"]
        metrics = (await request(a.addresses.http, "GET", "/metrics")).text
        assert f"nsq_replication_log_records_lost {float(node['log_records_lost'])}" in metrics
    assert any(r.levelname == "ERROR" and "replication log" in r.getMessage() and "damaged" in r.getMessage()
               for r in caplog.records)


async def test_copies_that_cannot_be_read_back_do_not_hold_up_another_topics_takeover(tmp_path, lookupd):
    data = tmp_path / "b"
    data.mkdir()
    held = await HeldCopies.open(data, durable=False, max_record=1 << 20)
    bad_ids, _ = _entries(2)
    held.add(STRANGER, "x", [STRANGER, "6" * 32], bad_ids, b"\xc1 not msgpack")  # never sent so
    good = [Message(b"%016x" % (100 + i), b"y%d" % i, 1_000, 0, 0, None) for i in range(5)]
    held.add(STRANGER, "y", [STRANGER, "6" * 32], [m.id for m in good], pack_entries(good, published=True))
    await held.close()
    node_id = "6" * 32
    (data / "replication.id").write_text(node_id + "\n")
    async with running_daemon(data, *_replicating(lookupd, tmp_path)) as b:
        # the origin never comes back: after --replica-timeout b takes over what it holds
        await wait_until(lambda: _taken(b, "y", 5))
        assert sorted(await consume(b.addresses.tcp, "y", "c", 5)) == [b"y%d" % i for i in range(5)]
        node = await node_replication(b)
        assert node["copies_lost"] == 2 and node["copies_held"] == 0


async def _taken(node, topic: str, count: int) -> bool:
    return (await topic_replication(node, topic)).get("takeovers") == count


async def test_a_rogue_node_without_the_secret_gets_no_copies(tmp_path, lookupd):
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(running_daemon(tmp_path / "a", *_replicating(lookupd, tmp_path / "s")))
        rogue = await stack.enter_async_context(
            running_daemon(tmp_path / "r", *_replicating(lookupd, tmp_path / "r-s", secret=b"guessed")))
        # each finds the other through nsqlookupd, and neither proves itself to the other
        await wait_until(lambda: _refused_both(a, rogue))
        client = await connect(a.addresses.tcp)
        await client.send(encode_pub("t", b"never acknowledged"))
        frame = await client.read_frame()
        assert frame.frame_type == FRAME_TYPE_ERROR and frame.data.startswith(b"E_PUB_FAILED PUB failed only 1 of 2")
        assert (await node_replication(rogue))["copies_held"] == 0
        assert not await linked(a) and not await linked(rogue)


async def _refused_both(*nodes) -> bool:
    for node in nodes:
        if (await node_replication(node))["handshakes_refused"] == 0:
            return False
    return True


async def test_nodes_that_require_tls_replicate_over_tls_and_take_over(tmp_path, lookupd):
    certs = make_certificates(tmp_path / "certs")
    flags = _replicating(lookupd, tmp_path, *certs.broker_flags(f"--tls-root-ca-file={certs.ca_file}",
                                                                 "--tls-required=tcp-https"))
    async with AsyncExitStack() as outer:
        b = await outer.enter_async_context(running_daemon(tmp_path / "b", *flags))
        c = await outer.enter_async_context(running_daemon(tmp_path / "c", *flags))
        async with running_daemon(tmp_path / "a", *flags) as a:
            await wait_until(lambda: linked(a, b, c))
            assert (await node_replication(a))["tls"] is True
            reply = await request(a.addresses.http, "POST", "/mpub?topic=t", b"one\ntwo\nthree")
            assert reply.status == 200, reply.body
            holder = await holder_of([b, c], "t", 3)
        # a is gone: its holder takes its messages over through what it learnt over TLS
        await wait_until(lambda: _taken(holder, "t", 3))


async def test_a_peer_whose_certificate_does_not_verify_gets_no_copies(tmp_path, lookupd, caplog):
    mine, theirs = make_certificates(tmp_path / "mine"), make_certificates(tmp_path / "theirs")
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(running_daemon(tmp_path / "a", *_replicating(
            lookupd, tmp_path, *mine.broker_flags(f"--tls-root-ca-file={mine.ca_file}"))))
        b = await stack.enter_async_context(running_daemon(tmp_path / "b", *_replicating(
            lookupd, tmp_path, *theirs.broker_flags(f"--tls-root-ca-file={theirs.ca_file}"))))
        await wait_for(lambda: _certificate_refused(caplog), timeout=15)
        await wait_until(lambda: _refused_both(a, b))
        reply = await request(a.addresses.http, "POST", "/pub?topic=t", b"never")
        assert reply.status == 503
        assert (await node_replication(b))["copies_held"] == 0


def _certificate_refused(caplog) -> bool:
    return any("CERTIFICATE_VERIFY_FAILED" in r.getMessage() for r in caplog.records)


async def test_a_node_without_a_secret_says_what_that_risks(tmp_path, lookupd, caplog):
    async with running_daemon(tmp_path / "a", *node_flags(lookupd, "--replicas=2")) as a:
        assert (await node_replication(a))["secret"] is False
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("no --replication-secret-file: any client that reaches this node's TCP port can pass for a node"
               in line for line in warnings), warnings


async def test_a_stranger_registered_with_nsqlookupd_cannot_take_a_node_down(tmp_path, lookupd, caplog):
    """Answers no node sends, from an address nsqlookupd lists: JSON nested 5,000 deep, a frame
    said to be 64 MiB. Each ends that link alone (before: the nested answer made every node exit,
    and again at each restart; each listed address could make a node buffer 64 MiB)."""
    async with trio.open_nursery() as nursery:
        rogues = [RogueNode(lookupd.address("TCP"), mode) for mode in ("nested", "huge")]
        for rogue in rogues:
            await nursery.start(rogue.run)
        async with running_daemon(tmp_path / "a", *_replicating(lookupd, tmp_path)) as a:
            await wait_for(lambda: all(rogue.dials >= 2 for rogue in rogues), timeout=15)  # dialled again and again
            node = await node_replication(a)
            assert node["handshakes_refused"] >= 2 and not any(peer["connected"] for peer in node["peers"])
            assert (await request(a.addresses.http, "GET", "/ping")).body == b"OK"
        nursery.cancel_scope.cancel()
    refusals = [r.getMessage() for r in caplog.records if "not linked" in r.getMessage()]
    assert any("not JSON" in line for line in refusals) and any("frame" in line.lower() for line in refusals), refusals


async def test_a_stranger_cannot_relay_one_nodes_handshake_to_another(tmp_path, lookupd):
    """A stranger listed by nsqlookupd passes the bytes of a node that dialled it to another node
    and back. The proofs name the address dialled, which is the stranger's: the other node
    refuses, and no link through the stranger comes up (before: each node took the stranger for
    the other, and the stranger could drop copies, inject messages and forge takeovers)."""
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(running_daemon(tmp_path / "a", *_replicating(lookupd, tmp_path)))
        b = await stack.enter_async_context(running_daemon(tmp_path / "b", *_replicating(lookupd, tmp_path)))
        nursery = await stack.enter_async_context(trio.open_nursery())
        rogue = RogueNode(lookupd.address("TCP"), "relay", target=b.addresses.tcp)
        await nursery.start(rogue.run)
        await wait_until(lambda: linked(a, b))
        await wait_for(lambda: rogue.dials >= 4, timeout=15)
        await wait_until(lambda: _refused_both(b))
        rogue_address = f"127.0.0.1:{rogue.port}"
        for node in (a, b):
            peers = {peer["address"]: peer for peer in (await node_replication(node))["peers"]}
            assert rogue_address in peers and not peers[rogue_address]["connected"], peers
        await publish(a, "t", b"kept")  # the real link still carries copies
        await wait_until(lambda: copies_held(b, "t", 1))
        nursery.cancel_scope.cancel()
