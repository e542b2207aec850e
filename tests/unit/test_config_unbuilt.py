"""Options pynsqd accepts but does not act on: their warnings, their --help notes, the refusals."""

from __future__ import annotations

import pytest

from broker.config.help import help_text
from broker.config.options import Options, parse_args
from broker.config.unbuilt import UNBUILT, unbuilt_warnings

LINE = r"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{6}"

#: The statsd flags, once ignored, now acted on (:mod:`broker.observe.statsd_pusher`).
STATSD_FLAGS = ["--statsd-address=127.0.0.1:8125", "--statsd-prefix=pynsq", "--statsd-interval=10s",
                "--statsd-mem-stats=false", "--statsd-udp-packet-size=1400", "--statsd-exclude-ephemeral"]


def test_every_nsqd_option_is_built():
    assert UNBUILT == ()


@pytest.mark.parametrize("flag", STATSD_FLAGS)
def test_statsd_flags_no_longer_warn(flag):
    assert unbuilt_warnings(parse_args([flag])) == []


def test_defaults_and_built_options_give_no_warning():
    assert unbuilt_warnings(Options()) == []
    # the default value given explicitly, and the options of built features (TLS, AUTH,
    # compression, HTTPS) say nothing
    quiet = ["--statsd-prefix=nsq.%s", "--max-deflate-level=9", "--deflate", "--snappy=true", "--snappy=false",
             "--mem-queue-size=5", "--https-address=0.0.0.0:4152", "--tls-cert=c.pem", "--tls-key=k.pem",
             "--tls-min-version=tls1.2", "--tls-root-ca-file=ca.pem", "--auth-http-address=127.0.0.1:4181"]
    assert unbuilt_warnings(parse_args(quiet)) == []


def test_config_file_statsd_options_set_what_the_flags_set(tmp_path):
    config = tmp_path / "pynsqd.toml"
    config.write_text(
        'statsd_address = "127.0.0.1:8125"\n'
        'statsd_prefix = "pynsq"\n'
        'statsd_interval = "10s"\n'
        'statsd_mem_stats = false\n'
        'statsd_udp_packet_size = 1400\n'
        'statsd_exclude_ephemeral = true\n'
    )
    from_file = parse_args([f"--config={config}"])
    assert from_file == parse_args(STATSD_FLAGS)
    assert (from_file.statsd_address, from_file.statsd_prefix, from_file.statsd_interval, from_file.statsd_mem_stats,
            from_file.statsd_udp_packet_size, from_file.statsd_exclude_ephemeral) == (
        "127.0.0.1:8125", "pynsq", 10.0, False, 1400, True)
    assert unbuilt_warnings(from_file) == []


def test_help_marks_every_unbuilt_flag_and_nothing_else():
    lines = help_text().splitlines()
    marked = {lines[i - 1].split()[0][1:] for i, line in enumerate(lines) if "(not built in pynsqd: " in line}
    assert marked == {row.flag for row in UNBUILT}
    text = help_text()
    assert "  -snappy\n    \tenable snappy feature negotiation (client compression) (default true)\n" in text
    assert '  -https-address string\n    \t<addr>:<port> to listen on for HTTPS clients ' \
           '(default "127.0.0.1:4152")\n' in text
    assert "  -statsd-interval duration\n    \tduration between pushing to statsd (default 1m0s)\n" in text

