"""The Spark sink's keyed publishes (the ``key`` column), against a fake broker in a thread
(:class:`tests.support.fake_nsqd.FakeBroker`): the publisher's counts, its refusal of nsqd and
its resend after a lost connection, checked byte for byte without Spark."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql.types import BinaryType, IntegerType, StringType, StructField, StructType

from broker.protocol.keys import MAX_KEY_LENGTH
from pyspark_nsq.options import SinkOptions
from pyspark_nsq.publisher import MAX_MPUB_BYTES
from pyspark_nsq.schema import check_sink_schema, key_column
from pyspark_nsq.writer import PublishReceipt, publish_batches
from tests.support.fake_nsqd import FakeBroker, publish


@pytest.fixture
def broker():
    fake = FakeBroker()
    yield fake
    fake.close()


# -- the publisher ---------------------------------------------------------------


def test_keyed_messages_carry_their_key_and_a_repeated_key_is_stored_once(broker):
    bodies = [b"body-%d" % i for i in range(250)]
    keys = [b"key-%d" % i for i in range(250)]
    first = publish([broker.address], "t", bodies, keys)
    assert (first.published, first.duplicates) == (250, 0)
    assert broker.identifies[0]["publish_keys"] is True
    assert [len(c.raw) for c in broker.commands] == [100, 100, 50]
    assert broker.commands[0].raw[7] == bytes((len(b"key-7"),)) + b"key-7" + b"body-7"

    # the same keys again, and new ones between them: only the new ones are stored
    again = publish([broker.address], "t", [b"again"] * 250 + [b"new"] * 10, keys + [b"new-%d" % i for i in range(10)])
    assert (again.published, again.duplicates) == (260, 250)
    assert broker.bodies("t") == bodies + [b"new"] * 10


def test_null_keys_go_unkeyed_with_a_zero_length_byte(broker):
    publisher = publish([broker.address], "t", [b"a", b"b", b"a"], [None, b"k", None])
    assert broker.commands[0].raw == [b"\x00a", b"\x01kb", b"\x00a"]
    assert (publisher.published, publisher.duplicates) == (3, 0)
    assert broker.bodies("t") == [b"a", b"b", b"a"]  # unkeyed messages are never duplicates


def test_a_keyed_publisher_given_no_keys_still_prefixes_every_message(broker):
    publish([broker.address], "t", [b"a", b"b"], keyed=True)
    assert broker.commands[0].raw == [b"\x00a", b"\x00b"]


def test_without_keys_the_identify_and_the_bytes_are_unchanged(broker):
    publisher = publish([broker.address], "t", [b"a", b"b"])
    assert "publish_keys" not in broker.identifies[0]
    assert broker.commands[0].raw == [b"a", b"b"]
    assert (publisher.published, publisher.duplicates) == (2, 0)


def test_deferred_keyed_messages_are_one_dpub_each_and_count_duplicates(broker):
    publish([broker.address], "t", [b"a"], [b"k"], defer_ms=10)
    again = publish([broker.address], "t", [b"a", b"b"], [b"k", b"l"], defer_ms=10)
    assert [c.name for c in broker.commands] == [b"DPUB"] * 3
    assert broker.commands[1].raw == [b"\x01ka"]
    assert (again.published, again.duplicates) == (2, 1)


@pytest.mark.parametrize(("key", "problem"), [(b"", "got an empty one"),
                                              (b"k" * (MAX_KEY_LENGTH + 1), "got 129 bytes")])
def test_an_empty_or_too_long_key_fails_before_anything_is_sent(broker, key, problem):
    with pytest.raises(ValueError, match=f"a 'key' must be 1 to 128 bytes .* or null, {problem}"):
        publish([broker.address], "t", [b"a", b"b"], [b"fine", key])
    assert broker.commands == []


def test_the_longest_key_is_published(broker):
    publish([broker.address], "t", [b"a"], [b"k" * MAX_KEY_LENGTH])
    assert broker.stored["t"] == [(b"k" * MAX_KEY_LENGTH, b"a")]


def test_an_mpub_is_cut_with_the_key_length_bytes_and_the_keys_counted_in_its_size(broker):
    quarter = MAX_MPUB_BYTES // 4 - 4  # four bodies of this size (and their sizes) fill an MPUB
    publish([broker.address], "plain", [b"x" * quarter] * 4, batch_size=10)
    publish([broker.address], "unkeyed", [b"x" * quarter] * 4, [None] * 4, batch_size=10)
    publish([broker.address], "unkeyed", [b"x" * (quarter - 1)] * 4, [None] * 4, batch_size=10)
    publish([broker.address], "keyed", [b"x" * (quarter - 1)] * 4, [b"k"] * 4, batch_size=10)
    assert [len(c.raw) for c in broker.commands] == [4, 3, 1, 4, 3, 1]


def test_nsqd_without_keyed_publishes_is_refused_with_its_address():
    nsqd = FakeBroker(offers_keys=False)
    try:
        with pytest.raises(ValueError) as caught:
            publish([nsqd.address], "t", [b"a"], [b"k"])
        # the unkeyed publisher goes on as before
        publish([nsqd.address], "t", [b"a"])
    finally:
        nsqd.close()
    assert str(caught.value) == (f"nsq data source: the 'key' column needs keyed publishes, which {nsqd.address} "
                                 "does not offer (nsqd has none; pynsqd has them)")
    assert [c.raw for c in nsqd.commands] == [[b"a"]]


def test_a_resend_after_a_lost_connection_goes_to_the_same_broker_which_drops_what_it_stored():
    # the first MPUB is stored, then the connection drops before its answer: the publisher
    # resends it (and the rest), to the same broker although another is listed next
    first, other = FakeBroker(drop_after=1), FakeBroker()
    try:
        bodies = [b"m-%d" % i for i in range(30)]
        publisher = publish([first.address, other.address], "t", bodies, [b"k-%d" % i for i in range(30)],
                            batch_size=10)
    finally:
        first.close()
        other.close()
    assert (publisher.published, publisher.duplicates) == (30, 10)
    assert first.connections == 2 and other.connections == 0
    assert first.bodies("t") == bodies


def test_an_unkeyed_resend_goes_to_the_next_broker_as_before():
    first, other = FakeBroker(drop_after=1), FakeBroker()
    try:
        publisher = publish([first.address, other.address], "t", [b"m-%d" % i for i in range(30)], batch_size=10)
    finally:
        first.close()
        other.close()
    assert publisher.published == 30
    assert (len(first.bodies("t")), len(other.bodies("t"))) == (10, 30)


# -- the writer and the schema ------------------------------------------------------


def test_key_column_is_found_and_must_be_binary_or_string():
    body = StructField("body", StringType())
    assert key_column(StructType([body])) is None
    assert key_column(StructType([body, StructField("KEY", BinaryType())])) == 1
    assert check_sink_schema(StructType([StructField("key", StringType()), body]), "t") == (1, None)
    with pytest.raises(ValueError, match="column 'key' must be binary or string, got int"):
        check_sink_schema(StructType([body, StructField("key", IntegerType())]), "t")


def write(broker, frame: pa.RecordBatch, topic="t") -> PublishReceipt:
    fields = {"body": StringType(), "key": StringType(), "topic": StringType()}
    binary = {name for name in frame.schema.names if pa.types.is_binary(frame.schema.field(name).type)}
    schema = StructType([StructField(name, BinaryType() if name in binary else fields[name])
                         for name in frame.schema.names])
    return publish_batches(SinkOptions((broker.address,), topic), schema, iter([frame]))


def test_the_writer_publishes_string_keys_as_utf8_and_null_keys_unkeyed(broker):
    frame = pa.RecordBatch.from_pydict({"body": ["a", "b", "c"], "key": ["ключ", None, "k"]})
    assert write(broker, frame) == PublishReceipt(0, 3, 0)
    assert broker.commands[0].raw == [bytes((8,)) + "ключ".encode() + b"a", b"\x00b", b"\x01kc"]
    assert write(broker, frame) == PublishReceipt(0, 3, 2)
    assert broker.bodies("t") == [b"a", b"b", b"c", b"b"]


def test_the_writer_keys_rows_routed_by_a_topic_column(broker):
    frame = pa.RecordBatch.from_pydict({"topic": ["x", None, "x"], "body": [b"1", b"2", b"3"],
                                        "key": [b"k1", b"k2", b"k1"]})
    assert write(broker, frame, topic="y") == PublishReceipt(0, 3, 1)
    assert (broker.stored["x"], broker.stored["y"]) == ([(b"k1", b"1")], [(b"k2", b"2")])


def test_the_writer_fails_on_an_empty_key(broker):
    frame = pa.RecordBatch.from_pydict({"body": ["a"], "key": [""]})
    with pytest.raises(ValueError, match="a 'key' must be 1 to 128 bytes"):
        write(broker, frame)
