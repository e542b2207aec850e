"""The connector's options, parsed and validated once per reader or writer.

Spark hands a data source its options with lower-cased keys; every name here is
documented in camelCase (``maxMessagesPerTrigger``) and matched without regard to
case. Each kind of access (streaming source, batch reader, writer) accepts its own
set of options, and an unknown, missing or malformed one raises
:class:`OptionError` naming it before any connection is opened.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from broker.client import Address
from broker.protocol import is_valid_name

__all__ = [
    "Address",
    "OptionError",
    "SourceOptions",
    "BatchReadOptions",
    "SinkOptions",
    "parse_addresses",
    "check_read_options",
]

#: nsqd's --max-rdy-count default; the largest RDY a connection may ask for.
MAX_RDY_COUNT = 2500
#: Messages a reader keeps in flight per nsqd and topic by default: one
#: connection's worth. More means bigger batches and more driver memory.
DEFAULT_MAX_IN_FLIGHT = MAX_RDY_COUNT
#: Messages the streaming source leases per micro-batch by default when the broker
#: offers leases (pynsqd): they wait in the broker, not in Spark, so the budget is large.
DEFAULT_LEASED_IN_FLIGHT = 500_000
_MAX_IN_FLIGHT = 1_000_000
#: nsqd's IDENTIFY bounds for msg_timeout: 1 s .. --max-msg-timeout (15 min).
MIN_MSG_TIMEOUT_MS = 1000
MAX_MSG_TIMEOUT_MS = 900_000
#: nsqd's default --msg-timeout.
DEFAULT_MSG_TIMEOUT_MS = 60_000
#: nsqd's default --max-req-timeout: the longest DPUB deferral it accepts.
MAX_DEFER_MS = 3_600_000
#: Messages per MPUB by default: enough to amortise the round trip, far below
#: nsqd's default --max-body-size (5 MiB) for small rows.
DEFAULT_BATCH_SIZE = 1000
#: How long a drain waits for another message before calling the channel empty.
DEFAULT_DRAIN_TIMEOUT_MS = 1000
#: Upper bound of one batch read, so an endless topic cannot fill executor memory.
DEFAULT_MAX_MESSAGES = 10_000
_MAX_INT = 2**31 - 1

_NAME_RULE = "1-64 characters of [.a-zA-Z0-9_-], optionally ending in #ephemeral"

# Options Spark itself puts in a streaming sink's map; accepted and ignored.
_SPARK_SINK_KEYS = frozenset({"checkpointlocation"})


class OptionError(ValueError):
    """An option of the ``nsq`` data source is missing, unknown or malformed.

    ``option`` is the documented (camelCase) name of the offending option.
    """

    def __init__(self, option: str, problem: str):
        self.option = option
        self.problem = problem
        super().__init__(f"nsq data source: option '{option}' {problem}")


def parse_addresses(option: str, value: str) -> tuple[Address, ...]:
    """Parse a comma-separated list of ``host:port`` (or ``[v6]:port``) addresses.

    Raises :class:`OptionError` naming ``option`` when the list is empty or an
    entry lacks a host or a port in 1..65535.
    """
    addresses = []
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise OptionError(option, f"must be a comma-separated list of host:port, got '{item}'")
        addresses.append(Address(host, int(port)))
    if not addresses:
        kind = "nsqlookupd HTTP" if option == "lookupd" else "nsqd"
        raise OptionError(option, f"must name at least one {kind} address (host:port)")
    return tuple(dict.fromkeys(addresses))


def _name(option: str, value: str) -> str:
    name = value.strip()
    if not is_valid_name(name):
        raise OptionError(option, f"has an invalid name '{value}' ({_NAME_RULE})")
    return name


def _names(option: str, value: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(_name(option, part) for part in value.split(",") if part.strip()))
    if not names:
        raise OptionError(option, "must name at least one topic")
    return names


def _integer(low: int, high: int) -> Callable[[str, str], int]:
    def parse(option: str, value: str) -> int:
        text = value.strip()
        if not re.fullmatch(r"[0-9]+", text) or not low <= int(text) <= high:
            raise OptionError(option, f"must be an integer in {low}..{high}, got '{value}'")
        return int(text)

    return parse


# Every option: its parser, and its default (``_REQUIRED`` when it has none).
_REQUIRED = object()
_SPECS: dict[str, tuple[Callable[[str, str], object], object]] = {
    "nsqd": (parse_addresses, _REQUIRED),
    "lookupd": (parse_addresses, ()),
    "topic": (_names, _REQUIRED),
    "channel": (_name, _REQUIRED),
    "maxMessagesPerTrigger": (_integer(1, _MAX_INT), None),
    "maxMessages": (_integer(1, _MAX_INT), DEFAULT_MAX_MESSAGES),
    "msgTimeoutMs": (_integer(MIN_MSG_TIMEOUT_MS, MAX_MSG_TIMEOUT_MS), DEFAULT_MSG_TIMEOUT_MS),
    "maxInFlight": (_integer(1, _MAX_IN_FLIGHT), DEFAULT_MAX_IN_FLIGHT),
    "drainTimeoutMs": (_integer(0, MAX_MSG_TIMEOUT_MS), DEFAULT_DRAIN_TIMEOUT_MS),
    "batchSize": (_integer(1, 1_000_000), DEFAULT_BATCH_SIZE),
    "defer": (_integer(0, MAX_DEFER_MS), 0),
}


def _parse(options: Mapping[str, str], kind: str, known: tuple[str, ...],
           optional: tuple[str, ...] = (), ignored: frozenset[str] = frozenset()) -> dict:
    """Parse ``options`` against the ``known`` names; ``optional`` ones may be missing
    even if their spec has no default. Returns values by documented name."""
    by_key = {name.lower(): name for name in known}
    given = {}
    for key, value in options.items():
        if key.lower() in ignored:
            continue
        if key.lower() not in by_key:
            raise OptionError(key, f"is unknown to the {kind} (known options: {', '.join(known)})")
        given[by_key[key.lower()]] = value
    if "lookupd" in given and given["lookupd"] is not None:
        if "nsqd" in given and given["nsqd"] is not None:
            raise OptionError("lookupd", "cannot be given with 'nsqd': name the nsqd nodes or the "
                                         "nsqlookupd instances that know them, not both")
        optional = (*optional, "nsqd")
    values = {}
    for name in known:
        parse, default = _SPECS[name]
        if name in given and given[name] is not None:
            values[name] = parse(name, given[name])
        elif default is _REQUIRED and name not in optional:
            if name == "nsqd" and "lookupd" in known:
                raise OptionError(name, "is required (or 'lookupd': nsqlookupd HTTP addresses to find the nsqd nodes by)")
            raise OptionError(name, "is required")
        else:
            values[name] = () if name == "nsqd" else None if default is _REQUIRED else default
    return values


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """Options of the streaming source (``spark.readStream.format("nsq")``)."""

    nsqd: tuple[Address, ...]
    topics: tuple[str, ...]
    channel: str
    max_messages_per_trigger: int | None = None
    msg_timeout_ms: int = DEFAULT_MSG_TIMEOUT_MS
    #: None when not given: each path has its own default (DEFAULT_MAX_IN_FLIGHT held on
    #: the driver, DEFAULT_LEASED_IN_FLIGHT leased per micro-batch).
    max_in_flight: int | None = None
    drain_timeout_ms: int = DEFAULT_DRAIN_TIMEOUT_MS
    #: nsqlookupd HTTP addresses to find the producers of the topics by (``nsqd`` is then empty)
    lookupd: tuple[Address, ...] = ()

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Validate ``options``; raises :class:`OptionError`."""
        v = _parse(options, "streaming source", (
            "nsqd", "topic", "channel", "maxMessagesPerTrigger", "msgTimeoutMs", "maxInFlight",
            "drainTimeoutMs", "lookupd"))
        given = any(key.lower() == "maxinflight" for key in options)
        return cls(v["nsqd"], v["topic"], v["channel"], v["maxMessagesPerTrigger"],
                   v["msgTimeoutMs"], v["maxInFlight"] if given else None, v["drainTimeoutMs"], v["lookupd"])


@dataclass(frozen=True, slots=True)
class BatchReadOptions:
    """Options of the batch reader (``spark.read.format("nsq")``)."""

    nsqd: tuple[Address, ...]
    topics: tuple[str, ...]
    channel: str
    max_messages: int = DEFAULT_MAX_MESSAGES
    msg_timeout_ms: int = DEFAULT_MSG_TIMEOUT_MS
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    drain_timeout_ms: int = DEFAULT_DRAIN_TIMEOUT_MS
    #: nsqlookupd HTTP addresses to find the producers of the topics by (``nsqd`` is then empty)
    lookupd: tuple[Address, ...] = ()

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> BatchReadOptions:
        """Validate ``options``; raises :class:`OptionError`."""
        v = _parse(options, "batch reader", (
            "nsqd", "topic", "channel", "maxMessages", "msgTimeoutMs", "maxInFlight",
            "drainTimeoutMs", "lookupd"))
        return cls(v["nsqd"], v["topic"], v["channel"], v["maxMessages"], v["msgTimeoutMs"],
                   v["maxInFlight"], v["drainTimeoutMs"], v["lookupd"])


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """Options of the sink and the batch writer (``df.write[Stream].format("nsq")``).

    ``topic`` is None when every row names its topic in a ``topic`` column.
    """

    nsqd: tuple[Address, ...]
    topic: str | None
    batch_size: int = DEFAULT_BATCH_SIZE
    defer_ms: int = 0
    #: nsqlookupd HTTP addresses whose nodes are published to (``nsqd`` is then empty)
    lookupd: tuple[Address, ...] = ()

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        """Validate ``options``; raises :class:`OptionError`."""
        v = _parse(options, "writer", ("nsqd", "topic", "batchSize", "defer", "lookupd"),
                   optional=("topic",), ignored=_SPARK_SINK_KEYS)
        topics = v["topic"]
        if topics is not None and len(topics) > 1:
            raise OptionError("topic", "must name one topic for a writer; route rows with a "
                                       "'topic' column instead")
        return cls(v["nsqd"], topics[0] if topics else None, v["batchSize"], v["defer"], v["lookupd"])


def check_read_options(options: Mapping[str, str]) -> None:
    """Check options meant for either reader, before Spark says which one it wants.

    Called when a DataFrame is defined (``load()``), so that a typo fails there
    rather than when the query starts; each reader checks its own set again.
    """
    _parse(options, "nsq readers", (
        "nsqd", "topic", "channel", "maxMessagesPerTrigger", "maxMessages", "msgTimeoutMs",
        "maxInFlight", "drainTimeoutMs", "lookupd"))
