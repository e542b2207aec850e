"""The topic or channel a request names, found as nsqd's ``http.go`` finds them, and
the metadata write that makes a change to them survive a crash."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from broker.http.query import Params, first
from broker.http.responses import APIError
from broker.protocol import is_valid_name

if TYPE_CHECKING:
    from broker.core.broker import Broker
    from broker.core.channel import Channel
    from broker.core.topic import Topic

__all__ = ["topic_name", "new_topic", "existing_topic_and_channel_name", "existing_channel", "persist_metadata"]

log = logging.getLogger("pynsqd.http")


def topic_name(params: Params) -> str:
    """The ``topic`` parameter, checked as nsqd's ``getTopicFromQuery`` checks it."""
    name = first(params, "topic")
    if name is None:
        raise APIError(400, "MISSING_ARG_TOPIC")
    if not is_valid_name(name):
        raise APIError(400, "INVALID_TOPIC")
    return name


def new_topic(broker: Broker, params: Params) -> Topic:
    """nsqd's ``getTopicFromQuery``: the named topic, created if new."""
    return broker.get_topic(topic_name(params))


def existing_topic_and_channel_name(broker: Broker, params: Params) -> tuple[Topic, str]:
    """nsqd's ``getExistingTopicFromQuery``: validated names, the topic must exist."""
    topic_name = first(params, "topic")
    if topic_name is None:
        raise APIError(400, "MISSING_ARG_TOPIC")
    if not is_valid_name(topic_name):
        raise APIError(400, "INVALID_ARG_TOPIC")
    channel_name = first(params, "channel")
    if channel_name is None:
        raise APIError(400, "MISSING_ARG_CHANNEL")
    if not is_valid_name(channel_name):
        raise APIError(400, "INVALID_ARG_CHANNEL")
    topic = broker.topics.get(topic_name)
    if topic is None:
        raise APIError(404, "TOPIC_NOT_FOUND")
    return topic, channel_name


def existing_channel(broker: Broker, params: Params) -> Channel:
    """The channel named by ``topic`` and ``channel``; both must exist."""
    topic, channel_name = existing_topic_and_channel_name(broker, params)
    channel = topic.channels.get(channel_name)
    if channel is None:
        raise APIError(404, "CHANNEL_NOT_FOUND")
    return channel


async def persist_metadata(broker: Broker) -> None:
    """Write the metadata now, so that a crash cannot undo an operator's change."""
    try:
        await broker.persist_metadata()
    except OSError as exc:  # nsqd ignores this error too; the metadata task retries
        log.error("failed to persist metadata - %s", exc)
        broker.metadata_changed()
