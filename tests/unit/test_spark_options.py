"""Option parsing of the nsq data source, without Spark, ``lookupd`` (nsqlookupd HTTP addresses instead of ``nsqd``) included."""

import pytest
from pyspark.sql.types import BinaryType, IntegerType, StringType, StructField, StructType

from pyspark_nsq.options import (
    Address,
    BatchReadOptions,
    OptionError,
    SinkOptions,
    SourceOptions,
    check_read_options,
)
from pyspark_nsq.schema import check_sink_schema

SOURCE = {"nsqd": "127.0.0.1:4150", "topic": "events", "channel": "spark"}


def lowered(options):
    """Spark hands options over with lower-cased keys."""
    return {key.lower(): value for key, value in options.items()}


def test_source_defaults():
    options = SourceOptions.parse(SOURCE)
    assert options == SourceOptions(
        nsqd=(Address("127.0.0.1", 4150),), topics=("events",), channel="spark",
        max_messages_per_trigger=None, msg_timeout_ms=60000, max_in_flight=None,
        drain_timeout_ms=1000,
    )


def test_source_options_as_spark_passes_them():
    options = SourceOptions.parse(lowered({
        **SOURCE, "nsqd": " a:1, [::1]:2 ,a:1", "topic": "t1,t2", "maxMessagesPerTrigger": "10",
        "msgTimeoutMs": "5000", "maxInFlight": "100", "drainTimeoutMs": "0",
    }))
    assert options.nsqd == (Address("a", 1), Address("::1", 2))
    assert str(options.nsqd[1]) == "[::1]:2"
    assert options.topics == ("t1", "t2")
    assert (options.max_messages_per_trigger, options.msg_timeout_ms, options.max_in_flight,
            options.drain_timeout_ms) == (10, 5000, 100, 0)


def test_batch_read_and_sink_options():
    assert BatchReadOptions.parse(lowered({**SOURCE, "maxMessages": "7"})).max_messages == 7
    sink = SinkOptions.parse(lowered({"nsqd": "h:1", "topic": "out", "batchSize": "50",
                                      "defer": "2000", "checkpointLocation": "/tmp/x"}))
    assert sink == SinkOptions((Address("h", 1),), "out", 50, 2000)
    assert SinkOptions.parse({"nsqd": "h:1"}).topic is None


@pytest.mark.parametrize(
    ("parse", "options", "option", "fragment"),
    [
        (SourceOptions.parse, {"topic": "t", "channel": "c"}, "nsqd", "is required"),
        (SourceOptions.parse, {"nsqd": "h:1", "channel": "c"}, "topic", "is required"),
        (SourceOptions.parse, {"nsqd": "h:1", "topic": "t"}, "channel", "is required"),
        (SourceOptions.parse, {**SOURCE, "nsqd": "localhost"}, "nsqd", "host:port"),
        (SourceOptions.parse, {**SOURCE, "nsqd": "h:99999"}, "nsqd", "host:port"),
        (SourceOptions.parse, {**SOURCE, "nsqd": " , "}, "nsqd", "at least one"),
        (SourceOptions.parse, {**SOURCE, "topic": "bad topic"}, "topic", "invalid name"),
        (SourceOptions.parse, {**SOURCE, "channel": "x" * 65}, "channel", "invalid name"),
        (SourceOptions.parse, {**SOURCE, "maxmessagespertrigger": "0"}, "maxMessagesPerTrigger",
         "integer in 1.."),
        (SourceOptions.parse, {**SOURCE, "msgtimeoutms": "999"}, "msgTimeoutMs", "1000..900000"),
        (SourceOptions.parse, {**SOURCE, "maxinflight": "1000001"}, "maxInFlight", "1..1000000"),
        (SourceOptions.parse, {**SOURCE, "msgtimeoutms": "-5"}, "msgTimeoutMs", "integer"),
        (SourceOptions.parse, {**SOURCE, "batchsize": "5"}, "batchsize", "unknown to the streaming"),
        (SourceOptions.parse, {**SOURCE, "maxmessages": "5"}, "maxmessages", "unknown"),
        (BatchReadOptions.parse, {**SOURCE, "maxmessagespertrigger": "5"}, "maxmessagespertrigger",
         "unknown to the batch reader"),
        (SinkOptions.parse, {"topic": "t"}, "nsqd", "is required"),
        (SinkOptions.parse, {"nsqd": "h:1", "channel": "c"}, "channel", "unknown to the writer"),
        (SinkOptions.parse, {"nsqd": "h:1", "topic": "a,b"}, "topic", "one topic"),
        (SinkOptions.parse, {"nsqd": "h:1", "defer": "3600001"}, "defer", "0..3600000"),
        (SinkOptions.parse, {"nsqd": "h:1", "batchsize": "x"}, "batchSize", "integer"),
        (check_read_options, {**SOURCE, "batchsize": "1"}, "batchsize", "unknown to the nsq readers"),
    ],
)
def test_bad_options_name_the_option(parse, options, option, fragment):
    with pytest.raises(OptionError) as info:
        parse(options)
    assert info.value.option == option
    assert f"option '{option}'" in str(info.value)
    assert fragment in str(info.value)


def test_known_option_names_are_listed_for_an_unknown_one():
    with pytest.raises(OptionError, match="known options: nsqd, topic, channel, maxMessagesPerTrigger"):
        SourceOptions.parse({**SOURCE, "maxmessagepertrigger": "5"})


def test_sink_schema_needs_a_body_and_a_topic():
    body = StructField("body", BinaryType())
    topic = StructField("topic", StringType())
    assert check_sink_schema(StructType([body]), "t") == (0, None)
    assert check_sink_schema(StructType([topic, StructField("Body", StringType())]), None) == (1, 0)
    with pytest.raises(ValueError, match="needs a 'body' column"):
        check_sink_schema(StructType([topic]), "t")
    with pytest.raises(ValueError, match="'body' must be binary or string"):
        check_sink_schema(StructType([StructField("body", IntegerType())]), "t")
    with pytest.raises(ValueError, match="'topic' must be a string"):
        check_sink_schema(StructType([body, StructField("topic", IntegerType())]), "t")
    with pytest.raises(OptionError, match="option 'topic' is required when the DataFrame has no"):
        check_sink_schema(StructType([body]), None)


# ---------------------------------------------------------------- lookupd instead of nsqd


@pytest.mark.parametrize("parse", [SourceOptions.parse, BatchReadOptions.parse])
def test_readers_take_lookupd_instead_of_nsqd(parse):
    options = parse({"lookupd": "10.0.0.1:4161, 10.0.0.2:4161", "topic": "t", "channel": "c"})
    assert options.lookupd == (Address("10.0.0.1", 4161), Address("10.0.0.2", 4161))
    assert options.nsqd == ()


def test_writer_takes_lookupd_and_spark_lowers_nothing_it_needs():
    options = SinkOptions.parse({"LOOKUPD": "h:4161", "topic": "out"})
    assert (options.lookupd, options.nsqd, options.topic) == ((Address("h", 4161),), (), "out")


@pytest.mark.parametrize(
    ("options", "option", "message"),
    [
        ({"topic": "t", "channel": "c"}, "nsqd",
         "option 'nsqd' is required (or 'lookupd': nsqlookupd HTTP addresses to find the nsqd nodes by)"),
        ({"nsqd": "h:4150", "lookupd": "h:4161", "topic": "t", "channel": "c"}, "lookupd",
         "option 'lookupd' cannot be given with 'nsqd'"),
        ({"lookupd": " , ", "topic": "t", "channel": "c"}, "lookupd",
         "option 'lookupd' must name at least one nsqlookupd HTTP address (host:port)"),
        ({"lookupd": "h", "topic": "t", "channel": "c"}, "lookupd",
         "option 'lookupd' must be a comma-separated list of host:port, got 'h'"),
    ],
)
def test_bad_lookupd_options_name_the_option(options, option, message):
    for parse in (SourceOptions.parse, BatchReadOptions.parse, check_read_options):
        with pytest.raises(OptionError) as info:
            parse(options)
        assert info.value.option == option
        assert message in str(info.value)
