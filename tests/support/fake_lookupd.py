"""A stand-in for nsqlookupd's TCP side that records what each connection says.

It answers as nsqlookupd does: the IDENTIFY with a JSON description of itself, every other
command with ``OK``, each answer size-prefixed. Each connection's conversation is a list: the
magic, ``("IDENTIFY", body)``, then the command lines as bytes. Given ``channels``, it also
plays lookupd's HTTP API: every ``GET /channels?topic=`` is answered with those names, whatever
they are (or, given a dict, with the names it holds for that topic, or none; bytes there are
sent as the whole answer, and the connection is then held open), and the IDENTIFY answer gives
its address, as a real lookupd's does.
"""

from __future__ import annotations

import functools
import json
from urllib.parse import parse_qs, urlsplit

import trio

__all__ = ["start_fake_lookupd"]


async def start_fake_lookupd(nursery: trio.Nursery, conversations: list[list], port: int = 0, *,
                             channels: list | dict[str, list | bytes] | None = None,
                             identify_answer: bytes | dict | None = None) -> str:
    """Listen on 127.0.0.1:``port`` in ``nursery``; return ``host:port``. Each connection appends its conversation.

    With ``channels``, an HTTP listener answers ``/channels`` with ``{"channels": channels}`` (a dict:
    per topic, with the names or the raw HTTP answer it holds);
    ``identify_answer`` replaces the IDENTIFY answer's bytes, whatever they are (a dict: the fields
    it holds replace those of the answer).
    """
    identity = {"tcp_port": 4160, "http_port": 4161, "version": "1.3.0", "broadcast_address": "",
                "hostname": "recorder"}
    if channels is not None:
        per_topic = channels if isinstance(channels, dict) else None
        answers = {topic: names if isinstance(names, bytes) else _json_answer({"channels": names})
                   for topic, names in (per_topic or {}).items()}
        default = _json_answer({"channels": [] if per_topic is not None else channels})
        http = await nursery.start(functools.partial(trio.serve_tcp, functools.partial(_answer_http, answers, default),
                                                     0, host="127.0.0.1"))
        identity.update(http_port=http[0].socket.getsockname()[1], broadcast_address="127.0.0.1")

    if isinstance(identify_answer, dict):
        identity.update(identify_answer)
        identify_answer = None

    async def handler(stream: trio.SocketStream) -> None:
        answer = json.dumps(identity).encode() if identify_answer is None else identify_answer
        await _record_conversation(stream, conversations, answer)

    listeners = await nursery.start(functools.partial(trio.serve_tcp, handler, port, host="127.0.0.1"))
    return "127.0.0.1:%d" % listeners[0].socket.getsockname()[1]


def _json_answer(document: dict) -> bytes:
    answer = json.dumps(document).encode()
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n%s" % (len(answer), answer))


async def _answer_http(answers: dict[str, bytes], default: bytes, stream: trio.SocketStream) -> None:
    """One HTTP request answered with what ``answers`` holds for its topic (else ``default``); then the
    close, once the broker has closed (an answer may promise more than it sends)."""
    request = b""
    try:
        while b"\r\n\r\n" not in request:
            data = await stream.receive_some(65536)
            if not data:
                return
            request += data
        query = parse_qs(urlsplit(request.split(b" ", 2)[1].decode()).query)
        await stream.send_all(answers.get(query.get("topic", [""])[0], default))
        while await stream.receive_some(65536):
            pass
    except trio.BrokenResourceError:
        pass
    finally:
        await stream.aclose()


async def _record_conversation(stream: trio.SocketStream, conversations: list[list], identified: bytes) -> None:
    """Play nsqlookupd for one connection: record what arrives, answer as lookupd does."""
    conversation: list = []
    conversations.append(conversation)
    buffer = b""

    async def need(size: int) -> bytes:
        nonlocal buffer
        while len(buffer) < size:
            data = await stream.receive_some(65536)
            if not data:
                raise EOFError
            buffer += data
        taken, buffer = buffer[:size], buffer[size:]
        return taken

    async def answer(data: bytes) -> None:
        await stream.send_all(len(data).to_bytes(4, "big") + data)

    try:
        conversation.append(await need(4))
        while True:
            line = b""
            while not line.endswith(b"\n"):
                line += await need(1)
            if line == b"IDENTIFY\n":
                body = json.loads(await need(int.from_bytes(await need(4), "big")))
                conversation.append(("IDENTIFY", body))
                await answer(identified)
            else:
                conversation.append(line)
                await answer(b"OK")
    except (EOFError, trio.BrokenResourceError):
        pass
