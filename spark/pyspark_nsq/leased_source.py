"""The executor-side path of the streaming source, over pynsqd's lease extension.

The driver never holds a message. Planning asks each nsqd how many messages its
channel holds ready (``LEASE AVAILABLE``) and writes the plan into the end offset:
which nsqd and topic each partition reads from and how many messages. Each
partition's reader leases what it reads under a token derived from the query, the
batch, the partition and a random secret of this driver process
(:func:`~.lease_partition.lease_token`), on the executor.
``commit`` finishes the committed batch's tokens, one pipelined command per token;
a batch that is never committed has its leases expire after ``msgTimeoutMs``, and
the broker delivers those messages again (at least once).

An offset (:class:`~.lease_offset.LeaseOffset`) holds everything ``partitions``
needs but the secret, so a batch replayed from the checkpoint after a restart reads
from the same places, under new tokens: the leases the killed driver's tasks took
cannot be named by anyone, and come back after ``msgTimeoutMs`` (at least once, as
any crash). Spark hands offsets over as JSON objects; they are typed at the door.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid

from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows

from .consumer import LOOKUPD_POLL_INTERVAL_S
from .dial import client_name
from .discovery import DiscoveryError, topic_producers
from .lease_control import LeaseControl
from .lease_offset import LeaseOffset, PlannedRead
from .lease_partition import LeasePartition, lease_secret, lease_token
from .options import DEFAULT_LEASED_IN_FLIGHT, SourceOptions, parse_addresses
from .partitioning import Pair, allocate, split

__all__ = ["LeasedSource", "STREAM_DRIVER"]

#: The ``client_id`` of the driver's control connections.
STREAM_DRIVER = "stream driver"
#: How long ``stop`` waits for a TOUCH under way to be answered.
_STOP_WAIT_S = 10.0

_log = logging.getLogger(__name__)


class LeasedSource:
    """Plans and commits micro-batches of ``options`` through ``controls`` (one per pair).

    Owns the control connections and a daemon thread that TOUCHes the leases of the
    batch in progress every half ``msgTimeoutMs``, so that a batch may run longer
    than that (up to the broker's ``--max-msg-timeout``); ``stop`` ends both.
    """

    def __init__(self, options: SourceOptions, controls: dict[Pair, LeaseControl], control_token: str):
        self._options = options
        self._controls = controls
        self._control_token = control_token
        # with ``lookupd``: the pairs nsqlookupd listed last (planned from), and when it was asked
        self._active: set[Pair] = set(controls)
        self._last_lookup = time.monotonic()
        self._query = uuid.uuid4().hex[:12]
        self._secret = lease_secret()  # in no offset: only this process can name its leases
        self._finished_through = -1
        self._last: LeaseOffset | None = None
        self._remaining: dict[Pair, int] | None = None
        self._stopping = threading.Event()
        self._toucher = threading.Thread(target=self._touch_in_progress, daemon=True,
                                         name=f"nsq-lease-touch-{options.channel}")
        self._toucher.start()

    def _touch_in_progress(self) -> None:
        interval = self._options.msg_timeout_ms / 2000
        while not self._stopping.wait(interval):
            last = self._last
            if last is None or last.batch <= self._finished_through:
                continue
            try:
                for pair, tokens in self._by_pair(last).items():
                    self._controls[pair].touch(tokens)
            except Exception as exc:  # the leases may then expire: duplicates, never loss
                _log.info("nsq source: could not touch the leases of batch %s: %s", last.batch, exc)

    def initial_offset(self) -> dict:
        """Nothing read yet."""
        return LeaseOffset(0, self._query, 0, ()).to_json()

    def prepare_available_now(self) -> None:
        """Read what the channels hold now, and no more."""
        self._remaining = {pair: control.available() for pair, control in self._controls.items()}

    def latest_offset(self, start: dict, limit: ReadLimit) -> dict:
        """Finish the batch ending at ``start`` (committed), then plan the next one."""
        begin = LeaseOffset.from_json(start)
        self._query = begin.query or self._query
        self._finish(begin)
        if self._options.lookupd and time.monotonic() - self._last_lookup >= LOOKUPD_POLL_INTERVAL_S:
            self._look_up_producers()
        budget = self._options.max_in_flight or DEFAULT_LEASED_IN_FLIGHT
        if isinstance(limit, ReadMaxRows):
            budget = min(budget, limit.max_rows)
        available = {pair: control.available() for pair, control in self._controls.items()
                     if pair in self._active}
        if self._remaining is not None:
            available = {pair: min(count, self._remaining.get(pair, 0)) for pair, count in available.items()}
        take = allocate(available, budget)
        if not sum(take.values()):
            return start  # the same offset: Spark runs no batch
        if self._remaining is not None:
            for pair, count in take.items():
                self._remaining[pair] -= count
        reads = tuple(PlannedRead(str(address), topic, size)
                      for (address, topic), count in take.items() if count
                      for size in split(count))
        end = LeaseOffset(begin.offset + sum(take.values()), self._query, begin.batch + 1, reads)
        self._last = end
        return end.to_json()

    def _look_up_producers(self) -> None:
        """Plan from the producers nsqlookupd lists now: read nodes that started producing a
        topic, stop planning reads from nodes it no longer lists (their controls stay open
        to finish leases already taken)."""
        self._last_lookup = time.monotonic()
        try:
            found = {(address, topic) for topic in self._options.topics
                     for address in topic_producers(self._options.lookupd, topic)}
        except DiscoveryError as exc:
            _log.warning("%s; the known nodes are kept", exc)
            return
        controls = dict(self._controls)
        for address, topic in sorted(found - set(controls), key=str):
            control = LeaseControl(address, topic, self._options.channel, self._control_token, STREAM_DRIVER)
            try:
                leases = control.offers_leases
            except Exception as exc:  # asked again at the next lookup
                control.close()
                _log.warning("nsq source: %s produces %s but cannot be reached: %s", address, topic, exc)
                found.discard((address, topic))
                continue
            if not leases:
                control.close()
                _log.warning("nsq source: %s produces %s but offers no leases (a pynsqd extension); "
                             "this query does not read it", address, topic)
                found.discard((address, topic))
                continue
            _log.info("nsq source: %s produces %s; reading it", address, topic)
            controls[(address, topic)] = control
        self._controls = controls  # replaced whole: the touching thread reads it
        self._active = found

    def partitions(self, start: dict, end: dict) -> list[LeasePartition]:
        """One partition per planned read of ``end``, each with its own lease token."""
        return self._partitions(LeaseOffset.from_json(end))

    def _partitions(self, end: LeaseOffset) -> list[LeasePartition]:
        if end.query is None:
            raise ValueError(f"nsq source: offset {end.to_json()} names no query to read for")
        return [
            LeasePartition(parse_addresses("nsqd", read.nsqd)[0], read.topic, read.count,
                           lease_token(end.query, end.batch, index, self._secret),
                           client_name("stream", end.query, "batch", end.batch, "partition", index))
            for index, read in enumerate(end.reads)
        ]

    def commit(self, end: dict) -> None:
        """Finish every message leased for the batch that ends at ``end``."""
        self._finish(LeaseOffset.from_json(end))

    def _by_pair(self, offset: LeaseOffset) -> dict[Pair, list[str]]:
        tokens: dict[Pair, list[str]] = {}
        for partition in self._partitions(offset):
            tokens.setdefault((partition.address, partition.topic), []).append(partition.token)
        return tokens

    def _finish(self, offset: LeaseOffset) -> None:
        if offset.query is None or offset.batch <= self._finished_through:
            return
        finished = 0
        for pair, tokens in self._by_pair(offset).items():
            control = self._controls.get(pair)
            if control is not None:
                finished += control.finish(tokens)
        self._finished_through = offset.batch
        _log.info("nsq source: batch %s committed, %d leased messages finished (%d planned)",
                  offset.batch, finished, offset.planned)

    def stop(self) -> None:
        """Give back the leases of a planned batch never committed; close the connections."""
        self._stopping.set()
        if self._toucher is not threading.current_thread():
            self._toucher.join(_STOP_WAIT_S)
        last = self._last
        try:
            if last is not None and last.batch > self._finished_through:
                for pair, tokens in self._by_pair(last).items():
                    self._controls[pair].requeue(tokens)
        except Exception as exc:  # the leases then expire: redelivered after msgTimeoutMs
            _log.info("nsq source: could not give back the last batch's leases: %s", exc)
        finally:
            for control in self._controls.values():
                control.close()
