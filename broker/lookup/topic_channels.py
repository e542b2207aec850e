"""Asking nsqlookupd's HTTP API which channels a topic has (``GET /channels?topic=``).

nsqd asks every lookupd it is registered with when it creates a topic, and creates those
channels before the topic's first message is delivered, so that every consumer group known
in the cluster gets it (``internal/clusterinfo``'s ``GetLookupdTopicChannels``).
"""

from __future__ import annotations

import logging
import re
from urllib.parse import quote

import httptools
import trio

from broker.gocompat import go_quote_str, go_unmarshal
from broker.lookup.peer import dial_error, split_address

__all__ = ["LookupHTTPError", "get_nodes", "get_topic_channels", "query_topic_channels"]

log = logging.getLogger("pynsqd.lookup")

_READ_SIZE = 65536
_CONTROL = re.compile("[\x00-\x1f\x7f]")
#: The largest answer read from lookupd's HTTP API.
MAX_ANSWER_SIZE = 16 * 1024 * 1024


class LookupHTTPError(OSError):
    """A lookupd HTTP request failed: no connection, a timeout, a non-200 status or a bad body."""


async def get_topic_channels(address: str, topic: str, connect_timeout: float, request_timeout: float) -> list[str]:
    """The channels lookupd at ``address`` (``host:port``) knows for ``topic``; raises :class:`LookupHTTPError`."""
    target = f"/channels?topic={quote(topic, safe='')}"
    body = await _get(address, target, connect_timeout, request_timeout)
    try:
        channels = go_unmarshal(body)["channels"]
    except (ValueError, KeyError, TypeError) as exc:
        raise LookupHTTPError(f"bad answer from http://{address}{target}: {exc}") from exc
    if not isinstance(channels, list):
        return []
    return [name for name in channels if isinstance(name, str)]


async def get_nodes(address: str, connect_timeout: float, request_timeout: float) -> list[tuple[str, int]]:
    """The ``(broadcast_address, tcp_port)`` of every node lookupd at ``address`` lists in ``/nodes``;
    raises :class:`LookupHTTPError`."""
    target = "/nodes"
    body = await _get(address, target, connect_timeout, request_timeout)
    try:
        producers = go_unmarshal(body)["producers"]
        return [(p["broadcast_address"], int(p["tcp_port"])) for p in producers or ()
                if isinstance(p, dict) and isinstance(p.get("broadcast_address"), str)]
    except (ValueError, KeyError, TypeError) as exc:
        raise LookupHTTPError(f"bad answer from http://{address}{target}: {exc}") from exc


async def _get(address: str, target: str, connect_timeout: float, request_timeout: float) -> bytes:
    """The body of lookupd's 200 answer to ``GET target``; raises :class:`LookupHTTPError`."""
    if _CONTROL.search(address):  # Go's url.Parse refuses them; the name resolver would stop at a NUL
        raise LookupHTTPError(f"parse {go_quote_str(f'http://{address}{target}')}: "
                              "net/url: invalid control character in URL")
    try:
        host, port = split_address(address)
        with trio.fail_after(connect_timeout):
            stream = await trio.open_tcp_stream(host, port)
    except (OSError, ValueError, trio.TooSlowError) as exc:
        raise LookupHTTPError(f"Get \"http://{address}{target}\": {dial_error(exc)}") from exc
    async with stream:
        try:
            with trio.fail_after(request_timeout):
                status, body = await _exchange(stream, address, target)
        except (OSError, trio.BrokenResourceError, trio.TooSlowError, httptools.HttpParserError) as exc:
            raise LookupHTTPError(f"Get \"http://{address}{target}\": {str(exc) or 'i/o timeout'}") from exc
    if status != 200:
        raise LookupHTTPError(f"got response {status} from http://{address}{target}")
    return body


async def query_topic_channels(addresses: list[str], topic: str, connect_timeout: float,
                               request_timeout: float) -> list[str]:
    """The sorted union of the channels every lookupd in ``addresses`` knows for ``topic``, asked at once.

    Raises :class:`LookupHTTPError` only when every lookupd failed.
    """
    found: set[str] = set()
    errors: list[str] = []

    async def ask(address: str) -> None:
        try:
            found.update(await get_topic_channels(address, topic, connect_timeout, request_timeout))
        except LookupHTTPError as exc:
            errors.append(str(exc))

    async with trio.open_nursery() as nursery:
        for address in addresses:
            nursery.start_soon(ask, address)
    if addresses and len(errors) == len(addresses):
        raise LookupHTTPError(f"failed to query any nsqlookupd: {'; '.join(errors)}")
    return sorted(found)


class _Answer:
    """What llhttp reads of lookupd's answer: its status, its body, and whether it ended."""

    def __init__(self) -> None:
        self.status = 0
        self.body = bytearray()
        self.framed = False  # the length is given (Content-Length or chunked), not the close
        self.head_done = False
        self.complete = False

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.head_done = True

    def on_body(self, data: bytes) -> None:
        self.body += data
        if len(self.body) > MAX_ANSWER_SIZE:
            raise httptools.HttpParserError("answer too large")

    def on_message_complete(self) -> None:
        self.complete = True


async def _exchange(stream: trio.abc.Stream, address: str, target: str) -> tuple[int, bytes]:
    answer = _Answer()
    parser = httptools.HttpResponseParser(answer)
    await stream.send_all(f"GET {target} HTTP/1.1\r\nHost: {address}\r\n"
                          "Accept: application/vnd.nsq; version=1.0\r\nConnection: close\r\n\r\n".encode())
    while not answer.complete:
        data = bytes(await stream.receive_some(_READ_SIZE))
        if not data:
            if answer.head_done and not answer.framed:  # a body that runs to the close
                break
            raise httptools.HttpParserError("connection closed before the answer ended")
        try:
            parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            raise exc.__context__ or exc from None
    return parser.get_status_code(), bytes(answer.body)
