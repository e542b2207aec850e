"""The connector's ``lookupd`` option: nsqlookupd HTTP addresses instead of ``nsqd``."""

import pytest

from pyspark_nsq.options import Address, BatchReadOptions, OptionError, SinkOptions, SourceOptions, check_read_options


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
