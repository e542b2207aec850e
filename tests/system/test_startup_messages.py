"""What a real ``python -m broker`` says at start: version, ID, ignored options, refusals, busy ports."""

from __future__ import annotations

import re
import socket
import struct
import subprocess
import sys

import pytest

from broker.config.options import VERSION_TEXT
from tests.support.paths import REPO, nsq_bin
from tests.support.processes import BrokerProcess
from tests.support.waiting import wait_for

LINE = r"\[nsqd\] \d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{6}"


def _messages(log: str) -> list[str]:
    """The log's lines without prefix and time stamp."""
    return [re.sub(rf"^{LINE} ", "", line) for line in log.splitlines()]


def _run_broker(tmp_path, *flags: str) -> subprocess.CompletedProcess[str]:
    """A broker that is expected to exit at once."""
    return subprocess.run(
        [sys.executable, "-m", "broker", f"--data-path={tmp_path}", *flags],
        cwd=REPO, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )


def test_start_logs_version_id_and_no_warning_for_acted_on_flags(broker_process, tmp_path):
    proc = broker_process("--node-id=42", "--lookupd-tcp-address=127.0.0.1:4160",
                          "--statsd-address=127.0.0.1:8125")
    assert proc.terminate() == 0
    messages = _messages(proc.log_text())
    assert messages[:2] == [f"INFO: {VERSION_TEXT}", "INFO: ID: 42"]
    # --lookupd-tcp-address and --statsd-address are acted on: no warning
    assert [m for m in messages if m.startswith("WARNING")] == []
    assert any(m.startswith("INFO: TCP: listening on") for m in messages)


def test_config_file_options_warn_no_more_than_flags(broker_process, tmp_path):
    config = tmp_path / "pynsqd.toml"
    config.write_text('nsqlookupd_tcp_addresses = ["127.0.0.1:4160"]\nstatsd_address = "127.0.0.1:8125"\n')
    proc = broker_process(f"--config={config}")
    assert proc.terminate() == 0
    assert [m for m in _messages(proc.log_text()) if m.startswith("WARNING")] == []


def test_defaults_start_without_warnings(broker_process):
    proc = broker_process()
    assert proc.terminate() == 0
    assert "WARNING" not in proc.log_text()


@pytest.mark.parametrize(
    ("flags", "fatal"),
    [
        # nsqd 1.3.0's own lines
        (("--tls-required=true",),
         "FATAL: failed to instantiate nsqd - cannot require TLS client connections without TLS key and cert"),
        (("--tls-client-auth-policy=bogus",),
         "FATAL: failed to instantiate nsqd - cannot require TLS client connections without TLS key and cert"),
        (("--tls-required=true", "--tls-cert=c.pem", "--tls-key=k.pem"),
         "FATAL: failed to instantiate nsqd - failed to build TLS config - open c.pem: no such file or directory"),
    ],
)
def test_tls_that_cannot_work_is_refused_at_start(tmp_path, flags, fatal):
    done = _run_broker(tmp_path, "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", *flags)
    assert done.returncode == 1
    assert done.stdout == ""
    assert _messages(done.stderr) == [fatal]


@pytest.mark.parametrize(("content", "fatal"), [
    (None, "FATAL: failed to start: --replication-secret-file: open {path}: no such file or directory"),
    (b"\n", "FATAL: failed to start: --replication-secret-file {path} is empty"),
])
def test_a_replication_secret_that_cannot_be_read_is_refused_at_start(tmp_path, content, fatal):
    path = tmp_path / "secret"
    if content is not None:
        path.write_bytes(content)
    done = _run_broker(tmp_path, "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", "--replicas=2",
                       f"--replication-secret-file={path}")
    assert done.returncode == 1
    assert _messages(done.stderr)[-1] == fatal.format(path=path)


@pytest.mark.parametrize("listener", ["TCP", "HTTP"])
def test_a_busy_port_is_refused_in_nsqds_words(tmp_path, listener):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = f"127.0.0.1:{held.getsockname()[1]}"
        addresses = {"TCP": "127.0.0.1:0", "HTTP": "127.0.0.1:0", listener: busy}
        done = _run_broker(tmp_path, f"--tcp-address={addresses['TCP']}", f"--http-address={addresses['HTTP']}")
    assert done.returncode == 1
    fatal = [m for m in _messages(done.stderr) if m.startswith("FATAL")]
    assert fatal == [f"FATAL: failed to instantiate nsqd - listen ({busy}) failed - listen tcp {busy}: bind: "
                     "address already in use"]


def test_a_start_refused_for_a_busy_port_leaves_the_data_path_as_it_was(tmp_path):
    """nsqd locks its data path, then opens its listeners, and only then reads and writes the
    data path: a start refused for a port in use leaves no directory (pynsqd makes a missing
    data path, nsqd does not), and one that was there keeps its files as they were (nsqd's
    queue files not imported, ``nsqd.dat`` not rewritten)."""
    missing = tmp_path / "new" / "data"
    used = tmp_path / "used"
    used.mkdir()
    (used / "nsqd.dat").write_bytes(b'{"topics":[{"channels":[],"name":"t","paused":false}],"version":"1.3.0"}')
    record = struct.pack(">qH", 1_700_000_000_000_000_000, 1) + b"0123456789abcdef" + b"kept"  # nsqd's
    (used / "t.diskqueue.000000.dat").write_bytes(len(record).to_bytes(4, "big") + record)
    (used / "t.diskqueue.meta.dat").write_text(f"1\n0,0\n0,{4 + len(record)}\n")
    before = {path.name: path.read_bytes() for path in used.iterdir()}
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = f"127.0.0.1:{held.getsockname()[1]}"
        for data in (missing, used):
            done = _run_broker(data, f"--tcp-address={busy}", "--http-address=127.0.0.1:0")
            assert done.returncode == 1, done.stderr
            assert [m for m in _messages(done.stderr) if m.startswith("FATAL")] == [
                f"FATAL: failed to instantiate nsqd - listen ({busy}) failed - listen tcp {busy}: bind: "
                "address already in use"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["used"]
    assert {path.name: path.read_bytes() for path in used.iterdir()} == before


@pytest.mark.parametrize("address", ["127.0.0.1:99999", "127.0.0.1", "127.0.0.1:no-such-service"])
async def test_a_statsd_address_no_push_can_use_fails_every_push_as_in_nsqd(tmp_path, address):
    """nsqd 1.3.0 starts with such an address and logs ``ERROR: failed to create UDP socket to
    statsd(...)`` at every push; so does pynsqd (before: it pushed to port 99999 - 65536 = 34463)."""
    programs = {"pynsqd": None}
    if nsq_bin() is not None:
        programs["nsqd"] = [str(nsq_bin() / "nsqd")]
    line = f"ERROR: failed to create UDP socket to statsd({address})"
    for name, program in programs.items():
        broker = BrokerProcess(tmp_path / name, f"--statsd-address={address}", "--statsd-interval=1s",
                               program=program).start()
        try:
            await wait_for(lambda b=broker: b.log_text().count(line) >= 2, timeout=20)  # a push, then the next
            assert "pushing stats" not in broker.log_text(), name
        finally:
            broker.kill()


def test_an_address_go_cannot_split_is_a_unix_socket_as_in_nsqd(tmp_path):
    """Go's SplitHostPort decides: a path with colons (too many to split) is a socket path;
    an empty port is any free port."""
    path = tmp_path / "a:b:c"
    proc = subprocess.Popen([sys.executable, "-m", "broker", f"--data-path={tmp_path}", f"--tcp-address={path}",
                             "--http-address=127.0.0.1:"], cwd=REPO, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        lines = []
        while not any("HTTP: listening" in line for line in lines):
            line = proc.stderr.readline()  # the broker's own log: it says when it listens
            assert line, "".join(lines)
            lines.append(line)
        messages = _messages("".join(lines))
        assert f"INFO: TCP: listening on {path}" in messages
        assert any(re.fullmatch(r"INFO: HTTP: listening on 127\.0\.0\.1:[1-9]\d*", m) for m in messages)
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(path))
            client.sendall(b"  V2NOP\nFOO\n")
            assert client.recv(100).startswith(b"\x00\x00\x00")  # E_INVALID, as over TCP
    finally:
        proc.kill()
        proc.wait(10)


def test_a_file_at_the_socket_path_is_never_removed(tmp_path):
    """A socket left by an earlier run is replaced; any other file stays, and the start is refused."""
    path = tmp_path / "precious.txt"
    path.write_bytes(b"not a socket")
    done = _run_broker(tmp_path / "data", f"--tcp-address={path}", "--http-address=127.0.0.1:0")
    assert done.returncode == 1
    assert [m for m in _messages(done.stderr) if m.startswith("FATAL")] == [
        f"FATAL: failed to instantiate nsqd - listen ({path}) failed - listen unix {path}: bind: "
        "address already in use"]
    assert path.read_bytes() == b"not a socket"
