"""Options pynsqd accepts but does not act on: their warnings, their --help notes, the refusals."""

from __future__ import annotations

import pytest

from broker.config.flag_table import FLAGS_BY_NAME
from broker.config.help import help_text
from broker.config.options import Options, parse_args
from broker.config.unbuilt import UNBUILT, unbuilt_warnings

LINE = r"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{6}"
STATSD = "pynsqd does not push stats to statsd; {} is ignored (scrape GET /metrics or read GET /stats instead)"

#: Every flag that warns, with a non-default value and the exact warning it gives.
WARNINGS = [
    (["--statsd-address=127.0.0.1:8125"], STATSD.format("--statsd-address=127.0.0.1:8125")),
    (["--statsd-prefix=pynsq"], STATSD.format("--statsd-prefix=pynsq")),
    (["--statsd-interval=10s"], STATSD.format("--statsd-interval=10s")),
    (["--statsd-mem-stats=false"], STATSD.format("--statsd-mem-stats=false")),
    (["--statsd-udp-packet-size=1400"], STATSD.format("--statsd-udp-packet-size=1400")),
    (["--statsd-exclude-ephemeral"], STATSD.format("--statsd-exclude-ephemeral=true")),
]


@pytest.mark.parametrize(("argv", "expected"), WARNINGS)
def test_each_unbuilt_flag_warns_with_its_value(argv, expected):
    expected = expected if isinstance(expected, list) else [expected]
    assert unbuilt_warnings(parse_args(argv)) == expected


def test_defaults_and_built_options_give_no_warning():
    assert unbuilt_warnings(Options()) == []
    # the default value given explicitly, and the options of built features (TLS, AUTH,
    # compression, HTTPS) say nothing
    quiet = ["--statsd-prefix=nsq.%s", "--max-deflate-level=9", "--deflate", "--snappy=true", "--snappy=false",
             "--mem-queue-size=5", "--https-address=0.0.0.0:4152", "--tls-cert=c.pem", "--tls-key=k.pem",
             "--tls-min-version=tls1.2", "--tls-root-ca-file=ca.pem", "--auth-http-address=127.0.0.1:4181"]
    assert unbuilt_warnings(parse_args(quiet)) == []


def test_config_file_options_warn_the_same_way(tmp_path):
    config = tmp_path / "pynsqd.toml"
    config.write_text(
        'nsqlookupd_tcp_addresses = ["127.0.0.1:4160"]\n'
        'statsd_address = "127.0.0.1:8125"\n'
        'statsd_interval = "10s"\n'
        'tls_min_version = "tls1.2"\n'
    )
    from_file = unbuilt_warnings(parse_args([f"--config={config}"]))
    from_flags = unbuilt_warnings(parse_args([
        "--lookupd-tcp-address=127.0.0.1:4160", "--statsd-address=127.0.0.1:8125", "--statsd-interval=10s",
        "--tls-min-version=tls1.2",
    ]))
    assert len(from_file) == 2  # nsqlookupd_tcp_addresses and tls_min_version are acted on: no warning
    assert from_file == from_flags


def test_every_warning_row_is_covered_and_names_a_real_flag():
    warned = {arg.split("=")[0][2:] for argv, _ in WARNINGS for arg in argv}
    assert warned == {row.flag for row in UNBUILT if row.warns}
    assert all(row.flag in FLAGS_BY_NAME and FLAGS_BY_NAME[row.flag].attr for row in UNBUILT)


def test_help_marks_every_unbuilt_flag_and_nothing_else():
    lines = help_text().splitlines()
    marked = {lines[i - 1].split()[0][1:] for i, line in enumerate(lines) if "(not built in pynsqd: " in line}
    assert marked == {row.flag for row in UNBUILT}
    text = help_text()
    assert "  -snappy\n    \tenable snappy feature negotiation (client compression) (default true)\n" in text
    assert '  -https-address string\n    \t<addr>:<port> to listen on for HTTPS clients ' \
           '(default "127.0.0.1:4152")\n' in text
    assert "  -statsd-interval duration\n    \tduration between pushing to statsd (not built in pynsqd: ignored) " \
           "(default 1m0s)\n" in text

