"""Keyed publishes: the keys each topic stored within ``--dedup-window``, and their journals.

A keyed publish whose key its topic stored within the window is a *duplicate*: it is
answered as a success and nothing is stored (see :mod:`broker.protocol.keys` for the wire
form). Two structures hold the keys, and one file on disk per topic:

- :mod:`.journal` — :class:`TopicKeys`: one topic's set of keys, for the check, and its
  journal (``<topic>#keys``): the record format and what is written when;
- :mod:`.store` — :class:`KeyStore`: every key of every topic once more, oldest first, for
  the window and ``--dedup-max-keys``.

Who imports whom: the broker and the topic import this package; it imports the stores below
(:mod:`broker.core.durability`, :mod:`broker.core.message`) and nothing above.
"""

from broker.core.keys.journal import (
    KEY_RECORD_MIN,
    NO_ID,
    TopicKeys,
    decode_record,
    encode_record,
    journal_name,
    record_expiry,
)
from broker.core.keys.store import RUN_NS, KeyStore

__all__ = ["KEY_RECORD_MIN", "NO_ID", "RUN_NS", "KeyStore", "TopicKeys", "decode_record", "encode_record",
           "journal_name", "record_expiry"]
