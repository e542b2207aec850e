"""The broker's health as ``/ping`` and ``/stats`` give it (light: ``/ping`` loads nothing else)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.observe.sources import BrokerSource

__all__ = ["health_text"]


def health_text(broker: BrokerSource) -> str:
    """``OK``, or ``NOK - <error>`` after a failed disk write (nsqd's ``GetHealth``)."""
    error = broker.health_error
    return "OK" if error is None else f"NOK - {error}"
