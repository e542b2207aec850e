"""Options: Go durations, nsqd's flag syntax, the TOML config file, validation, /config values."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
import zlib
from pathlib import Path

import pytest

from broker.config.options import (
    CONFIG_NAMES,
    NSQD_COMPAT_VERSION,
    TLS_NOT_REQUIRED,
    TLS_REQUIRED,
    TLS_REQUIRED_EXCEPT_HTTP,
    VERSION_TEXT,
    InfoRequest,
    Options,
    OptionsError,
    __version__,
    default_node_id,
    get_config_value,
    help_text,
    parse_args,
)
from broker.gocompat import format_duration, parse_duration, to_ns, to_seconds
from tests.support.paths import REPO

MS = 1_000_000
S = 1_000_000_000


# --------------------------------------------------------------------------- durations

@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("0", 0),
        ("-0", 0),
        ("+0", 0),
        ("0s", 0),
        ("250ms", 250 * MS),
        ("2s", 2 * S),
        ("1m30s", 90 * S),
        ("15m", 900 * S),
        ("1h", 3600 * S),
        ("1.5h", 5400 * S),
        ("300us", 300_000),
        ("300\u00b5s", 300_000),
        ("300\u03bcs", 300_000),
        ("100ns", 100),
        ("1.s", S),
        (".5s", S // 2),
        ("1h2m3s4ms5us6ns", 3723 * S + 4 * MS + 5_000 + 6),
        ("-1.5s", -1500 * MS),
        ("+2s", 2 * S),
        ("0.3333333333s", 333_333_333),
        ("2562047h47m16.854775807s", (1 << 63) - 1),
    ],
)
def test_parse_duration(text, ns):
    assert parse_duration(text) == ns


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", 'time: invalid duration ""'),
        ("-", 'time: invalid duration "-"'),
        ("s", 'time: invalid duration "s"'),
        (".s", 'time: invalid duration ".s"'),
        ("1", 'time: missing unit in duration "1"'),
        ("1s5", 'time: missing unit in duration "1s5"'),
        ("1d", 'time: unknown unit "d" in duration "1d"'),
        ("1 s", 'time: unknown unit " s" in duration "1 s"'),
        ("3000000h", 'time: invalid duration "3000000h"'),
        ("2562047h47m16.854775808s", 'time: invalid duration "2562047h47m16.854775808s"'),
    ],
)
def test_parse_duration_errors(text, message):
    with pytest.raises(ValueError) as info:
        parse_duration(text)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (0, "0s"),
        (1, "1ns"),
        (999, "999ns"),
        (1_000, "1\u00b5s"),
        (1_500, "1.5\u00b5s"),
        (25 * MS, "25ms"),
        (250 * MS, "250ms"),
        (1_100_000, "1.1ms"),
        (S, "1s"),
        (2 * S, "2s"),
        (1500 * MS, "1.5s"),
        (30 * S, "30s"),
        (60 * S, "1m0s"),
        (90 * S + 500 * MS, "1m30.5s"),
        (600 * S, "10m0s"),
        (900 * S, "15m0s"),
        (3600 * S, "1h0m0s"),
        (9000 * S, "2h30m0s"),
        (3723 * S + 1, "1h2m3.000000001s"),
        (-2 * S, "-2s"),
        (-250 * MS, "-250ms"),
        ((1 << 63) - 1, "2562047h47m16.854775807s"),
    ],
)
def test_format_duration(ns, text):
    assert format_duration(ns) == text


@pytest.mark.parametrize("text", ["0s", "250ms", "1.5\u00b5s", "1m30.5s", "2h30m0s", "1h2m3.000000001s"])
def test_duration_round_trip(text):
    assert format_duration(parse_duration(text)) == text


def test_seconds_conversion():
    assert to_ns(0.025) == 25 * MS
    assert to_ns(0.1) == 100 * MS
    assert to_seconds(250 * MS) == 0.25


# --------------------------------------------------------------------------- defaults

def test_defaults_match_nsqd_except_listen_addresses():
    options = Options()
    assert options.tcp_address == "127.0.0.1:4150"
    assert options.http_address == "127.0.0.1:4151"
    assert options.https_address == "127.0.0.1:4152"
    assert options.data_path == ""
    assert options.mem_queue_size == 10000
    assert options.max_bytes_per_file == 104857600
    assert options.sync_every == 2500
    assert options.sync_timeout == 2.0
    assert options.msg_timeout == 60.0
    assert options.max_msg_timeout == 900.0
    assert options.max_msg_size == 1048576
    assert options.max_body_size == 5242880
    assert options.max_req_timeout == 3600.0
    assert options.max_heartbeat_interval == 60.0
    assert options.max_rdy_count == 2500
    assert options.max_output_buffer_size == 65536
    assert options.max_output_buffer_timeout == 30.0
    assert options.min_output_buffer_timeout == 0.025
    assert options.output_buffer_timeout == 0.25
    assert options.max_channel_consumers == 0
    assert options.statsd_prefix == "nsq.%s"
    assert options.statsd_interval == 60.0
    assert options.statsd_mem_stats is True
    assert options.statsd_udp_packet_size == 508
    assert options.e2e_processing_latency_window_time == 600.0
    assert options.e2e_processing_latency_percentiles == ()
    assert options.tls_required == TLS_NOT_REQUIRED
    assert options.tls_min_version == "tls1.0"
    assert options.deflate is True and options.snappy is True
    assert options.max_deflate_level == 6
    assert options.log_level == "info" and options.log_prefix == "[nsqd] "
    assert options.client_timeout == 60.0
    assert options.queue_scan_interval == 0.1
    assert options.queue_scan_refresh_interval == 5.0
    assert options.queue_scan_selection_count == 20
    assert options.queue_scan_worker_pool_max == 4
    assert options.queue_scan_dirty_percent == 0.25
    assert options.durable is False and options.max_attempts == 0


def test_node_id_default_is_nsqd_hash_of_hostname():
    # nsqd: crc32.ChecksumIEEE(md5(hostname)) % 1024. zlib's crc32 is the same IEEE CRC-32,
    # as its standard check value shows.
    assert zlib.crc32(b"123456789") == 0xCBF43926
    assert default_node_id("localhost") == zlib.crc32(hashlib.md5(b"localhost").digest()) % 1024 == 16
    assert default_node_id("yourhost.local") == 144
    assert 0 <= Options().node_id < 1024
    assert Options().node_id == default_node_id()


def test_version_constants():
    assert NSQD_COMPAT_VERSION == "1.3.0"
    assert __version__ == "0.1.0"
    assert VERSION_TEXT == "pynsqd v0.1.0 (nsqd 1.3.0 compatible)"


def test_options_are_frozen_and_replace_revalidates():
    options = Options()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.mem_queue_size = 1  # type: ignore[misc]
    assert dataclasses.replace(options, log_level="DEBUG").log_level == "debug"
    with pytest.raises(OptionsError, match=r"--max-deflate-level must be \[1,9\]"):
        dataclasses.replace(options, max_deflate_level=0)


def test_data_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert Options().data_dir() == str(tmp_path)
    assert Options(data_path="/var/lib/x").data_dir() == "/var/lib/x"


# --------------------------------------------------------------------------- flag syntax

@pytest.mark.parametrize(
    "argv",
    [
        ["--mem-queue-size=5"],
        ["--mem-queue-size", "5"],
        ["-mem-queue-size=5"],
        ["-mem-queue-size", "5"],
        ["--mem-queue-size=0x5"],
        ["--mem-queue-size=05"],
        ["--mem-queue-size=+5"],
        ["--mem-queue-size=1", "--mem-queue-size=5"],
    ],
)
def test_value_flag_forms(argv):
    assert parse_args(argv).mem_queue_size == 5


def test_go_integer_syntax():
    assert parse_args(["--mem-queue-size=1_000"]).mem_queue_size == 1000
    assert parse_args(["--mem-queue-size=010"]).mem_queue_size == 8
    assert parse_args(["--mem-queue-size=0b101"]).mem_queue_size == 5
    assert parse_args(["--mem-queue-size=0o17"]).mem_queue_size == 15


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--deflate"], True),
        (["-deflate"], True),
        (["--deflate=false"], False),
        (["--deflate=0"], False),
        (["--deflate=F"], False),
        (["--deflate=FALSE"], False),
        (["--deflate=False"], False),
        (["--deflate=true"], True),
        (["--deflate=1"], True),
        (["--deflate=T"], True),
        (["--deflate=false", "--deflate"], True),
    ],
)
def test_bool_flag_forms(argv, expected):
    assert parse_args(argv).deflate is expected


def test_bool_flag_does_not_take_next_argument():
    # As in Go: "--deflate false" sets deflate and leaves "false" as a stray argument.
    with pytest.raises(OptionsError, match="unexpected argument 'false'"):
        parse_args(["--deflate", "false"])


@pytest.mark.parametrize(
    ("argv", "seconds"),
    [
        (["--msg-timeout=250ms"], 0.25),
        (["--msg-timeout", "2s"], 2.0),
        (["-msg-timeout=1m30s"], 90.0),
        (["--msg-timeout=1.5h"], 5400.0),
        (["--msg-timeout=300us"], 0.0003),
    ],
)
def test_duration_flags(argv, seconds):
    assert parse_args(argv).msg_timeout == pytest.approx(seconds)


def test_string_flag_takes_next_argument_even_with_a_dash():
    assert parse_args(["--log-prefix", "-x-"]).log_prefix == "-x-"
    assert parse_args(["--http-address="]).http_address == ""


def test_repeatable_list_flags():
    options = parse_args(
        [
            "--lookupd-tcp-address=10.0.0.1:4160",
            "--lookupd-tcp-address",
            "10.0.0.2:4160",
            "-auth-http-address=http://auth/",
        ]
    )
    assert options.nsqlookupd_tcp_addresses == ("10.0.0.1:4160", "10.0.0.2:4160")
    assert options.auth_http_addresses == ("http://auth/",)


def test_percentile_flag_repeats_and_splits_commas_and_sorts_descending():
    options = parse_args(
        [
            "--e2e-processing-latency-percentile=0.5,0.99",
            "--e2e-processing-latency-percentile",
            "1.0",
        ]
    )
    assert options.e2e_processing_latency_percentiles == (1.0, 0.99, 0.5)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--tls-required"], TLS_REQUIRED),
        (["--tls-required=true"], TLS_REQUIRED),
        (["--tls-required=TRUE"], TLS_REQUIRED),
        (["--tls-required=false"], TLS_NOT_REQUIRED),
        (["--tls-required=tcp-https"], TLS_REQUIRED_EXCEPT_HTTP),
        (["--tls-required=TCP-HTTPS"], TLS_REQUIRED_EXCEPT_HTTP),
    ],
)
def test_tls_required_values(argv, expected):
    options = parse_args(["--tls-cert=c.pem", "--tls-key=k.pem", *argv])
    assert options.tls_required == expected


def test_tls_client_auth_policy_implies_tls_required():
    options = parse_args(["--tls-cert=c", "--tls-key=k", "--tls-client-auth-policy=require-verify"])
    assert options.tls_required == TLS_REQUIRED


@pytest.mark.parametrize("version", ["ssl3.0", "tls1.0", "tls1.1", "tls1.2", "tls1.3", "TLS1.2"])
def test_tls_min_version_values(version):
    assert parse_args([f"--tls-min-version={version}"]).tls_min_version == version.lower()


@pytest.mark.parametrize("level", ["debug", "info", "warn", "error", "fatal", "WARN"])
def test_log_level_values(level):
    assert parse_args([f"--log-level={level}"]).log_level == level.lower()


def test_pynsqd_flags():
    options = parse_args(["--durable", "--max-attempts=5"])
    assert options.durable is True
    assert options.max_attempts == 5


def test_deprecated_flags_are_accepted_and_ignored():
    assert parse_args(["--verbose", "--worker-id"]) == parse_args([])


def test_double_dash_ends_flags():
    assert parse_args(["--snappy=false", "--"]).snappy is False
    with pytest.raises(OptionsError, match="unexpected argument '--x'"):
        parse_args(["--", "--x"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nope"], "flag provided but not defined: -nope"),
        (["-nope=1"], "flag provided but not defined: -nope"),
        (["---mem-queue-size=1"], "bad flag syntax: ---mem-queue-size=1"),
        (["--=1"], "bad flag syntax: --=1"),
        (["--mem-queue-size"], "flag needs an argument: -mem-queue-size"),
        (["--mem-queue-size=x"], 'invalid value "x" for flag -mem-queue-size: parse error'),
        (["--mem-queue-size=1.5"], 'invalid value "1.5" for flag -mem-queue-size: parse error'),
        (["--mem-queue-size=99999999999999999999"], 'invalid value "99999999999999999999" for flag -mem-queue-size: value out of range'),
        (["--deflate=yes"], 'invalid boolean value "yes" for -deflate: parse error'),
        # nsqd 1.3.0's flag package (Go 1.19) words every bad duration "parse error"
        (["--msg-timeout=5"], 'invalid value "5" for flag -msg-timeout: parse error'),
        (["--msg-timeout=5d"], 'invalid value "5d" for flag -msg-timeout: parse error'),
        (["--log-level=loud"], "invalid value \"loud\" for flag -log-level: invalid log level 'loud' (debug, info, warn, error, fatal)"),
        (["--tls-min-version=tls9"], 'invalid value "tls9" for flag -tls-min-version: unknown tlsVersionOption "tls9"'),
        (["--tls-required=MAYBE"],
         'invalid boolean value "MAYBE" for -tls-required: strconv.ParseBool: parsing "maybe": invalid syntax'),
        (["--e2e-processing-latency-percentile=high"], "invalid value \"high\" for flag -e2e-processing-latency-percentile: could not parse 'high'"),
        (["stray"], "unexpected argument 'stray'"),
    ],
)
def test_flag_errors(argv, message):
    with pytest.raises(OptionsError) as info:
        parse_args(argv)
    assert str(info.value).startswith(message)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--node-id=1024"], "--node-id must be [0,1024)"),
        (["--node-id=-1"], "--node-id must be [0,1024)"),
        (["--max-deflate-level=0"], "--max-deflate-level must be [1,9]"),
        (["--max-deflate-level=10"], "--max-deflate-level must be [1,9]"),
        (["--e2e-processing-latency-percentile=0"], "invalid E2E processing latency percentile: 0"),
        (["--e2e-processing-latency-percentile=1.5"], "invalid E2E processing latency percentile: 1.5"),
        (["--e2e-processing-latency-percentile=nan"], "invalid E2E processing latency percentile: nan"),
        (["--tls-required"], "cannot require TLS client connections without TLS key and cert"),
        (["--tls-client-auth-policy=require"], "cannot require TLS client connections without TLS key and cert"),
        (["--tls-cert=c", "--tls-key=k", "--tls-client-auth-policy=always"], "--tls-client-auth-policy must be 'require' or 'require-verify'"),
        (["--tls-cert=c"], "failed to build TLS config - --tls-cert and --tls-key must be given together"),
        (["--mem-queue-size=-1"], "--mem-queue-size must be >= 0"),
        (["--sync-every=0"], "--sync-every must be > 0"),
        (["--msg-timeout=0s"], "--msg-timeout must be > 0"),
        (["--max-req-timeout=-1s"], "--max-req-timeout must be >= 0"),
        (["--broadcast-tcp-port=70000"], "--broadcast-tcp-port must be [0,65535]"),
        (["--max-attempts=-2"], "--max-attempts must be >= 0"),
        (["--max-attempts=65536"], "--max-attempts must be [0,65535]"),  # a frame's attempts are a uint16
    ],
)
def test_validation_errors(argv, message):
    with pytest.raises(OptionsError) as info:
        parse_args(argv)
    assert str(info.value) == message


@pytest.mark.parametrize("address", ["127.0.0.1:8125", "[::1]:8125", "statsd.example:8125", "127.0.0.1:0", "host:",
                                     "host:+8125", "host:065535", "127.0.0.1:99999", "127.0.0.1", "::1:8125"])
def test_a_statsd_address_is_taken_as_nsqd_takes_it(address):
    """nsqd takes any address and fails the pushes it cannot make (see test_startup_messages.py)."""
    assert parse_args([f"--statsd-address={address}"]).statsd_address == address


def test_help_and_version_requests():
    for argv in (["-h"], ["--help"], ["-help"], ["--mem-queue-size=1", "-h"]):
        with pytest.raises(InfoRequest) as info:
            parse_args(argv)
        assert info.value.text == help_text()
    with pytest.raises(InfoRequest) as info:
        parse_args(["--version", "--node-id=5000"])
    assert info.value.text == VERSION_TEXT
    assert parse_args(["--version=false"]) == parse_args([])


def test_version_wins_over_a_broken_config_file(tmp_path):
    with pytest.raises(InfoRequest):
        parse_args(["--version", f"--config={tmp_path / 'missing.toml'}"])


# --------------------------------------------------------------------------- config file

def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "pynsqd.toml"
    path.write_text(text)
    return str(path)


def test_config_file_values(tmp_path):
    path = write(
        tmp_path,
        """
        id = 7
        mem_queue_size = 42
        msg_timeout = "90s"
        max_req_timeout = 1500          # integers are milliseconds, as in nsqd
        nsqlookupd_tcp_addresses = ["a:4160", "b:4160"]
        auth_http_addresses = "http://x/, http://y/"
        e2e_processing_latency_percentiles = [0.5, 1, 0.99]
        tls_cert = "c.pem"
        tls_key = "k.pem"
        tls_required = "tcp-https"
        tls_min_version = "tls1.2"
        log_level = "WARN"
        deflate = false
        snappy = "false"
        durable = true
        max_attempts = 3
        """,
    )
    options = parse_args([f"--config={path}"])
    assert options.node_id == 7
    assert options.mem_queue_size == 42
    assert options.msg_timeout == 90.0
    assert options.max_req_timeout == 1.5
    assert options.nsqlookupd_tcp_addresses == ("a:4160", "b:4160")
    assert options.auth_http_addresses == ("http://x/", "http://y/")
    # the config file keeps its order; only the flag sorts
    assert options.e2e_processing_latency_percentiles == (0.5, 1.0, 0.99)
    assert options.tls_required == TLS_REQUIRED_EXCEPT_HTTP
    assert options.tls_min_version == "tls1.2"
    assert options.log_level == "warn"
    assert options.deflate is False and options.snappy is False
    assert options.durable is True and options.max_attempts == 3


@pytest.mark.parametrize(("value", "expected"), [("true", TLS_REQUIRED), ("false", TLS_NOT_REQUIRED), ("1", TLS_REQUIRED), ('"true"', TLS_REQUIRED)])
def test_config_tls_required_forms(tmp_path, value, expected):
    path = write(tmp_path, f'tls_cert = "c"\ntls_key = "k"\ntls_required = {value}\n')
    assert parse_args(["-config", path]).tls_required == expected


def test_node_id_spelling_in_config(tmp_path):
    assert parse_args([f"--config={write(tmp_path, 'node_id = 9')}"]).node_id == 9
    with pytest.raises(OptionsError, match="sets both id and node_id"):
        parse_args([f"--config={write(tmp_path, 'id = 1' + chr(10) + 'node_id = 2')}"])


def test_command_line_beats_config_beats_default(tmp_path):
    path = write(
        tmp_path,
        """
        mem_queue_size = 42
        sync_every = 7
        nsqlookupd_tcp_addresses = ["config:4160"]
        deflate = false
        """,
    )
    options = parse_args(
        [
            "--mem-queue-size=1",
            f"--config={path}",
            "--lookupd-tcp-address=flag:4160",
            "--deflate",
        ]
    )
    assert options.mem_queue_size == 1  # flag, even though it came before --config
    assert options.sync_every == 7  # config file
    assert options.max_rdy_count == 2500  # default
    assert options.nsqlookupd_tcp_addresses == ("flag:4160",)  # a list flag replaces, not extends
    assert options.deflate is True


def test_unknown_config_keys_are_ignored_with_a_warning(tmp_path, caplog):
    path = write(tmp_path, 'verbose = true\nmem_queue_sizes = 5\n[section]\nx = 1\n')
    with caplog.at_level(logging.WARNING, logger="pynsqd.options"):
        options = parse_args([f"--config={path}"])
    assert options == parse_args([])
    warned = " ".join(record.getMessage() for record in caplog.records)
    assert "'mem_queue_sizes'" in warned and "'section'" in warned and "'verbose'" in warned


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tls_required = \"maybe\"", "failed parsing tls_required maybe"),
        ("tls_min_version = \"tls9\"", "failed parsing tls_min_version tls9"),
        ("log_level = \"loud\"", "failed parsing log_level loud"),
        ("mem_queue_size = \"many\"", "failed parsing mem_queue_size many - expected an integer"),
        ("mem_queue_size = 1.5", "failed parsing mem_queue_size 1.5 - expected an integer"),
        ("msg_timeout = \"5d\"", 'failed parsing msg_timeout 5d - time: unknown unit "d" in duration "5d"'),
        ("msg_timeout = 1.5", "failed parsing msg_timeout 1.5 - expected a duration"),
        ("deflate = 1", "failed parsing deflate 1 - expected true or false"),
        ("tcp_address = 4150", "failed parsing tcp_address 4150 - expected a string"),
        ("nsqlookupd_tcp_addresses = [1, 2]", "failed parsing nsqlookupd_tcp_addresses [1 2] - expected a list of strings"),
        ("e2e_processing_latency_percentiles = [\"x\"]", "failed parsing e2e_processing_latency_percentiles [x] - expected a list of numbers"),
        ("id = 4096", "--node-id must be [0,1024)"),
        ("e2e_processing_latency_percentiles = [0.5, 2]", "invalid E2E processing latency percentile: 2"),
    ],
)
def test_config_errors(tmp_path, text, message):
    with pytest.raises(OptionsError) as info:
        parse_args([f"--config={write(tmp_path, text)}"])
    assert str(info.value).startswith(message)


def test_config_file_unreadable_or_invalid(tmp_path):
    missing = tmp_path / "missing.toml"
    with pytest.raises(OptionsError) as info:
        parse_args([f"--config={missing}"])
    assert str(info.value) == f"failed to load config file {missing} - open {missing}: no such file or directory"
    with pytest.raises(OptionsError, match="failed to load config file .* - "):
        parse_args([f"--config={write(tmp_path, 'mem_queue_size = ')}"])


# --------------------------------------------------------------------------- /config values

def test_get_config_value_shapes():
    options = parse_args(
        [
            "--lookupd-tcp-address=a:4160",
            "--e2e-processing-latency-percentile=0.99,1",
            "--node-id=12",
            "--log-level=debug",
        ]
    )
    assert get_config_value(options, "mem_queue_size") == 10000
    assert get_config_value(options, "msg_timeout") == 60 * S
    assert get_config_value(options, "min_output_buffer_timeout") == 25 * MS
    assert get_config_value(options, "max_output_buffer_timeout") == 30 * S
    assert get_config_value(options, "nsqlookupd_tcp_addresses") == ["a:4160"]
    assert get_config_value(options, "auth_http_addresses") == []
    assert get_config_value(options, "e2e_processing_latency_percentiles") == [1.0, 0.99]
    assert get_config_value(options, "id") == 12
    with pytest.raises(KeyError):  # a config file's spelling of id, not a name nsqd's /config knows
        get_config_value(options, "node_id")
    assert get_config_value(options, "log_level") == 1  # nsqd's lg.DEBUG
    assert get_config_value(Options(), "log_level") == 2  # nsqd's lg.INFO
    assert get_config_value(options, "tls_required") == 0
    assert get_config_value(options, "tls_min_version") == 0x0301
    assert get_config_value(options, "deflate") is True
    assert get_config_value(options, "tcp_address") == "127.0.0.1:4150"
    assert get_config_value(options, "data_path") == ""
    assert get_config_value(options, "durable") is False
    assert get_config_value(options, "max_attempts") == 0
    assert get_config_value(options, "dedup_window") == 600_000_000_000  # a Go duration, in ns
    assert get_config_value(options, "dedup_max_keys") == 1_000_000
    assert get_config_value(options, "default_priority") == 2**31
    for name in CONFIG_NAMES:
        json.dumps(get_config_value(options, name))


@pytest.mark.parametrize("name", ["client_timeout", "queue_scan_interval", "node-id", "mem-queue-size", "config", "version", "verbose", "nope"])
def test_get_config_value_unknown(name):
    with pytest.raises(KeyError):
        get_config_value(Options(), name)


def test_config_names_are_nsqds_plus_pynsqds():
    assert "id" in CONFIG_NAMES and "node_id" not in CONFIG_NAMES
    assert {"nsqlookupd_tcp_addresses", "auth_http_addresses", "e2e_processing_latency_percentiles"} <= set(CONFIG_NAMES)
    assert {"durable", "max_attempts", "dedup_window", "dedup_max_keys", "default_priority",
            "replicas", "replica_timeout", "replication_secret_file"} <= set(CONFIG_NAMES)
    assert len(CONFIG_NAMES) == 49 + 8


# --------------------------------------------------------------------------- --help

def test_help_lists_every_flag_in_go_format():
    text = help_text()
    lines = text.splitlines()
    assert lines[0] == "Usage of pynsqd:"
    flag_lines = [line for line in lines if line.startswith("  -")]
    names = [line.split()[0][1:] for line in flag_lines]
    assert names == sorted(names)
    assert set(names) == {name.replace("_", "-") for name in CONFIG_NAMES} - {"id", "nsqlookupd-tcp-addresses", "auth-http-addresses", "e2e-processing-latency-percentiles"} | {
        "node-id", "lookupd-tcp-address", "auth-http-address", "e2e-processing-latency-percentile",
        "config", "version", "verbose", "worker-id",
    }
    # each flag line is followed by a usage line indented with four spaces and a tab
    for index, line in enumerate(lines):
        if line.startswith("  -"):
            assert lines[index + 1].startswith("    \t")
    assert '  -tcp-address string\n    \t<addr>:<port> (for TCP/IP) or <path> (for unix socket) to listen on for TCP clients (default "127.0.0.1:4150")' in text
    assert "  -msg-timeout duration\n    \tdefault duration to wait before auto-requeing a message (default 1m0s)" in text
    assert "  -deflate\n    \tenable deflate feature negotiation (client compression) (default true)" in text
    assert "  -statsd-exclude-ephemeral\n    \tSkip ephemeral topics and channels when sending stats to statsd\n" in text
    assert "  -log-level value\n    \tset log verbosity: debug, info, warn, error, or fatal (default INFO)" in text
    assert "(default tls1.0)" in text
    assert "  -tls-required\n    \trequire TLS for client connections (true, false, tcp-https)\n" in text
    assert "  -lookupd-tcp-address value\n    \tlookupd TCP address (may be given multiple times)\n" in text
    assert "(default 25ms)" in text and "(default 1h0m0s)" in text and "(default 10m0s)" in text
    assert '(default "[nsqd] ")' in text and '(default "nsq.%s")' in text
    assert re.search(r"default is hash of hostname\) \(default \d+\)", text)
    assert "  -data-path string\n    \tpath to store disk-backed messages\n" in text


# --------------------------------------------------------------------------- deploy files

def test_example_config_covers_every_option_and_parses(tmp_path):
    text = (REPO / "deploy" / "pynsqd.toml").read_text()
    # the file as shipped parses
    options = parse_args([f"--config={REPO / 'deploy' / 'pynsqd.toml'}"])
    assert options.data_path == "/var/lib/pynsqd"
    # and with every commented-out setting switched on, it still parses and names every key
    uncommented = re.sub(r"(?m)^# ?(?!#)", "", text)
    keys = set(re.findall(r"(?m)^([a-z0-9_]+) =", uncommented))
    assert keys == set(CONFIG_NAMES)
    path = write(tmp_path, uncommented.replace('tls_cert = ""', 'tls_cert = "c"').replace('tls_key = ""', 'tls_key = "k"'))
    parse_args([f"--config={path}"])


def test_container_and_unit_command_lines_parse():
    containerfile = (REPO / "deploy" / "Containerfile").read_text()
    cmd = json.loads(re.search(r"(?m)^CMD (\[.*\])$", containerfile).group(1))
    options = parse_args(cmd)
    assert options.tcp_address == "0.0.0.0:4150"
    assert options.http_address == "0.0.0.0:4151"
    unit = (REPO / "deploy" / "pynsqd.service").read_text()
    exec_start = re.search(r"(?m)^ExecStart=(\S+) (.*)$", unit)
    assert exec_start.group(1).endswith("/pynsqd")
    assert exec_start.group(2).split()[0].startswith("--config=")
