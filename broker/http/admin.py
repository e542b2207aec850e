"""nsqd's administration endpoints: topics, channels, ``/config/:opt`` and ``/debug/freememory``.

Pausing and unpausing are written to the metadata at once, so that a crash cannot
(un)pause a topic or channel behind the operator's back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import gc
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker.config.log import LOG_LEVELS, set_log_level
from broker.config.options import get_config_value
from broker.core.host import MAX_REPLICAS
from broker.gocompat import go_unmarshal, replace_surrogates
from broker.http.query import count_param, first, request_params
from broker.http.responses import APIError, v1
from broker.http.router import Endpoint
from broker.http.server import BodyReadError, Request, RequestBody, Response
from broker.http.targets import (
    existing_channel,
    existing_topic_and_channel_name,
    new_topic,
    persist_metadata,
    topic_name,
)
from broker.protocol import is_valid_name

if TYPE_CHECKING:
    from broker.core.broker import Broker
    from broker.core.topic import Topic

__all__ = ["AdminEndpoints"]

log = logging.getLogger("pynsqd.http")


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, which returns freed heap to the system; None elsewhere."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None)
    except OSError:
        return None


class AdminEndpoints:
    """Create, delete, empty, pause and unpause topics and channels; read and set options."""

    def __init__(self, broker: Broker):
        self.broker = broker

    def routes(self) -> dict[tuple[str, str], Endpoint]:
        """This group's entries for the :class:`~broker.http.router.Router`."""
        return {
            ("POST", "/topic/create"): self.topic_create,
            ("POST", "/topic/delete"): self.topic_delete,
            ("POST", "/topic/empty"): self.topic_empty,
            ("POST", "/topic/pause"): self.topic_pause,
            ("POST", "/topic/unpause"): self.topic_unpause,
            ("POST", "/channel/create"): self.channel_create,
            ("POST", "/channel/delete"): self.channel_delete,
            ("POST", "/channel/empty"): self.channel_empty,
            ("POST", "/channel/pause"): self.channel_pause,
            ("POST", "/channel/unpause"): self.channel_unpause,
            ("GET", "/config/:opt"): self.config,
            ("PUT", "/config/:opt"): self.config,
            ("POST", "/debug/freememory"): self.free_memory,
        }

    # ---------------------------------------------------------------- topics

    async def topic_create(self, request: Request, body: RequestBody, param: str) -> Response:
        """``POST /topic/create?topic=``; with ``replicas=N`` (1 to :data:`MAX_REPLICAS`, or
        ``default``: the node's ``--replicas``) the topic's messages are held by N nodes from
        its next publish on, kept in the metadata at once."""
        params = request_params(request)
        text = first(params, "replicas")
        if text is None:
            new_topic(self.broker, params)
            return v1()
        name = topic_name(params)
        replicas = None if text == "default" else count_param(params, "replicas", None, MAX_REPLICAS)
        if replicas == 0 or (replicas is None and text != "default"):
            raise APIError(400, "INVALID_ARG_REPLICAS")
        if replicas is not None and replicas > 1 and not self.broker.keeps_copies:
            raise APIError(400, "REPLICATION_DISABLED")
        topic = self.broker.get_topic(name)
        self.broker.set_replicas(topic, replicas)
        await persist_metadata(self.broker)  # at once, like pause: a crash must not undo it
        return v1({"replicas": self.broker.host.copies.replicas(topic.name)})

    async def topic_delete(self, request: Request, body: RequestBody, param: str) -> Response:
        """``POST /topic/delete?topic=``: the topic, its channels and their data."""
        name = first(request_params(request), "topic")
        if name is None:
            raise APIError(400, "MISSING_ARG_TOPIC")
        try:
            self.broker.delete_topic(name)
        except KeyError:
            raise APIError(404, "TOPIC_NOT_FOUND") from None
        return v1()

    async def topic_empty(self, request: Request, body: RequestBody, param: str) -> Response:
        """``POST /topic/empty?topic=``: drop the messages not yet copied to channels."""
        name = first(request_params(request), "topic")
        if name is None:
            raise APIError(400, "MISSING_ARG_TOPIC")
        if not is_valid_name(name):
            raise APIError(400, "INVALID_TOPIC")
        topic = self.broker.topics.get(name)
        if topic is None:
            raise APIError(404, "TOPIC_NOT_FOUND")
        try:
            topic.empty()
        except Exception as exc:
            log.error("failed to empty topic %s - %s", name, exc)
            raise APIError(500, "INTERNAL_ERROR") from None
        return v1()

    async def topic_pause(self, request: Request, body: RequestBody, param: str) -> Response:
        """``POST /topic/pause?topic=``: stop copying messages to the channels."""
        self._named_topic(request).pause()
        await persist_metadata(self.broker)
        return v1()

    async def topic_unpause(self, request: Request, body: RequestBody, param: str) -> Response:
        """``POST /topic/unpause?topic=``."""
        self._named_topic(request).unpause()
        await persist_metadata(self.broker)
        return v1()

    def _named_topic(self, request: Request) -> Topic:
        name = first(request_params(request), "topic")
        if name is None:
            raise APIError(400, "MISSING_ARG_TOPIC")
        topic = self.broker.topics.get(name)
        if topic is None:
            raise APIError(404, "TOPIC_NOT_FOUND")
        return topic

    # ---------------------------------------------------------------- channels

    async def channel_create(self, request: Request, body: RequestBody, param: str) -> Response:
        """``POST /channel/create?topic=&channel=``: the topic must exist."""
        topic, channel_name = existing_topic_and_channel_name(self.broker, request_params(request))
        topic.get_channel(channel_name)
        return v1()

    async def channel_delete(self, request: Request, body: RequestBody, param: str) -> Response:
        """``POST /channel/delete?topic=&channel=``."""
        topic, channel_name = existing_topic_and_channel_name(self.broker, request_params(request))
        try:
            topic.delete_channel(channel_name)
        except KeyError:
            raise APIError(404, "CHANNEL_NOT_FOUND") from None
        return v1()

    async def channel_empty(self, request: Request, body: RequestBody, param: str) -> Response:
        """``POST /channel/empty?topic=&channel=``: drop the messages waiting for delivery."""
        channel = existing_channel(self.broker, request_params(request))
        try:
            channel.empty()
        except Exception as exc:
            log.error("failed to empty channel %s:%s - %s", channel.topic_name, channel.name, exc)
            raise APIError(500, "INTERNAL_ERROR") from None
        return v1()

    async def channel_pause(self, request: Request, body: RequestBody, param: str) -> Response:
        """``POST /channel/pause?topic=&channel=``: stop delivering to its consumers."""
        existing_channel(self.broker, request_params(request)).pause()
        await persist_metadata(self.broker)
        return v1()

    async def channel_unpause(self, request: Request, body: RequestBody, param: str) -> Response:
        """``POST /channel/unpause?topic=&channel=``."""
        existing_channel(self.broker, request_params(request)).unpause()
        await persist_metadata(self.broker)
        return v1()

    # ---------------------------------------------------------------- options and memory

    async def config(self, request: Request, body: RequestBody, opt: str) -> Response:
        """``GET /config/:opt`` reads an option; ``PUT`` sets ``nsqlookupd_tcp_addresses`` or ``log_level``."""
        broker = self.broker
        if request.method == "PUT":
            limit = broker.options.max_msg_size + 1
            try:
                data = await body.read(limit)
            except BodyReadError:
                raise APIError(500, "INTERNAL_ERROR") from None
            if len(data) == limit or not data:
                raise APIError(413, "INVALID_VALUE")
            changes: dict[str, Any]
            if opt == "nsqlookupd_tcp_addresses":
                try:
                    addresses = go_unmarshal(data)
                except ValueError:
                    raise APIError(400, "INVALID_VALUE") from None
                if addresses is None:
                    addresses = []
                if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
                    raise APIError(400, "INVALID_VALUE")
                changes = {"nsqlookupd_tcp_addresses": tuple(map(replace_surrogates, addresses))}
            elif opt == "log_level":
                level = data.decode("utf-8", "replace").lower()
                if level not in LOG_LEVELS:
                    raise APIError(400, "INVALID_VALUE")
                changes = {"log_level": level}
            else:
                raise APIError(400, "INVALID_OPTION")
            try:
                broker.reconfigure(dataclasses.replace(broker.options, **changes))
            except ValueError:
                raise APIError(400, "INVALID_VALUE") from None
            if "log_level" in changes:
                set_log_level(changes["log_level"])
        try:
            value = get_config_value(broker.options, opt)
        except KeyError:
            raise APIError(400, "INVALID_OPTION") from None
        return v1(value)

    async def free_memory(self, request: Request, body: RequestBody, param: str) -> Response:
        """``POST /debug/freememory``: collect garbage and return freed heap to the system."""
        gc.collect()
        trim = _malloc_trim()
        if trim is not None:
            trim(0)
        # nsqd 1.3.0 answers this endpoint with a 500: its plain-text wrapper cannot
        # render the handler's empty result (the memory was freed all the same).
        raise APIError(500, "INTERNAL_ERROR")
