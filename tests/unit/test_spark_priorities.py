"""The Spark connector's priorities, without Spark: the sink's ``priority`` column and the
source's, a pynsqd extension (:mod:`broker.protocol.priorities`).

The publisher talks to the fake broker of :mod:`tests.unit.test_spark_keys`, which answers
``priorities`` in IDENTIFY as pynsqd does or leaves it out as nsqd does. The readers
(a subscription of the streaming source on nsqd, the batch reader's drain) take their
messages from :class:`MessageServer`, a fake that serves message frames on a plain socket,
with each body's priority in front of it when the connection negotiated priorities.
"""

from __future__ import annotations

import json
import pickle
import socket
import struct
from dataclasses import dataclass, field

import pyarrow as pa
import pytest
from pyspark.sql.types import (
    BinaryType,
    ByteType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
)

from broker.protocol import CLOSE_WAIT_FRAME, MAGIC_V2, OK_FRAME, encode_message_frame, encode_response
from broker.protocol.keys import prefix_key
from broker.protocol.priorities import MAX_PRIORITY, prefix_priority
from pyspark_nsq import SOURCE_SCHEMA
from pyspark_nsq.batch_reader import DrainPartition, NsqBatchReader
from pyspark_nsq.options import BatchReadOptions, SinkOptions
from pyspark_nsq.publisher import MAX_MPUB_BYTES, Publisher
from pyspark_nsq.schema import ARROW_SCHEMA, MessageColumns, check_sink_schema, check_source_schema, priority_column
from pyspark_nsq.subscription import Message, Subscription, decode
from pyspark_nsq.writer import PublishReceipt, publish_batches
from tests.support.fake_nsqd import FakeBroker, ThreadedPeer, publish, read_sized
from tests.support.waiting import wait_sync

_SIZE = struct.Struct(">I")
#: pynsqd's --default-priority unless told otherwise.
DEFAULT = 1 << 31
#: How long a test waits for a subscription's thread to take what the fake sent.
WAIT_S = 10.0


@pytest.fixture
def broker():
    fake = FakeBroker(default_priority=1000)
    yield fake
    fake.close()


# -- the schemas -------------------------------------------------------------------


def test_the_read_schema_ends_with_a_nullable_bigint_priority():
    assert [f.name for f in SOURCE_SCHEMA.fields] == ["id", "timestamp", "attempts", "body", "topic", "nsqd",
                                                      "priority"]
    assert SOURCE_SCHEMA.fields[-1] == StructField("priority", LongType(), nullable=True)
    assert ARROW_SCHEMA.names == SOURCE_SCHEMA.names and ARROW_SCHEMA.field("priority").type == pa.int64()
    check_source_schema(SOURCE_SCHEMA)
    with pytest.raises(ValueError, match="the schema is fixed"):
        check_source_schema(StructType(SOURCE_SCHEMA.fields[:-1]))


@pytest.mark.parametrize("kind", [ByteType(), ShortType(), IntegerType(), LongType()])
def test_a_priority_column_of_any_integer_type_is_found(kind):
    body = StructField("body", BinaryType())
    assert priority_column(StructType([body])) is None
    assert priority_column(StructType([body, StructField("Priority", kind)])) == 1
    assert check_sink_schema(StructType([StructField("priority", kind), body]), "t") == (1, None)


@pytest.mark.parametrize(("kind", "name"), [(StringType(), "string"), (DoubleType(), "double"),
                                            (DecimalType(10, 0), "decimal(10,0)")])
def test_a_priority_column_of_another_type_fails_at_write_start(kind, name):
    schema = StructType([StructField("body", StringType()), StructField("priority", kind)])
    with pytest.raises(ValueError) as caught:
        check_sink_schema(schema, "t")
    assert str(caught.value) == ("nsq data source: column 'priority' must be an integer (tinyint, smallint, "
                                 f"int or bigint; 0 to 4294967295), got {name}")


# -- the publisher -------------------------------------------------------------------


def test_each_message_carries_its_priority_and_a_null_one_the_brokers_default(broker):
    publisher = publish([broker.address], "t", [b"a", b"b", b"c"], priorities=[0, None, MAX_PRIORITY], prioritised=True)
    assert broker.identifies[0]["priorities"] is True and "publish_keys" not in broker.identifies[0]
    assert broker.commands[0].raw == [b"\x00\x00\x00\x00a", b"\x00\x00\x03\xe8b", b"\xff\xff\xff\xffc"]
    assert publisher.published == 3


def test_a_prioritised_publisher_given_no_priorities_sends_the_default_for_each(broker):
    publish([broker.address], "t", [b"a", b"b"], prioritised=True)
    assert broker.commands[0].raw == [prefix_priority(1000, b"a"), prefix_priority(1000, b"b")]


def test_with_keys_the_priority_comes_after_the_key(broker):
    bodies, keys = [b"a", b"b", b"c"], [b"k1", None, b"k1"]
    publisher = publish([broker.address], "t", bodies, priorities=[5, 6, None], keys=keys, prioritised=True)
    assert broker.identifies[0]["publish_keys"] is True and broker.identifies[0]["priorities"] is True
    assert broker.commands[0].raw == [prefix_key(b"k1", prefix_priority(5, b"a")),
                                      prefix_key(None, prefix_priority(6, b"b")),
                                      prefix_key(b"k1", prefix_priority(1000, b"c"))]
    assert (publisher.published, publisher.duplicates) == (3, 1)


def test_deferred_messages_carry_their_priority_one_dpub_each(broker):
    publisher = Publisher([broker.address], batch_size=100, defer_ms=10, prioritised=True)
    try:
        publisher.publish("t", [b"a", b"b"], priorities=[7, None])
        publisher.flush()
    finally:
        publisher.close()
    assert [(c.name, c.raw) for c in broker.commands] == [(b"DPUB", [prefix_priority(7, b"a")]),
                                                         (b"DPUB", [prefix_priority(1000, b"b")])]


def test_without_priorities_the_identify_and_the_bytes_are_unchanged(broker):
    publisher = Publisher([broker.address], batch_size=100)
    try:
        publisher.publish("t", [b"a"])
        publisher.flush()
        with pytest.raises(ValueError, match="priorities given to a publisher made without prioritised=True"):
            publisher.publish("t", [b"a"], priorities=[1])
    finally:
        publisher.close()
    assert "priorities" not in broker.identifies[0]
    assert broker.commands[0].raw == [b"a"]


@pytest.mark.parametrize("priority", [-1, MAX_PRIORITY + 1])
def test_a_priority_out_of_range_fails_naming_it_before_anything_is_sent(broker, priority):
    with pytest.raises(ValueError) as caught:
        publish([broker.address], "t", [b"a", b"b"], priorities=[1, priority], prioritised=True)
    assert str(caught.value) == f"nsq data source: a 'priority' must be 0 to 4294967295 or null, got {priority}"
    assert broker.commands == []


def test_an_mpub_is_cut_with_the_priorities_counted_in_its_size(broker):
    quarter = MAX_MPUB_BYTES // 4 - 4  # four bodies of this size (and their sizes) fill an MPUB
    publish([broker.address], "t", [b"x" * quarter] * 4, batch_size=10, prioritised=True)
    publish([broker.address], "t", [b"x" * (quarter - 4)] * 4, batch_size=10, prioritised=True)
    assert [len(c.raw) for c in broker.commands] == [3, 1, 4]


def test_nsqd_without_priorities_is_refused_with_its_address_before_anything_is_sent():
    nsqd = FakeBroker(offers_priorities=False)
    try:
        with pytest.raises(ValueError) as caught:
            publish([nsqd.address], "t", [b"a"], priorities=[1], prioritised=True)
        with pytest.raises(ValueError, match="the 'priority' column needs prioritised messages"):
            publish([nsqd.address], "t", [b"a"], priorities=[1], keys=[b"k"], prioritised=True)  # keyed publishes alone are not enough
    finally:
        nsqd.close()
    assert str(caught.value) == (f"nsq data source: the 'priority' column needs prioritised messages, which "
                                 f"{nsqd.address} does not offer (nsqd has none; pynsqd has them)")
    assert nsqd.commands == []


# -- the writer ----------------------------------------------------------------------


def write(broker, frame: pa.RecordBatch, topic="t", priority_type=LongType()) -> PublishReceipt:
    """Publish ``frame`` as a task of a write of a DataFrame with its columns does."""
    types = {"body": BinaryType(), "topic": StringType(), "key": StringType(), "priority": priority_type}
    schema = StructType([StructField(name, types[name]) for name in frame.schema.names])
    return publish_batches(SinkOptions((broker.address,), topic), schema, iter([frame]))


def test_the_writer_publishes_each_row_with_its_priority_per_topic(broker):
    frame = pa.RecordBatch.from_pydict({
        "topic": ["x", None, "x", None], "body": [b"1", b"2", b"3", b"4"],
        "priority": pa.array([3, None, 0, 4294967295], pa.int64())})
    assert write(broker, frame, topic="y") == PublishReceipt(0, 4, 0)
    raw = {c.topic: c.raw for c in broker.commands}
    assert raw == {"x": [prefix_priority(3, b"1"), prefix_priority(0, b"3")],
                   "y": [prefix_priority(1000, b"2"), prefix_priority(MAX_PRIORITY, b"4")]}


def test_the_writer_takes_a_smallint_priority_with_a_key(broker):
    frame = pa.RecordBatch.from_pydict({"body": [b"a", b"b"], "key": ["k", None],
                                        "priority": pa.array([None, 2], pa.int16())})
    assert write(broker, frame, priority_type=ShortType()) == PublishReceipt(0, 2, 0)
    assert broker.commands[0].raw == [b"\x01k" + prefix_priority(1000, b"a"), b"\x00" + prefix_priority(2, b"b")]


def test_the_writer_fails_the_task_naming_a_negative_priority(broker):
    frame = pa.RecordBatch.from_pydict({"body": [b"a"], "priority": pa.array([-5], pa.int64())})
    with pytest.raises(ValueError, match="a 'priority' must be 0 to 4294967295 or null, got -5"):
        write(broker, frame)


# -- the readers -----------------------------------------------------------------------

_ID = b"0123456789abcdef"
_TIMESTAMP_NS = 1_700_000_000_123_456_789


def test_a_prioritised_frame_gives_its_priority_and_the_body_after_it():
    prioritised = encode_message_frame(_TIMESTAMP_NS, 1, _ID, prefix_priority(7, b"body"))[8:]
    plain = encode_message_frame(_TIMESTAMP_NS, 2, _ID, b"\x00\x00\x00\x07body")[8:]
    columns = MessageColumns()
    columns.append_frame(prioritised, "t", "n", prioritised=True)
    columns.append_frame(plain, "t", "n")
    columns.append(_ID, _TIMESTAMP_NS, 3, b"held", "t", "n", DEFAULT)
    batch = pickle.loads(pickle.dumps(columns)).to_arrow()
    assert batch.schema == ARROW_SCHEMA
    assert batch.column("body").to_pylist() == [b"body", b"\x00\x00\x00\x07body", b"held"]
    assert batch.column("priority").to_pylist() == [7, None, DEFAULT]
    assert batch.column("attempts").to_pylist() == [1, 2, 3]

    assert decode(prioritised, True) == Message(_TIMESTAMP_NS, 1, _ID, b"body", 7)
    assert decode(plain, False) == Message(_TIMESTAMP_NS, 2, _ID, b"\x00\x00\x00\x07body", None)


def test_a_prioritised_frame_too_short_for_a_priority_is_refused():
    short = encode_message_frame(_TIMESTAMP_NS, 1, _ID, b"abc")[8:]
    with pytest.raises(ValueError, match="a message frame of 29 bytes on a prioritised connection has no room"):
        MessageColumns().append_frame(short, "t", "n", prioritised=True)
    with pytest.raises(ValueError, match="a priority takes 4 bytes"):
        decode(short, True)


@dataclass
class MessageServer(ThreadedPeer):
    """Serves ``messages`` (body, priority) to the connections it accepts, one after another,
    on 127.0.0.1: IDENTIFY (answering ``priorities`` when asked, unless ``offers_priorities``
    is false, as nsqd), SUB, as many messages as RDY allows, FIN, REQ, CLS."""

    messages: list[tuple[bytes, int]]
    offers_priorities: bool = True
    identifies: list[dict] = field(default_factory=list)
    finished: list[bytes] = field(default_factory=list)

    def __post_init__(self):
        self.start_serving()

    def converse(self, conn: socket.socket, reader) -> None:
        assert reader.read(4) == MAGIC_V2
        prioritised = False
        waiting = list(enumerate(self.messages))
        while line := reader.readline():
            name, *params = line.rstrip(b"\n").split(b" ")
            if name == b"IDENTIFY":
                asked = json.loads(read_sized(reader))
                self.identifies.append(asked)
                prioritised = self.offers_priorities and asked.get("priorities") is True
                answer = {"max_rdy_count": 2500, "msg_timeout": 60000,
                          **({"priorities": True, "default_priority": DEFAULT} if prioritised else {})}
                conn.sendall(encode_response(json.dumps(answer).encode()))
            elif name == b"SUB":
                conn.sendall(OK_FRAME)
            elif name == b"RDY":
                sent, waiting = waiting[:int(params[0])], waiting[int(params[0]):]
                conn.sendall(b"".join(
                    encode_message_frame(_TIMESTAMP_NS, 1, b"%016d" % index,
                                         prefix_priority(priority, body) if prioritised else body)
                    for index, (body, priority) in sent))
            elif name == b"FIN":
                self.finished.append(params[0])
            elif name == b"CLS":
                conn.sendall(CLOSE_WAIT_FRAME)
            elif name not in (b"REQ", b"TOUCH", b"NOP"):
                raise AssertionError(f"unexpected command {line!r}")


MESSAGES = [(b"first", 5), (b"second", DEFAULT), (b"third", 0)]


@pytest.fixture
def message_server():
    servers: list[MessageServer] = []

    def start(offers_priorities: bool = True) -> MessageServer:
        servers.append(MessageServer(MESSAGES, offers_priorities))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.mark.parametrize("offers", [True, False], ids=["pynsqd", "nsqd"])
def test_a_subscription_asks_for_priorities_and_cuts_them_off_when_granted(message_server, offers):
    server = message_server(offers)
    subscription = Subscription(server.address, "t", "c", max_in_flight=10, msg_timeout_ms=60000)
    subscription.start()
    try:
        # the subscription's own thread fills the inbox
        wait_sync(lambda: len(subscription.inbox) >= len(MESSAGES), WAIT_S, poll=0.01)
        received = list(subscription.inbox)
    finally:
        subscription.close()
    assert server.identifies[0]["priorities"] is True
    assert subscription.prioritised is offers
    assert [(m.body, m.priority) for m in received] == [
        (body, priority if offers else None) for body, priority in MESSAGES]


@pytest.mark.parametrize("offers", [True, False], ids=["pynsqd", "nsqd"])
def test_the_batch_readers_drain_fills_the_priority_column_or_leaves_it_null(message_server, offers):
    server = message_server(offers)
    options = BatchReadOptions.parse({"nsqd": str(server.address), "topic": "t", "channel": "c",
                                      "maxMessages": str(len(MESSAGES))})
    batches = list(NsqBatchReader(options).read(DrainPartition(server.address, "t", len(MESSAGES))))
    rows = pa.Table.from_batches(batches)
    assert server.identifies[0]["priorities"] is True
    assert rows.column("body").to_pylist() == [body for body, _ in MESSAGES]
    assert rows.column("priority").to_pylist() == [priority if offers else None for _, priority in MESSAGES]
    assert len(server.finished) == len(MESSAGES)
