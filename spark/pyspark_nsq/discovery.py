"""Finding nsqd nodes through nsqlookupd's HTTP API (the ``lookupd`` option).

Readers ask every lookupd ``GET /lookup?topic=`` for the topic's producers, as consumer
libraries do; writers ask ``GET /nodes`` for every registered node, since a topic nobody
has published to yet has no producers. Answers of all lookupds are merged: they do not
coordinate, and a node may have registered with some only. A lookupd that cannot be reached
is skipped; when none answers, :class:`DiscoveryError` says why for each.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request

from .options import Address

__all__ = ["DiscoveryError", "all_nodes", "topic_producers"]

#: Seconds a lookupd has to answer (pynsq's lookupd_request_timeout is 2 s).
LOOKUPD_TIMEOUT_S = 5.0


class DiscoveryError(ConnectionError):
    """No nsqlookupd answered; the message lists each one's failure."""


def _get(lookupd: Address, target: str) -> dict | None:
    """The JSON answer of one lookupd, or None for ``404`` (a topic it does not know)."""
    request = urllib.request.Request(f"http://{lookupd}{target}",
                                     headers={"Accept": "application/vnd.nsq; version=1.0"})
    try:
        with urllib.request.urlopen(request, timeout=LOOKUPD_TIMEOUT_S) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def _ask_all(lookupds: tuple[Address, ...], target: str) -> list[Address]:
    found: dict[Address, None] = {}
    errors = []
    for lookupd in lookupds:
        try:
            answer = _get(lookupd, target)
        except (OSError, ValueError) as exc:
            errors.append(f"{lookupd}: {exc}")
            continue
        for producer in (answer or {}).get("producers") or ():
            host = producer.get("broadcast_address") or producer.get("address")
            port = producer.get("tcp_port")
            if host and isinstance(port, int):
                found[Address(host, port)] = None
    if errors and len(errors) == len(lookupds):
        raise DiscoveryError(f"nsq data source: no nsqlookupd answered {target}: {'; '.join(errors)}")
    # one order whatever order the lookupds answer in (nsqlookupd's is Go's map order, random):
    # the writer's tasks start at node ``partition % n`` of this list, and so spread over every node
    return sorted(found, key=lambda address: (address.host, address.port))


def topic_producers(lookupds: tuple[Address, ...], topic: str) -> list[Address]:
    """The nsqd TCP addresses that produce ``topic``, by every lookupd; raises :class:`DiscoveryError`."""
    return _ask_all(lookupds, "/lookup?topic=" + urllib.parse.quote(topic, safe=""))


def all_nodes(lookupds: tuple[Address, ...]) -> list[Address]:
    """Every nsqd TCP address registered with any lookupd; raises :class:`DiscoveryError`."""
    return _ask_all(lookupds, "/nodes")
