"""The batch reader: drain what a channel holds now into a DataFrame.

On pynsqd, the driver asks each channel how many messages it holds
(``LEASE AVAILABLE``) and splits ``maxMessages`` over partitions as the streaming
source does; each partition leases what it reads and finishes it once Spark has
taken its last record batch (see :mod:`.lease_partition`).

On nsqd, one Spark partition per (nsqd, topic); with ``lookupd``, per producer of each topic. Each task subscribes, takes messages up to
its RDY window, hands them to Spark as a record batch and FINs them once Spark has
taken the batch, then takes the next window, until ``maxMessages`` are read or no
message arrives for ``drainTimeoutMs``. Reading consumes: a DataFrame computed
twice drains twice, so cache it when it is used more than once.

Either way the connections ask for priorities; the ``priority`` column is null for
the messages of a broker that does not send them (nsqd).
"""

from __future__ import annotations

import time
import uuid

from pyspark.sql.datasource import DataSourceReader, InputPartition

from broker.client import FramePump, stop_delivery
from broker.protocol import FRAME_TYPE_MESSAGE, encode_fin, encode_rdy, encode_sub
from broker.protocol.priorities import PRIORITIES_IDENTIFY_FIELD

from .dial import CONNECT_TIMEOUT_S, client_name, dial
from .discovery import topic_producers
from .lease_control import LeaseControl
from .lease_partition import LeasePartition, lease_secret, lease_token
from .options import MAX_RDY_COUNT, Address, BatchReadOptions
from .partitioning import allocate, split
from .schema import MessageColumns

__all__ = ["NsqBatchReader", "DrainPartition"]


class DrainPartition(InputPartition):
    """Which topic to drain from which nsqd, and how many messages at most."""

    def __init__(self, address: Address, topic: str, max_messages: int):
        super().__init__(None)
        self.address = address
        self.topic = topic
        self.max_messages = max_messages


class NsqBatchReader(DataSourceReader):
    """Reads ``options.topics`` through ``options.channel`` once, FIN'ing what it reads."""

    def __init__(self, options: BatchReadOptions):
        self._options = options

    def partitions(self) -> list[InputPartition]:
        """Leased partitions sized by what each channel holds, or one per nsqd and topic
        (nsqd), sharing ``maxMessages`` between them.

        With ``lookupd``, the nsqd nodes are each topic's producers as nsqlookupd lists
        them now; raises :class:`~pyspark_nsq.discovery.DiscoveryError` if no lookupd answers.
        """
        options = self._options
        if options.lookupd:
            pairs = [(a, t) for t in options.topics for a in topic_producers(options.lookupd, t)]
            if not pairs:  # no node has the topics yet: nothing to read
                return []
        else:
            pairs = [(a, t) for a in options.nsqd for t in options.topics]
        leased = self._leased_partitions(pairs)
        if leased is not None:
            return leased
        share, extra = divmod(self._options.max_messages, len(pairs))
        return [
            DrainPartition(address, topic, share + (1 if index < extra else 0))
            for index, (address, topic) in enumerate(pairs)
            if share or index < extra
        ]

    def _leased_partitions(self, pairs: list[tuple[Address, str]]) -> list[InputPartition] | None:
        """None unless every nsqd offers leases."""
        query = uuid.uuid4().hex[:12]
        controls = [LeaseControl(address, topic, self._options.channel, f"{query}.control", "read driver")
                    for address, topic in pairs]
        try:
            if not all(control.offers_leases for control in controls):
                return None
            available = {(c.address, c.topic): c.available() for c in controls}
        finally:
            for control in controls:
                control.close()
        take = allocate(available, self._options.max_messages)
        sizes = [(pair, size) for pair, count in take.items() if count for size in split(count)]
        secret = lease_secret()
        return [LeasePartition(address, topic, size, lease_token(query, 0, index, secret),
                               client_name("read", query, "partition", index))
                for index, ((address, topic), size) in enumerate(sizes)]

    def read(self, partition: InputPartition):
        """Record batches of drained messages; each window is FIN'd after Spark takes it."""
        options = self._options
        if isinstance(partition, LeasePartition):
            yield from partition.read(options.channel, options.msg_timeout_ms,
                                      options.drain_timeout_ms, finish=True)
            return
        if not isinstance(partition, DrainPartition):
            return  # Spark's stand-in when there is nothing to read: InputPartition(None)
        conn = dial(partition.address, {"msg_timeout": options.msg_timeout_ms, PRIORITIES_IDENTIFY_FIELD: True},
                    client_name("read", partition.topic, "from", partition.address))
        try:
            window = min(options.max_in_flight, partition.max_messages, MAX_RDY_COUNT)
            max_rdy = conn.identity.get("max_rdy_count")
            if isinstance(max_rdy, int) and max_rdy > 0:
                window = min(window, max_rdy)
            conn.send(encode_sub(partition.topic, options.channel))
            conn.read_response(CONNECT_TIMEOUT_S)
            remaining = partition.max_messages
            idle_s = options.drain_timeout_ms / 1000
            while remaining > 0:
                count = min(window, remaining)
                conn.send(encode_rdy(count))
                columns = _receive(conn, partition, count, idle_s)
                if not len(columns):
                    break
                yield columns.to_arrow()
                conn.send(b"".join(encode_fin(m.encode("ascii")) for m in columns.ids))
                remaining -= len(columns)
                if len(columns) < count:
                    break
            # everything read was FIN'd; what nsqd sent meanwhile is given back
            stop_delivery(conn, timeout=CONNECT_TIMEOUT_S)
        finally:
            conn.close()


def _receive(conn: FramePump, partition: DrainPartition, count: int,
             idle_s: float) -> MessageColumns:
    """Up to ``count`` messages, stopping once none arrives for ``idle_s``.

    A non-fatal error frame (``E_FIN_FAILED``: the message timed out and went to
    another consumer) is passed over; the pump raises the fatal ones.
    """
    columns = MessageColumns()
    nsqd = str(partition.address)
    prioritised = conn.identity.get(PRIORITIES_IDENTIFY_FIELD) is True
    deadline = time.monotonic() + idle_s
    while len(columns) < count:
        frames = conn.read(max(0.0, deadline - time.monotonic()))
        if not frames:
            break
        for frame_type, payload in frames:
            if frame_type == FRAME_TYPE_MESSAGE:
                columns.append_frame(payload, partition.topic, nsqd, prioritised)
        deadline = time.monotonic() + idle_s
    return columns
