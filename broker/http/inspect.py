"""pynsqd's own endpoints, in the V1 style: look into a channel and manage its dead letters.

``GET /channel/peek`` (``state`` = ready, deferred, in_flight or buried; ``n``),
``POST /channel/kick`` and ``POST /channel/delete_buried`` (``id``, or ``n`` oldest,
or all) and ``POST /channel/max_attempts`` (``value`` = a count up to 65535, 0 for
never, or ``default``). Every number is bounded before it is used: ``n`` by
:data:`MAX_PEEK` for a peek and int64 for a kick or delete, ``value`` by the attempts a
message frame can carry.
"""

from __future__ import annotations

import base64
import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker.http.query import Params, count_param, first, request_params
from broker.http.responses import APIError, v1
from broker.http.router import Endpoint
from broker.http.server import Request, RequestBody, Response
from broker.http.targets import existing_channel, persist_metadata
from broker.protocol import MAX_ATTEMPTS

if TYPE_CHECKING:
    from broker.core.broker import Broker
    from broker.core.channel import Channel
    from broker.core.message import Message

__all__ = ["InspectEndpoints", "DEFAULT_PEEK", "MAX_PEEK"]

log = logging.getLogger("pynsqd.http")

#: Messages ``/channel/peek`` returns by default, and at most.
DEFAULT_PEEK = 10
MAX_PEEK = 1000

_MESSAGE_ID = re.compile(r"[0-9a-f]{16}")

#: state -> (how many the channel holds in it, the channel's peek method)
_PEEK: dict[str, tuple[Callable[[Any], int], str]] = {
    "ready": (lambda channel: channel.depth, "peek_ready"),
    "deferred": (lambda channel: len(channel.deferred), "peek_deferred"),
    "in_flight": (lambda channel: len(channel.in_flight), "peek_in_flight"),
    "buried": (lambda channel: len(channel.buried), "peek_buried"),
}


def _message_document(msg: Message, default_priority: int | None) -> dict:
    """A message as a peek shows it; ``default_priority``: its topic has priorities, and each
    message shows its own (this, for a message without one)."""
    try:
        text: str | None = msg.body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    doc = {
        "id": msg.id.decode("ascii", "replace"),
        "timestamp": msg.timestamp,
        "attempts": msg.attempts,
        "due": msg.due_ns,
        "body": text,
        "body_base64": base64.b64encode(msg.body).decode("ascii"),
    }
    if default_priority is not None:
        doc["priority"] = default_priority if msg.priority is None else msg.priority
    return doc


def _buried_selection(params: Params) -> tuple[bytes | None, int]:
    """(the ``id`` asked for, or None; the ``n`` oldest asked for, -1 for all)."""
    msg_id = first(params, "id")
    if msg_id is not None:
        if not _MESSAGE_ID.fullmatch(msg_id):
            raise APIError(400, "INVALID_ID")
        return msg_id.encode("ascii"), 0
    n = count_param(params, "n", None)
    if n is None and "n" in params:
        raise APIError(400, "INVALID_N")
    return None, n if n is not None else -1


class InspectEndpoints:
    """Peek into a channel's messages; kick, delete and limit its dead letters."""

    def __init__(self, broker: Broker):
        self.broker = broker

    def routes(self) -> dict[tuple[str, str], Endpoint]:
        """This group's entries for the :class:`~broker.http.router.Router`."""
        return {
            ("GET", "/channel/peek"): self.peek,
            ("POST", "/channel/kick"): self.kick,
            ("POST", "/channel/delete_buried"): self.delete_buried,
            ("POST", "/channel/max_attempts"): self.max_attempts,
        }

    async def peek(self, request: Request, body: RequestBody, param: str) -> Response:
        """``GET /channel/peek``: the next ``n`` messages in a state, without changing anything."""
        params = request_params(request)
        channel = existing_channel(self.broker, params)
        state = first(params, "state") or "ready"
        peek = _PEEK.get(state)
        if peek is None:
            raise APIError(400, "INVALID_STATE")
        n = count_param(params, "n", DEFAULT_PEEK, MAX_PEEK)
        if n is None:
            raise APIError(400, "INVALID_N")
        count_of, peek_method = peek
        messages = getattr(channel, peek_method)(n)
        default = self.broker.options.default_priority if channel.ranked else None
        return v1({
            "topic": channel.topic_name,
            "channel": channel.name,
            "state": state,
            "count": count_of(channel),
            "messages": [_message_document(msg, default) for msg in messages],
        })

    async def kick(self, request: Request, body: RequestBody, param: str) -> Response:
        """``POST /channel/kick``: buried messages back to ready (``id``, or the ``n`` oldest, or all)."""
        return await self._on_buried(request, "kicked", lambda channel, msg_id, n: channel.kick(msg_id, n))

    async def delete_buried(self, request: Request, body: RequestBody, param: str) -> Response:
        """``POST /channel/delete_buried``: drop buried messages (``id``, or the ``n`` oldest, or all)."""
        return await self._on_buried(request, "deleted", lambda channel, msg_id, n: channel.delete_buried(msg_id, n))

    async def _on_buried(self, request: Request, key: str,
                         action: Callable[[Channel, bytes | None, int], int]) -> Response:
        """Apply ``action`` to the buried messages the query selects and save them; ``{key: count}``."""
        params = request_params(request)
        channel = existing_channel(self.broker, params)
        msg_id, n = _buried_selection(params)
        done = action(channel, msg_id, len(channel.buried) if n < 0 else n)
        try:
            await channel.persist_buried()
        except Exception as exc:
            log.error("failed to persist buried messages of %s:%s - %s", channel.topic_name, channel.name, exc)
            raise APIError(500, "INTERNAL_ERROR") from None
        return v1({key: done})

    async def max_attempts(self, request: Request, body: RequestBody, param: str) -> Response:
        """``POST /channel/max_attempts?value=N``: this channel's attempts limit (``default``: the flag's)."""
        params = request_params(request)
        channel = existing_channel(self.broker, params)
        value = first(params, "value")
        if value is None:
            raise APIError(400, "MISSING_ARG_VALUE")
        if value == "default":
            channel.set_max_attempts(None)
        else:
            limit = count_param(params, "value", None, MAX_ATTEMPTS)
            if limit is None:
                raise APIError(400, "INVALID_VALUE")
            channel.set_max_attempts(limit)
        await persist_metadata(self.broker)  # at once, like pause: a crash must not undo it
        return v1({"max_attempts": channel.max_attempts})
