"""The leased source's offset: which micro-batch of which query, and where it reads.

Spark keeps a streaming source's offsets in the checkpoint as JSON, so the plan of a
batch replayed after a restart comes back from there. The JSON shape is fixed, and
checkpoints written by earlier versions load unchanged::

    {"offset": rows planned so far, "query": id, "batch": n, "reads": [[nsqd, topic, count], ...]}

An offset without ``query`` (the driver-side path writes ``{"offset": n}``) loads as
one with no plan, and is written back the same way. The lease tokens' secret is in
no offset: see :mod:`.lease_partition`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["LeaseOffset", "PlannedRead"]


@dataclass(frozen=True, slots=True)
class PlannedRead:
    """One partition's read: ``count`` messages of ``topic`` from the nsqd at ``nsqd`` (``host:port``)."""

    nsqd: str
    topic: str
    count: int


@dataclass(frozen=True, slots=True)
class LeaseOffset:
    """The end of micro-batch ``batch`` of query ``query``: ``offset`` rows planned so far,
    the last batch's ``reads``."""

    offset: int = 0
    query: str | None = None
    batch: int = 0
    reads: tuple[PlannedRead, ...] = ()

    @property
    def planned(self) -> int:
        """Messages this batch's reads take at most."""
        return sum(read.count for read in self.reads)

    @classmethod
    def from_json(cls, value: Mapping[str, Any] | str) -> LeaseOffset:
        """The offset Spark hands back (a dict, or its JSON text); missing keys take their
        defaults. Raises ValueError or TypeError when a field has the wrong shape."""
        if isinstance(value, str):
            value = json.loads(value)
        if not isinstance(value, Mapping):
            raise TypeError(f"an offset is a JSON object, not {type(value).__name__}")
        reads = tuple(PlannedRead(str(nsqd), str(topic), int(count)) for nsqd, topic, count in value.get("reads", ()))
        return cls(int(value.get("offset", 0)), value.get("query"), int(value.get("batch", 0)), reads)

    def to_json(self) -> dict[str, Any]:
        """The JSON object Spark stores: the shape documented above."""
        if self.query is None:
            return {"offset": self.offset}
        return {"offset": self.offset, "query": self.query, "batch": self.batch,
                "reads": [[read.nsqd, read.topic, read.count] for read in self.reads]}
