"""Every subscription of one streaming query: each topic on each nsqd.

One connection may hold at most nsqd's ``--max-rdy-count`` (2500) messages in
flight, so a larger ``maxInFlight`` is spread over several connections to the
same nsqd; nsqd shares a channel's messages among them. A connection that dies is
replaced, at most once per ``RECONNECT_INTERVAL_S``; the messages it held come
back from nsqd when their msg_timeout expires. With ``lookupd`` the nsqd nodes are the
topics' producers as nsqlookupd lists them, asked again every ``LOOKUPD_POLL_INTERVAL_S``
so that nodes which start producing a topic while the query runs are subscribed to.
"""

from __future__ import annotations

import logging
import time

from .dial import NsqError
from .discovery import DiscoveryError, topic_producers
from .options import DEFAULT_MAX_IN_FLIGHT, MAX_RDY_COUNT, Address, SourceOptions
from .subscription import Message, Subscription

__all__ = ["Consumer", "Delivery", "RECONNECT_INTERVAL_S"]

#: Dead subscriptions are re-opened at most this often.
RECONNECT_INTERVAL_S = 1.0

#: With ``lookupd``, the topics' producers are looked up again this often.
LOOKUPD_POLL_INTERVAL_S = 10.0

#: A received message and the subscription that must FIN it.
Delivery = tuple[Subscription, Message]

_log = logging.getLogger(__name__)


class Consumer:
    """The subscriptions of ``options``; owned by the thread that calls it.

    ``open`` subscribes (raises :class:`NsqError` when no subscription succeeds),
    ``close`` REQs every message still held and closes all connections.
    """

    __slots__ = ("_options", "_subscriptions", "_per_connection", "_connections", "_targets", "_last_reconnect",
                 "_last_lookup")

    def __init__(self, options: SourceOptions):
        self._options = options
        budget = options.max_in_flight or DEFAULT_MAX_IN_FLIGHT
        connections = -(-budget // MAX_RDY_COUNT)
        self._connections = connections
        self._per_connection = -(-budget // connections)
        self._targets = self._lookup() if options.lookupd else [
            (address, topic) for address in options.nsqd for topic in options.topics]
        self._subscriptions = [
            self._subscription(address, topic)
            for address, topic in self._targets
            for _ in range(connections)
        ]
        self._last_reconnect = 0.0
        self._last_lookup = time.monotonic()

    def _lookup(self) -> list[tuple[Address, str]]:
        """Every (producer, topic) nsqlookupd lists; raises DiscoveryError when no lookupd answers."""
        return [(address, topic) for topic in self._options.topics
                for address in topic_producers(self._options.lookupd, topic)]

    def _add_new_producers(self) -> None:
        """Subscribe on nodes that started producing a topic since the last lookup."""
        self._last_lookup = time.monotonic()
        try:
            found = self._lookup()
        except DiscoveryError as exc:
            _log.warning("%s; the known nodes are kept", exc)
            return
        for address, topic in found:
            if (address, topic) in self._targets:
                continue
            self._targets.append((address, topic))
            _log.info("nsq source: %s produces %s; subscribing", address, topic)
            for _ in range(self._connections):
                subscription = self._subscription(address, topic)
                try:
                    subscription.start()
                except NsqError as exc:
                    subscription.error = exc  # retried with the other dead subscriptions
                self._subscriptions.append(subscription)

    def _subscription(self, address, topic) -> Subscription:
        return Subscription(address, topic, self._options.channel,
                          max_in_flight=self._per_connection,
                          msg_timeout_ms=self._options.msg_timeout_ms)

    def open(self) -> None:
        """Subscribe everywhere; failures other than total failure are retried later."""
        errors = []
        for subscription in self._subscriptions:
            try:
                subscription.start()
            except NsqError as exc:
                subscription.error = exc
                errors.append(exc)
        self._last_reconnect = time.monotonic()
        if errors and len(errors) == len(self._subscriptions):
            if len(errors) == 1:
                raise errors[0]
            raise NsqError(errors[0].address, errors[0].code, "cannot subscribe on any nsqd: "
                           + "; ".join(f"{err.address} {err.description}" for err in errors))
        for err in errors:
            _log.warning("nsq source: %s; retrying in the background", err)

    @property
    def window(self) -> int:
        """Messages nsqd may have in flight to the live subscriptions."""
        return sum(s.window for s in self._subscriptions if s.error is None)

    @property
    def window_full(self) -> bool:
        """True when nsqd sends nothing more until something is FIN'd."""
        live = [s for s in self._subscriptions if s.error is None]
        return bool(live) and sum(s.held for s in live) >= sum(s.window for s in live)

    def receive(self) -> list[Delivery]:
        """Every message that arrived since the last call."""
        received = []
        for subscription in self._subscriptions:
            inbox = subscription.inbox
            while inbox:
                received.append((subscription, inbox.popleft()))
        return received

    def replace_dead(self) -> list[Subscription]:
        """Re-open dead subscriptions (rate-limited); returns the ones given up.

        Messages received from a returned subscription and not yet planned should
        be dropped: nsqd delivers them again.
        """
        if self._options.lookupd and time.monotonic() - self._last_lookup >= LOOKUPD_POLL_INTERVAL_S:
            self._add_new_producers()
        if time.monotonic() - self._last_reconnect < RECONNECT_INTERVAL_S:
            return []
        self._last_reconnect = time.monotonic()
        dead = []
        for index, old in enumerate(self._subscriptions):
            if old.error is None:
                continue
            dead.append(old)
            old.close()
            fresh = self._subscription(old.address, old.topic)
            try:
                fresh.start()
                _log.info("nsq source: resubscribed to %s on %s", old.topic, old.address)
            except NsqError as exc:
                fresh.error = exc
            self._subscriptions[index] = fresh
        return dead

    @staticmethod
    def fin(deliveries: list[Delivery]) -> None:
        """FIN ``deliveries``, one write per subscription."""
        by_subscription: dict[int, tuple[Subscription, list[bytes]]] = {}
        for subscription, message in deliveries:
            by_subscription.setdefault(id(subscription), (subscription, []))[1].append(message.id)
        for subscription, ids in by_subscription.values():
            subscription.fin(ids)

    def close(self) -> None:
        """Close every subscription, REQ'ing what each still holds; idempotent."""
        for subscription in self._subscriptions:
            subscription.begin_close()  # all stop at once, not one after another
        for subscription in self._subscriptions:
            subscription.close()
