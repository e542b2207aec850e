"""The pynsqd command: --help/--version, exit codes, nsqd's log format, bench and daemon dispatch."""

from __future__ import annotations

import datetime
import logging
import re
import subprocess
import sys
import time
import types

import pytest

from broker import cli
from broker.config.log import NsqdFormatter, configure_logging, log_level_number, set_log_level
from broker.config.options import VERSION_TEXT, Options, help_text
from tests.support.paths import REPO

LINE = r"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{6}"


pytestmark = pytest.mark.usefixtures("pynsqd_logger")


@pytest.fixture
def fake_daemon(monkeypatch):
    """Replace broker.daemon with a stand-in whose run() records its options and logs."""
    calls: list[Options] = []
    module = types.ModuleType("broker.daemon")

    def run(options):
        calls.append(options)
        log = logging.getLogger("pynsqd.daemon")
        log.info("TCP: listening on %s", options.tcp_address)
        log.warning("something odd")

    module.run = run
    monkeypatch.setitem(sys.modules, "broker.daemon", module)
    return calls


def test_version(capsys):
    assert cli.main(["--version"]) == 0
    out, err = capsys.readouterr()
    assert out == "pynsqd v0.1.0 (nsqd 1.3.0 compatible)\n" == VERSION_TEXT + "\n"
    assert err == ""


@pytest.mark.parametrize("flag", ["-h", "--help", "-help"])
def test_help(capsys, flag):
    assert cli.main([flag]) == 0
    out, _ = capsys.readouterr()
    assert out == help_text() + "\n"
    assert out.startswith("Usage of pynsqd:\n  -auth-http-address value\n")


def test_help_names_the_commands_that_run_instead_of_the_broker(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    commands = out[out.index("\nInstead of the broker:\n"):]
    assert "\n  pynsqd bench writer|reader|channels [flags]\n" in commands
    assert "\n  pynsqd export-nsqd -data-path=<dir> -to=<dir> [flags]\n" in commands
    assert "see pynsqd export-nsqd -help" in commands and "see pynsqd bench -help" in commands
    assert "\n  python -m diskqueue <data-path> [queue ...]\n" in commands


@pytest.mark.parametrize("flag", ["-h", "--help", "-help"])
def test_export_nsqd_help_is_the_exports_own(capsys, flag):
    assert cli.main(["export-nsqd", flag]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.startswith("Usage of pynsqd export-nsqd:\n  pynsqd export-nsqd -data-path=<dir> -to=<dir> [flags]\n")
    flags = [line.split()[0] for line in out.splitlines() if line.startswith("  -")]
    assert flags == ["-data-path", "-to", "-config", "-max-bytes-per-file", "-max-msg-size", "-default-priority"]
    assert "  -max-bytes-per-file int\n    \tnumber of bytes per diskqueue file before rolling (default 104857600)\n" in out
    assert "Usage of pynsqd:" not in out  # the broker's help


def test_export_nsqd_takes_the_target_in_either_spelling(tmp_path):
    for spelling in ("--to", "-to"):
        data, target = tmp_path / f"data{spelling}", tmp_path / f"nsqd{spelling}"
        data.mkdir()
        (data / "nsqd.dat").write_text('{"topics":[{"channels":[],"name":"t","paused":false}],"version":"1.3.0"}')
        assert cli.main(["export-nsqd", f"-data-path={data}", f"{spelling}={target}"]) == 0
        assert (target / "nsqd.dat").is_file()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        # what nsqd refuses when it builds the broker carries its "failed to instantiate nsqd - "
        (["--node-id=1024"], "failed to instantiate nsqd - --node-id must be [0,1024)"),
        (["--max-deflate-level=10"], "failed to instantiate nsqd - --max-deflate-level must be [1,9]"),
        (["--nope"], "flag provided but not defined: -nope"),
        (["--tls-min-version=tls2"], 'invalid value "tls2" for flag -tls-min-version: unknown tlsVersionOption "tls2"'),
        (["--e2e-processing-latency-percentile=2"],
         "failed to instantiate nsqd - invalid E2E processing latency percentile: 2"),
    ],
)
def test_bad_options_exit_1_with_an_nsqd_style_fatal_line(capsys, fake_daemon, argv, message):
    assert cli.main(argv) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert re.fullmatch(rf"\[nsqd\] {LINE} FATAL: {re.escape(message)}\n", err)
    assert fake_daemon == []


def test_runs_the_daemon_with_parsed_options_and_nsqd_log_lines(capsys, fake_daemon):
    assert cli.main(["--tcp-address=127.0.0.1:0", "--mem-queue-size=5"]) == 0
    (options,) = fake_daemon
    assert options.tcp_address == "127.0.0.1:0" and options.mem_queue_size == 5
    err = capsys.readouterr().err.splitlines()
    assert re.fullmatch(rf"\[nsqd\] {LINE} INFO: TCP: listening on 127\.0\.0\.1:0", err[0])
    assert re.fullmatch(rf"\[nsqd\] {LINE} WARNING: something odd", err[1])


def test_log_level_and_prefix_flags(capsys, fake_daemon):
    assert cli.main(["--log-level=warn", "--log-prefix=[pynsqd] "]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert re.fullmatch(rf"\[pynsqd\] {LINE} WARNING: something odd", err[0])


def test_config_warnings_use_nsqd_format(tmp_path, capsys, fake_daemon):
    config = tmp_path / "pynsqd.toml"
    config.write_text('mem_queue_size = 3\nbogus = 1\n')
    assert cli.main([f"--config={config}"]) == 0
    assert fake_daemon[0].mem_queue_size == 3
    err = capsys.readouterr().err
    assert re.search(rf"\[nsqd\] {LINE} WARNING: config file .*pynsqd.toml: ignoring unknown option 'bogus'", err)


def test_daemon_exit_status_is_passed_through(monkeypatch, capsys):
    module = types.ModuleType("broker.daemon")
    module.run = lambda options: 3
    monkeypatch.setitem(sys.modules, "broker.daemon", module)
    assert cli.main([]) == 3


def test_bench_subcommand_is_dispatched(monkeypatch):
    seen = []
    module = types.ModuleType("broker.bench")
    module.main = lambda argv: seen.append(argv) or 7
    monkeypatch.setitem(sys.modules, "broker.bench", module)
    assert cli.main(["bench", "--topic=t", "-n", "10"]) == 7
    assert seen == [["--topic=t", "-n", "10"]]


def test_formatter_renders_nsqd_lines():
    created = time.mktime((2024, 1, 2, 3, 4, 5, 0, 0, -1)) + 0.25
    for level, label in [
        (logging.DEBUG, "DEBUG"),
        (logging.INFO, "INFO"),
        (logging.WARNING, "WARNING"),
        (logging.ERROR, "ERROR"),
        (logging.CRITICAL, "FATAL"),
    ]:
        record = logging.LogRecord("pynsqd.x", level, __file__, 1, "TOPIC(%s): created", ("t",), None)
        record.created = created
        assert NsqdFormatter("[nsqd] ").format(record) == f"[nsqd] 2024/01/02 03:04:05.250000 {label}: TOPIC(t): created"


@pytest.mark.parametrize("fraction", [0.0, 0.000001, 0.0000004, 0.4999995, 0.9999994, 0.9999996, 0.999999])
def test_formatter_times_are_datetimes_rounded_to_the_microsecond_across_seconds(fraction):
    # one formatter for every line, as in the broker: its per-second text must follow the clock
    formatter = NsqdFormatter("")
    base = time.mktime((2024, 12, 31, 23, 59, 58, 0, 0, -1))
    for second in range(3):
        created = base + second + fraction
        record = logging.LogRecord("pynsqd.x", logging.INFO, __file__, 1, "m", None, None)
        record.created = created
        expected = datetime.datetime.fromtimestamp(created).strftime("%Y/%m/%d %H:%M:%S.%f")
        assert formatter.format(record) == f"{expected} INFO: m"


def test_formatter_appends_tracebacks():
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = logging.LogRecord("pynsqd", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())
    text = NsqdFormatter().format(record)
    assert text.splitlines()[0].endswith("ERROR: failed")
    assert "RuntimeError: boom" in text


def test_configure_and_set_log_level(capsys):
    configure_logging("error", "[t] ")
    configure_logging("info", "[u] ")  # replaces the first handler instead of adding one
    logger = logging.getLogger("pynsqd.test")
    logger.debug("hidden")
    logger.info("shown")
    set_log_level("debug")
    logger.debug("now shown")
    err = capsys.readouterr().err.splitlines()
    assert [line.split(": ", 1)[1] for line in err] == ["shown", "now shown"]
    assert all(line.startswith("[u] ") for line in err)
    with pytest.raises(KeyError):
        set_log_level("loud")
    assert [log_level_number(name) for name in ("debug", "info", "warn", "error", "fatal")] == [1, 2, 3, 4, 5]


def test_python_dash_m_broker_exit_codes():
    ok = subprocess.run([sys.executable, "-m", "broker", "--version"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert (ok.returncode, ok.stdout) == (0, VERSION_TEXT + "\n")
    bad = subprocess.run(
        [sys.executable, "-m", "broker", "--node-id", "4096"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 1
    assert re.fullmatch(rf"\[nsqd\] {LINE} FATAL: failed to instantiate nsqd - --node-id must be \[0,1024\)\n",
                        bad.stderr)
