"""Registration with nsqlookupd: the ``"  V1"`` client nsqd runs for each ``--lookupd-tcp-address``.

:class:`LookupClient` listens to the broker's topics and channels and keeps every lookupd
informed; :mod:`broker.lookup.v1` is the wire protocol without I/O.
"""

from broker.lookup.client import Identity, LookupClient

__all__ = ["Identity", "LookupClient"]
