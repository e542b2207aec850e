"""V2 command handlers, one per wire command, and the table that dispatches to them.

The parser (:mod:`broker.protocol`) has already checked state legality,
parameters, names and sizes; handlers apply a command to the domain and queue
the response. Handlers are plain functions but for AUTH and SUB, which are async
(an auth server's answer; in durable mode the metadata naming a new topic or channel).
A publish returns its ``OK`` when it is queued at once, the usual case, costing no
coroutine, or a coroutine to await for it when it must wait: for an auth server, for
the disk in durable mode (the group fsync), or for the pieces of a huge batch. The
connection queues the response, so that it goes out with the rest of the chunk's output
(see :mod:`broker.server.client` and :mod:`broker.server.tcp`).
Errors are raised as :class:`~broker.protocol.ProtocolError`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from broker import protocol as p
from broker.core.host import CopiesRefused
from broker.core.maybe import Maybe
from broker.protocol import ProtocolError
from broker.protocol.keys import DUPLICATE
from broker.protocol.replica import Repl
from broker.server.identify import identify as apply_identify
from diskqueue import DiskQueueError

if TYPE_CHECKING:
    from broker.core.broker import Broker
    from broker.server.client import Client

__all__ = ["SYNC_HANDLERS", "ANSWER_HANDLERS", "Answer", "SyncHandler", "AnswerHandler", "fin_run", "check_auth"]

log = logging.getLogger("pynsqd.tcp")

#: A command applied at once; the command argument is the event type the handler is registered for.
SyncHandler = Callable[["Broker", "Client", Any], None]
#: A command's answer: the response to queue, or what to await for it.
Answer = Maybe[bytes]
#: A command that answers (see :data:`Answer`).
AnswerHandler = Callable[["Broker", "Client", Any], Answer]


def identify(broker: Broker, client: Client, cmd: p.Identify) -> None:
    assert cmd.data is not None, "the connection decodes a large body first"
    client.send_response(apply_identify(client, cmd.data))
    client.mark_upgrade()


def _remote_ip(client: Client) -> str:
    """The client's IP for the auth server; "" on a unix socket, as nsqd sends."""
    host, sep, _ = client.remote_address.rpartition(":")
    return host.strip("[]") if sep else ""


async def _query_authd(client: Client) -> None:
    from broker.server.auth import AuthError  # an auth client exists, so the module is loaded

    authd = client.authd
    assert authd is not None
    try:
        client.auth_state = await authd.query(_remote_ip(client), client.tls, client.auth_secret,
                                              client.tls_common_name)
    except AuthError as exc:
        # the cause goes to the log only: an untrusted client learns nothing about the auth servers
        log.warning("PROTOCOL(V2): [%s] AUTH failed %s", client.remote_address, exc)
        raise ProtocolError("E_AUTH_FAILED", "AUTH failed") from exc


async def auth(broker: Broker, client: Client, cmd: p.Auth) -> bytes:
    if client.authed:
        raise ProtocolError("E_INVALID", "AUTH already set")
    if client.authd is None:
        raise ProtocolError("E_AUTH_DISABLED", "AUTH disabled")
    client.auth_secret = cmd.secret.decode("utf-8", "replace")
    await _query_authd(client)
    state = client.auth_state
    if state is None or not state.authorizations:
        raise ProtocolError("E_UNAUTHORIZED", "AUTH no authorizations found")
    return json.dumps({
        "identity": state.identity,
        "identity_url": state.identity_url,
        "permission_count": len(state.authorizations),
    }, separators=(",", ":")).encode()


async def check_auth(client: Client, verb: str, topic: str, channel: str) -> None:
    """nsqd's ``CheckAuth``: with auth servers configured, the client must have authorizations
    (asked again once their ttl passed) that allow ``verb`` on ``topic`` (and ``channel``).
    Callers skip it when no auth server is configured (``client.authd`` is None)."""
    state = client.auth_state
    if state is None or not state.authorizations:
        raise ProtocolError("E_AUTH_FIRST", f"AUTH required before {verb}")
    if state.expired():
        await _query_authd(client)
        state = client.auth_state
        assert state is not None
    if not state.allows(topic, channel):
        raise ProtocolError("E_UNAUTHORIZED", f"AUTH failed for {verb} on {json.dumps(topic)} {json.dumps(channel)}")


async def sub(broker: Broker, client: Client, cmd: p.Sub) -> bytes:
    if client.authd is not None:
        await check_auth(client, "SUB", cmd.topic, cmd.channel)
    if broker.exiting:
        raise ProtocolError("E_SUB_FAILED", "SUB failed exiting")
    try:
        channel, persisted = broker.subscribe(cmd.topic, cmd.channel, client)
    except DiskQueueError:  # its queue's files cannot be opened
        raise ProtocolError("E_SUB_FAILED", "SUB failed to open the channel's files") from None
    client.channel = channel
    client.state = p.State.SUBSCRIBED
    if persisted is not None:
        await persisted
    return b"OK"


def rdy(broker: Broker, client: Client, cmd: p.Rdy) -> None:
    if client.lease is not None:
        # a leasing connection's RDY adds credit, so a reader can keep it topped up
        client.rdy = min(client.rdy + cmd.count, broker.options.max_rdy_count)
    else:
        client.rdy = cmd.count
    if client.channel is not None:
        client.channel.dispatch()


def fin(broker: Broker, client: Client, cmd: p.Fin) -> None:
    fin_run(broker, client, [cmd.msg_id])


def fin_run(broker: Broker, client: Client, msg_ids: list[bytes]) -> None:
    """Consecutive FINs, applied together: the connection hands each :class:`~broker.protocol.FinRun` here.

    An id not in flight for this client gets the non-fatal ``E_FIN_FAILED``, in order.
    """
    channel = client.channel
    assert channel is not None  # the parser admits FIN only after SUB
    for err in channel.finish_many(client, msg_ids):
        client.send_error(err)


def req(broker: Broker, client: Client, cmd: p.Req) -> None:
    channel = client.channel
    assert channel is not None  # the parser admits REQ only after SUB
    channel.requeue(client, cmd.msg_id, cmd.timeout_ms)


def touch(broker: Broker, client: Client, cmd: p.Touch) -> None:
    channel = client.channel
    assert channel is not None  # the parser admits TOUCH only after SUB
    channel.touch(client, cmd.msg_id)


def cls(broker: Broker, client: Client, cmd: p.Cls) -> None:
    client.rdy = 0
    client.state = p.State.CLOSING
    client.send_response(b"CLOSE_WAIT")


def nop(broker: Broker, client: Client, cmd: p.Nop) -> None:
    pass


def lease(broker: Broker, client: Client, cmd: p.Lease) -> None:
    """LEASE: settle the messages of a lease token, or count what could be leased.

    Answers with a decimal count. Fatal ``E_INVALID`` on a connection that did not
    negotiate a lease in IDENTIFY (see :mod:`broker.protocol.lease`); non-fatal
    ``E_<OP>_FAILED`` for a token only another AUTH identity holds messages under.
    """
    if client.lease is None:
        raise ProtocolError("E_INVALID", "cannot LEASE without a lease in IDENTIFY")
    channel = client.channel
    assert channel is not None  # the parser admits LEASE only after SUB
    if cmd.op == "AVAILABLE":
        # what the topic has not fanned out yet comes to this channel too
        topic = broker.topics.get(channel.topic_name)
        count = channel.depth + (topic.depth if topic is not None else 0)
    elif cmd.op == "FIN":
        count = channel.finish_lease(client.lease_owner, cmd.token)
    elif cmd.op == "REQ":
        count = channel.requeue_lease(client.lease_owner, cmd.token, cmd.timeout_ms)
    else:
        count = channel.touch_lease(client.lease_owner, cmd.token, client.msg_timeout)
    client.send_response(b"%d" % count)


def publish(broker: Broker, client: Client, cmd: p.Publish) -> Answer:
    """PUB, MPUB and DPUB: queue the request's bodies as one batch (the parser has cut off their
    keys and priorities already). The answer: ``OK`` when that is done at once (no auth server
    to ask, nothing to wait for), else what to await for it (see :meth:`Broker.publish`); a
    keyed publish's answer counts the duplicates (:mod:`broker.protocol.keys`).

    Raises fatal ``E_<VERB>_FAILED <VERB> failed <reason>`` when the broker is exiting or the
    disk write fails; non-fatal when too few nodes took a copy (``--replicas``).
    """
    if client.authd is not None:  # checked here, not in check_auth: a PUB should not pay for a coroutine
        return _publish_authorized(broker, client, cmd)
    return _queue(broker, client, cmd)


async def _publish_authorized(broker: Broker, client: Client, cmd: p.Publish) -> bytes:
    await check_auth(client, cmd.verb, cmd.topic, "")
    answer = _queue(broker, client, cmd)
    return answer if isinstance(answer, bytes) else await answer


def _queue(broker: Broker, client: Client, cmd: p.Publish) -> Answer:
    verb = cmd.verb
    if broker.exiting:
        raise ProtocolError(f"E_{verb}_FAILED", f"{verb} failed exiting")
    try:
        duplicates, pending = broker.publish(broker.get_topic(cmd.topic), cmd)
    except ProtocolError:
        raise
    except Exception as exc:  # a failed disk write: the client must hear about it
        raise _publish_failed(verb, exc) from exc
    if pending is not None:
        return _published(pending, client, cmd, duplicates)
    client.published(cmd.topic, len(cmd.bodies) - duplicates)
    return _answer(verb, duplicates)


def _answer(verb: str, duplicates: int) -> bytes:
    return b"OK" if not duplicates else DUPLICATE if verb != "MPUB" else b"%s %d" % (DUPLICATE, duplicates)


async def _published(pending: Awaitable[int | None], client: Client, cmd: p.Publish, duplicates: int) -> bytes:
    """The answer once ``pending`` (the rest of a publish) is done; it may have found more
    duplicates (keys other nodes know)."""
    try:
        duplicates += await pending or 0
    except ProtocolError:
        raise
    except Exception as exc:  # a failed disk write: the client must hear about it
        raise _publish_failed(cmd.verb, exc) from exc
    client.published(cmd.topic, len(cmd.bodies) - duplicates)
    return _answer(cmd.verb, duplicates)


def repl(broker: Broker, client: Client, cmd: Repl) -> Answer:
    """REPL from a peer node (only parsed on such a connection): its replication answers."""
    assert client.replicas is not None and client.replica is not None
    return client.replicas.receive(client.replica, cmd.body)


def _publish_failed(verb: str, exc: Exception) -> ProtocolError:
    # too few copies (--replicas) is the cluster's state, not the connection's: it stays open
    return ProtocolError(f"E_{verb}_FAILED", f"{verb} failed {exc}", fatal=not isinstance(exc, CopiesRefused))


SYNC_HANDLERS: dict[type, SyncHandler] = {
    p.Identify: identify,
    p.Rdy: rdy,
    p.Fin: fin,
    p.Req: req,
    p.Touch: touch,
    p.Cls: cls,
    p.Nop: nop,
    p.Lease: lease,
}

#: Commands that answer: the response, or what to await for it (AUTH and SUB always wait;
#: a publish waits only for an auth server, the disk in durable mode, a huge batch).
ANSWER_HANDLERS: dict[type, AnswerHandler] = {
    p.Auth: auth,
    p.Sub: sub,
    p.Pub: publish,
    p.Mpub: publish,
    p.Dpub: publish,
    Repl: repl,
}
