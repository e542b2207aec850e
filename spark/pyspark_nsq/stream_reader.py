"""The streaming source: at-least-once consumption of nsq channels.

Spark calls ``initialOffset``, ``latestOffset``, ``partitions``, ``commit`` and
``stop`` in one long-lived Python process on the driver, and ``read`` in executor
processes on a separately unpickled copy of this object. Which of two paths does
the work is decided on the first call, by asking every nsqd for a lease:

- pynsqd offers its lease extension, and the executors read
  (:mod:`.leased_source`): input partitions say where to read and how much, and the
  driver never touches a message;
- nsqd does not, and the driver holds the messages (:mod:`.held_source`), as it
  must for nsqd to accept their FINs. The log says so once.
"""

from __future__ import annotations

import logging
import signal
import threading
import uuid

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from .discovery import topic_producers
from .held_source import HeldSource, MessagePartition
from .lease_control import LeaseControl
from .lease_partition import LeasePartition
from .leased_source import STREAM_DRIVER, LeasedSource
from .options import Address, SourceOptions

__all__ = ["NsqStreamReader"]

_log = logging.getLogger(__name__)


def source_pairs(options: SourceOptions) -> list[tuple[Address, str]]:
    """Every (nsqd, topic) to read: the ``nsqd`` option's, or each topic's producers as
    nsqlookupd lists them now (raises :class:`~.discovery.DiscoveryError` when none answers)."""
    if options.lookupd:
        return [(address, topic) for topic in options.topics
                for address in topic_producers(options.lookupd, topic)]
    return [(address, topic) for address in options.nsqd for topic in options.topics]


def open_source(options: SourceOptions) -> LeasedSource | HeldSource:
    """The leased path when every nsqd offers leases, else the driver-side path.

    Raises :class:`~broker.client.NsqError` when an nsqd cannot be reached.
    """
    token = f"{uuid.uuid4().hex[:12]}.control"
    controls = {(address, topic): LeaseControl(address, topic, options.channel, token, STREAM_DRIVER)
                for address, topic in source_pairs(options)}
    try:
        without = [str(c.address) for c in controls.values() if not c.offers_leases]
    except BaseException:
        for control in controls.values():
            control.close()
        raise
    if not without:
        _log.warning("nsq source: the brokers offer leases; executors read the messages")
        return LeasedSource(options, controls, token)
    for control in controls.values():
        control.close()
    _log.warning("nsq source: nsqd %s offers no leases (a pynsqd extension); messages pass "
                 "through the driver, which does not scale past one process",
                 ", ".join(sorted(set(without))))
    return HeldSource(options)


class NsqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Reads ``options.topics`` through ``options.channel`` on every nsqd listed.

    Connections open on first use and close in ``stop``.
    """

    def __init__(self, options: SourceOptions):
        self._options = options
        self._source: LeasedSource | HeldSource | None = None

    def __getstate__(self):
        # Executors need the options only; sockets and threads stay on the driver.
        return self._options

    def __setstate__(self, options):
        self.__init__(options)  # type: ignore[misc]  # rebuild the driver-side state from the options

    # -- driver side ---------------------------------------------------------

    def _open(self) -> LeasedSource | HeldSource:
        if self._source is None:
            self._source = open_source(self._options)
            _stop_on_sigterm()
        return self._source

    def initialOffset(self) -> dict:
        """The offset before anything is read (subscribing first, so messages are kept)."""
        return self._open().initial_offset()

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxMessagesPerTrigger`` as a row limit, else everything available."""
        limit = self._options.max_messages_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        """Read only what is there now, until none of it is left."""
        self._open().prepare_available_now()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """Settle what Spark committed below ``start``, then plan the next batch."""
        return self._open().latest_offset(start, limit)

    def partitions(self, start: dict, end: dict):
        """The input partitions of the batch ``[start, end)``."""
        return self._open().partitions(start, end)

    def commit(self, end: dict) -> None:
        """Spark has committed everything up to ``end``: settle it with the brokers."""
        if self._source is not None:
            self._source.commit(end)

    def stop(self) -> None:
        """Close the connections; messages not yet committed go back to the brokers."""
        if self._source is not None:
            self._source.stop()
            self._source = None

    # -- executor side -------------------------------------------------------

    def read(self, partition: InputPartition):
        """The partition's messages as Arrow record batches."""
        if isinstance(partition, LeasePartition):
            options = self._options
            return partition.read(options.channel, options.msg_timeout_ms, options.drain_timeout_ms)
        if isinstance(partition, MessagePartition):
            return partition.read()
        return iter(())  # Spark's stand-in when there is nothing to read: InputPartition(None)


def _stop_on_sigterm() -> None:
    """Make SIGTERM unwind the driver-side source process instead of killing it.

    Spark ends that process with SIGTERM when a query stops, without calling
    ``stop``. Raised as SystemExit, the signal runs the runner's own cleanup,
    which calls ``stop``: messages not committed go back at once instead of
    only after msg_timeout. A handler someone else installed is left alone.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def exit_on_sigterm(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, exit_on_sigterm)
