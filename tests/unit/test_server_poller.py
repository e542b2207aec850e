"""The read poller: a task waiting for a socket wakes when bytes arrive, however they race with it."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from broker.server.poller import ReadPoller, open_poller
from tests.support.socketpairs import read_ready, socket_pairs

pytestmark = pytest.mark.skipif(open_poller() is None, reason="epoll is Linux's")


@pytest.fixture
def pair():
    with socket_pairs(1) as [made]:
        yield made


@asynccontextmanager
async def _running(sock: socket.socket) -> AsyncIterator[tuple[ReadPoller, trio.Nursery]]:
    """A poller watching ``sock``, its task running in a nursery the test may use too;
    stopped and closed afterwards. Everything inside must finish within 5 s."""
    poller = ReadPoller()
    poller.register(sock.fileno())
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(poller.run)
            await trio.testing.wait_all_tasks_blocked()
            yield poller, nursery
            nursery.cancel_scope.cancel()
    poller.close()


async def test_a_waiting_task_wakes_when_bytes_arrive(pair):
    a, b = pair
    received = []
    async with _running(b) as (poller, nursery):
        async def reader() -> None:
            for _ in range(3):
                await poller.wait_readable(b.fileno())
                received.append(read_ready(b))

        nursery.start_soon(reader)
        for count, chunk in enumerate((b"one", b"two", b"three")):
            await trio.testing.wait_all_tasks_blocked()
            assert len(received) == count  # the reader waits: nothing came yet
            a.send(chunk)
        await trio.testing.wait_all_tasks_blocked()
    assert received == [b"one", b"two", b"three"]


async def test_bytes_that_arrive_while_nobody_waits_are_not_missed(pair):
    a, b = pair
    async with _running(b) as (poller, nursery):
        assert read_ready(b) == b""
        a.send(b"early")  # the edge comes while the reader is busy elsewhere
        await trio.testing.wait_all_tasks_blocked()
        await poller.wait_readable(b.fileno())
        assert read_ready(b) == b"early"


async def test_a_closed_peer_wakes_the_reader(pair):
    a, b = pair
    async with _running(b) as (poller, nursery):
        a.close()
        await poller.wait_readable(b.fileno())
        assert b.recv(10) == b""


async def test_the_last_bytes_and_a_close_in_one_edge_are_a_hang_up(pair):
    a, b = pair
    fd = b.fileno()
    async with _running(b) as (poller, nursery):
        assert not poller.hung_up(fd)
        a.send(b"last")
        a.shutdown(socket.SHUT_WR)  # before the poller looks: one edge for both
        await poller.wait_readable(fd)
        assert b.recv(100) == b"last"  # a short read that did not drain the socket,
        assert poller.hung_up(fd)  # as the poller says: no other edge will come
        assert b.recv(100) == b""
        poller.unregister(fd)
        assert not poller.hung_up(fd)


async def test_a_wait_can_be_cancelled_and_the_socket_waited_for_again(pair, autojump_clock):
    a, b = pair
    async with _running(b) as (poller, nursery):
        with trio.move_on_after(0.01) as scope:
            await poller.wait_readable(b.fileno())
        assert scope.cancelled_caught
        a.send(b"later")
        await poller.wait_readable(b.fileno())
        assert read_ready(b) == b"later"


async def test_two_readers_of_one_socket_are_refused(pair):
    a, b = pair
    async with _running(b) as (poller, nursery):
        nursery.start_soon(poller.wait_readable, b.fileno())
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(trio.BusyResourceError):
            await poller.wait_readable(b.fileno())


async def test_an_unregistered_socket_leaves_no_edge_behind(pair, autojump_clock):
    a, b = pair
    fd = b.fileno()
    async with _running(b) as (poller, nursery):
        a.send(b"x")
        await trio.testing.wait_all_tasks_blocked()  # the edge is remembered for fd
        poller.unregister(fd)
        poller.register(fd)  # as a new connection that got the same number
        assert read_ready(b) == b"x"
        with trio.move_on_after(0.01) as scope:
            await poller.wait_readable(fd)
        assert scope.cancelled_caught  # the old connection's edge is gone


async def test_an_input_handler_takes_the_input_until_it_says_the_task_must(pair):
    a, b = pair
    handled = []

    def on_input() -> bool:
        data = read_ready(b)
        handled.append(data)
        return data != b"stop"  # False: the waiting task takes over

    async with _running(b) as (poller, nursery):
        woken = trio.Event()

        async def reader() -> None:
            await poller.wait_readable(b.fileno(), on_input)
            woken.set()

        nursery.start_soon(reader)
        for chunk in (b"one", b"two"):
            await trio.testing.wait_all_tasks_blocked()
            a.send(chunk)
        await trio.testing.wait_all_tasks_blocked()
        assert handled == [b"one", b"two"] and not woken.is_set()
        a.send(b"stop")
        await woken.wait()
        assert handled == [b"one", b"two", b"stop"]


async def test_a_handler_that_fails_wakes_only_its_task_and_the_poller_serves_on():
    # the handler's contract: it never raises; a failure is state its own task acts on once woken
    with socket_pairs(2) as [(a, b), (c, d)]:
        failure: list[str] = []
        others: list[bytes] = []

        def failing() -> bool:
            read_ready(b)
            failure.append("bad input")  # kept for the waiting task, not raised
            return False

        def other() -> bool:
            others.append(read_ready(d))
            return True

        async with _running(b) as (poller, nursery):
            poller.register(d.fileno())
            acted_on = []

            async def failing_reader() -> None:
                await poller.wait_readable(b.fileno(), failing)
                acted_on.append(failure.pop())  # the failure is handled in this task

            nursery.start_soon(failing_reader)
            nursery.start_soon(poller.wait_readable, d.fileno(), other)
            await trio.testing.wait_all_tasks_blocked()
            a.send(b"x")
            c.send(b"one")
            await trio.testing.wait_all_tasks_blocked()
            assert acted_on == ["bad input"]
            c.send(b"two")  # the poller goes on serving the other socket
            await trio.testing.wait_all_tasks_blocked()
            assert others == [b"one", b"two"]
            poller.unregister(d.fileno())


async def test_what_escapes_a_handler_ends_the_pollers_task_and_never_reaches_the_waiting_one(pair):
    # a handler that breaks the contract is the poller owner's fault: it goes up to the nursery
    # that runs the poller, as any task's error does, not sideways into the connection's task
    a, b = pair
    poller = ReadPoller()
    poller.register(b.fileno())
    waiter_saw = []

    def on_input() -> bool:
        raise ValueError("bad input")

    async def reader() -> None:
        try:
            await poller.wait_readable(b.fileno(), on_input)
        except BaseException as exc:
            waiter_saw.append(type(exc))
            raise

    with trio.fail_after(5), pytest.raises(ExceptionGroup) as raised:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(poller.run)
            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            a.send(b"x")
            await trio.sleep_forever()
    poller.close()
    assert raised.group_contains(ValueError, match="bad input")
    assert waiter_saw == [trio.Cancelled]
