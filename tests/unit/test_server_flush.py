"""The flusher: output that other tasks queue for many connections goes out from one task,
one write per connection, without waking the connections' writer tasks."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest
import trio

from broker.config.options import Options
from broker.core.message import Message
from broker.protocol import FRAME_TYPE_MESSAGE, FrameDecoder, State, decode_message
from broker.server.client import Client
from broker.server.flush import DEFER_ROUNDS, Flusher
from tests.support.socketpairs import read_ready, socket_pairs

CONNECTIONS = 64


class _CountingSocket:
    """The writer task's socket, counting the sends it makes (the flusher writes to the fd)."""

    def __init__(self, sock):
        self.sock = sock
        self.sends = 0

    async def send(self, data):
        self.sends += 1
        return await self.sock.send(data)


@pytest.fixture
def pairs():
    with socket_pairs(CONNECTIONS) as made:
        yield made


def _client(server_side: socket.socket, number: int, flusher: Flusher) -> tuple[Client, _CountingSocket]:
    broker = SimpleNamespace(options=Options())
    client = Client(broker, trio.SocketStream(trio.socket.from_stdlib_socket(server_side)), f"peer:{number}", number)
    counting = _CountingSocket(client._socket)
    client._socket = counting
    client.state = State.SUBSCRIBED
    client.rdy = 1000
    client.flusher = flusher
    return client, counting


async def test_a_batch_for_many_connections_goes_out_in_one_write_each_and_wakes_no_writer(pairs):
    flusher = Flusher()
    clients = [_client(a, i, flusher) for i, (a, _) in enumerate(pairs)]
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(flusher.run)
            for client, _ in clients:
                nursery.start_soon(client.run_writer)
            await trio.testing.wait_all_tasks_blocked()
            # what a pump's dispatch does: frames for every connection, then a wake-up each
            sent = {}
            for round_ in range(3):
                for i, (client, _) in enumerate(clients):
                    msgs = [Message(b"%016d" % (i * 10 + round_), b"body %d.%d" % (i, round_), 1_000 + i, attempts=1)]
                    client.send_messages(msgs)
                    client.wake_writer()
                    sent.setdefault(i, []).extend(msgs)
            await trio.testing.wait_all_tasks_blocked()
            for i, (_, peer) in enumerate(pairs):
                frames = FrameDecoder().feed(read_ready(peer))
                assert [f.frame_type for f in frames] == [FRAME_TYPE_MESSAGE] * 3
                got = [decode_message(f.data) for f in frames]
                assert [(m.timestamp, m.attempts, m.id, m.body) for m in got] == [
                    (1_000 + i, 1, m.id, m.body) for m in sent[i]]
            assert [counting.sends for _, counting in clients] == [0] * CONNECTIONS
            assert all(not client.output.size for client, _ in clients)
            nursery.cancel_scope.cancel()


class _Fake:
    def __init__(self, name: str, big: bool, log: list):
        self.name = name
        self.big = big
        self.log = log

    def flush_marked(self, small: bool) -> bool:
        if not small and not self.big:
            return False
        self.log.append(self.name)
        return True


async def test_little_output_waits_for_other_runnable_tasks_a_few_turns_at_most():
    flusher = Flusher()
    log: list[str] = []
    busy_turns = []

    async def busy() -> None:  # another task with work for many turns of the scheduler
        for turn in range(4 * DEFER_ROUNDS):
            busy_turns.append((turn, list(log)))
            await trio.lowlevel.checkpoint()

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(flusher.run)
            await trio.testing.wait_all_tasks_blocked()
            flusher.mark(_Fake("small", False, log))
            flusher.mark(_Fake("big", True, log))
            nursery.start_soon(busy)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    assert log == ["big", "small"]  # the big one at once, the small one a turn later at least
    # and, however the scheduler orders the two tasks, within a bounded number of turns
    assert min(turn for turn, flushed in busy_turns if "small" in flushed) <= DEFER_ROUNDS + 1

async def test_with_nothing_else_to_run_everything_marked_goes_at_once():
    flusher = Flusher()
    log: list[str] = []
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(flusher.run)
            await trio.testing.wait_all_tasks_blocked()
            for name in "abc":
                flusher.mark(_Fake(name, False, log))
            await trio.testing.wait_all_tasks_blocked()
            assert log == ["a", "b", "c"]
            nursery.cancel_scope.cancel()


class _Channel:
    def __init__(self):
        self.dispatched = 0

    def dispatch(self, client) -> None:
        self.dispatched += 1


async def test_a_stall_that_another_task_drains_still_asks_the_channel_for_more():
    # A delivery outgrows the output buffer and the socket refuses the rest (the client
    # stalls, its writer woken). Before the writer runs, the flusher's non-blocking write
    # hands over the rest. The writer then has nothing to send, yet must ask the channel for
    # more: nothing else will, and the client would wait forever with its RDY unused.
    with socket_pairs(1) as [(server_side, peer)]:
        client, counting = _client(server_side, 0, Flusher())
        channel = client.channel = _Channel()
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(client.run_writer)
                await trio.testing.wait_all_tasks_blocked()
                body = b"x" * 65536
                received = b""
                n = 0
                while not client._stalled:  # the socket's buffers fill
                    client.send_messages([Message(b"%016d" % n, body, 1, attempts=1)])
                    n += 1
                while client.output.size:  # the peer reads; the rest goes by non-blocking writes
                    received += read_ready(peer)
                    client._flush_now()
                received += read_ready(peer)
                await trio.testing.wait_all_tasks_blocked()
                assert counting.sends == 0  # the writer task sent nothing itself
                assert channel.dispatched == 1 and not client._stalled
                assert len(FrameDecoder().feed(received)) == n
                nursery.cancel_scope.cancel()
