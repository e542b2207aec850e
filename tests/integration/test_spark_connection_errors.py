"""The Spark connector and the bench tool pointed at the HTTP port: the answer is named for what it is."""

from __future__ import annotations

import socket
import threading

import pytest
import trio

from broker.bench.opening import BenchConnection, ServerError
from pyspark_nsq.dial import NsqError, dial
from pyspark_nsq.options import Address

HINT = "answered in HTTP: this is the HTTP port; the nsqd option wants the TCP port (4150 by default)"


async def test_connector_on_the_brokers_http_port_says_so(daemon):
    host, port = daemon.addresses.http
    with trio.fail_after(20), pytest.raises(NsqError) as caught:
        await trio.to_thread.run_sync(dial, Address(host, port), {})
    assert caught.value.code == "E_HTTP_PORT"
    assert str(caught.value) == f"nsqd {host}:{port}: E_HTTP_PORT {HINT}"


async def test_connector_on_the_tcp_port_still_connects(daemon):
    host, port = daemon.addresses.tcp
    with trio.fail_after(20):
        conn = await trio.to_thread.run_sync(dial, Address(host, port), {})
    conn.close()


def _serve_one_http_answer(listener: socket.socket, answer: bytes) -> None:
    conn, _ = listener.accept()
    with conn:
        conn.recv(1024)
        conn.sendall(answer)


@pytest.mark.parametrize("answer", [b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n", b"HTTP/1.0 400"])
def test_any_http_server_is_recognised(answer):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        server = threading.Thread(target=_serve_one_http_answer, args=(listener, answer))
        server.start()
        try:
            with pytest.raises(NsqError) as caught:
                dial(Address("127.0.0.1", listener.getsockname()[1]), {})
        finally:
            server.join(20)
    assert caught.value.description == HINT
    assert caught.value.fatal


async def test_bench_tool_on_the_brokers_http_port_says_so(daemon):
    host, port = daemon.addresses.http
    with trio.fail_after(20), pytest.raises(ServerError) as caught:
        await trio.to_thread.run_sync(BenchConnection.open, host, port, "bench", {})
    assert str(caught.value) == (f"{host}:{port} answered in HTTP: this is the HTTP port; --nsqd-tcp-address "
                                 "wants the TCP port (4150 by default)")
