"""The shell examples of the documents (README.md and the folders' README.md files), run as
written against a real broker.

A block fenced ```` ```sh ```` is run; one fenced ```` ```sh no-test ```` is not (it runs for
long, installs things, starts a broker of its own or needs Spark). Each runnable block gets a
fresh ``pynsqd`` process on ephemeral ports; ``127.0.0.1:4150``/``:4151`` in the block become
its addresses. The block runs under ``bash -euo pipefail`` in a temporary directory that looks
like a checkout after the README's set-up (the repository's files, and ``data`` as the broker's
data directory), whichever document it is in, with ``python``, ``python3`` and ``pynsqd``
(also as ``.venv/bin/...``) meaning this interpreter and this code, and ``curl`` failing on an
HTTP error status. A ``# => TEXT`` comment in a block means its output contains TEXT.

Every document's links to other documents and to their sections must lead somewhere, README.md
stays a first look (under 400 lines), and no document with shell blocks is left out of
:data:`DOCUMENTS`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.installs import checkout_files
from tests.support.nsq_programs import nsq_bin, nsq_bin_missing
from tests.support.paths import DEPLOY, REPO
from tests.support.waiting import wait_sync

#: The documents: README.md for a first look, and one beside the code of each folder.
DOCUMENTS = (
    "README.md",
    "deploy/README.md",
    "broker/protocol/README.md",
    "spark/README.md",
    "tests/README.md",
    "broker/README.md",
    "diskqueue/README.md",
)
README_LINES_UNDER = 400
BLOCK_TIMEOUT = 60
_FENCE = re.compile(r"^```(\S*)(.*)$")
_SHELLS = {"sh", "bash", "shell"}
_EXPECT = re.compile(r"#\s*=>\s*(.+?)\s*$")
_ADDRESS = re.compile(r"\b(?:127\.0\.0\.1|localhost):(4150|4151)\b")


@dataclass(frozen=True)
class ShellBlock:
    """One fenced shell block of a document: where it starts, its text, and whether it runs."""

    document: str
    line: int
    text: str
    runnable: bool

    @property
    def expected(self) -> list[str]:
        """The texts that ``# => TEXT`` comments say the block prints, in order."""
        return [m.group(1) for m in map(_EXPECT.search, self.text.splitlines()) if m]


def shell_blocks(document: str) -> list[ShellBlock]:
    """Every fenced shell block of ``document`` (a path relative to the repository)."""
    path = REPO / document
    if not path.exists():
        return []
    blocks: list[ShellBlock] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1  # past the closing fence
        if fence.group(1) in _SHELLS:
            runnable = "no-test" not in fence.group(2).split()
            blocks.append(ShellBlock(document, start + 1, "\n".join(body) + "\n", runnable))
    return blocks


RUNNABLE = [block for document in DOCUMENTS for block in shell_blocks(document) if block.runnable]


def _shims(directory: Path) -> Path:
    """Commands the documents use, bound to this interpreter and this checkout's code.

    They live in ``.venv/bin`` of the working directory, where the set-up puts them, so a
    block may call ``.venv/bin/python`` as well as ``python`` from the activated venv.
    """
    directory.mkdir(parents=True)
    curl = shutil.which("curl") or "curl"
    scripts = {
        "python": f'exec {shlex.quote(sys.executable)} "$@"',
        "python3": f'exec {shlex.quote(sys.executable)} "$@"',
        "pynsqd": f'exec {shlex.quote(sys.executable)} -m broker "$@"',
        # A documented request that answers an error status must fail the block.
        "curl": f'exec {shlex.quote(curl)} --silent --show-error --fail-with-body "$@"',
    }
    for name, line in scripts.items():
        script = directory / name
        script.write_text(f"#!/bin/sh\n{line}\n")
        script.chmod(0o755)
    return directory


def _checkout(workdir: Path) -> None:
    """Make ``workdir`` look like the repository after set-up: its files, and ``data``."""
    for entry in REPO.iterdir():
        if entry.name not in {".git", "data", ".venv"} and not (workdir / entry.name).exists():
            (workdir / entry.name).symlink_to(entry)


def prepare_block(text: str, broker, workdir: Path, env: dict[str, str] | None = None) -> tuple[str, dict[str, str]]:
    """A documented block's ``text`` as it runs against ``broker`` (its addresses in place of
    ``127.0.0.1:4150``/``:4151``) in ``workdir``, made to look like a checkout after set-up, and
    the environment to run it in: ``env`` (by default this process's) with the documents'
    commands first on ``PATH``."""
    _checkout(workdir)
    tcp, http = (f"{host}:{port}" for host, port in (broker.tcp, broker.http))
    script = _ADDRESS.sub(lambda m: tcp if m.group(1) == "4150" else http, text)
    env = dict(os.environ if env is None else env)
    env["PATH"] = f"{_shims(workdir / '.venv' / 'bin')}{os.pathsep}{env.get('PATH', '')}"
    return script, env


def assert_prints_expected(block: ShellBlock, stdout: str, report: str) -> None:
    """Assert that ``stdout`` holds the texts of ``block``'s ``# => TEXT`` comments, in order."""
    position = 0
    for expected in block.expected:
        found = stdout.find(expected, position)
        assert found >= 0, f"expected {expected!r}\n{report}"
        position = found + len(expected)


def test_the_documents_have_runnable_examples():
    """The extraction finds the documents' blocks; an empty parametrization would pass silently."""
    assert [document for document in DOCUMENTS if not (REPO / document).is_file()] == []
    readme = [block for block in RUNNABLE if block.document == "README.md"]
    assert any("# => OK" in block.text for block in readme)
    for document in ("deploy/README.md", "broker/protocol/README.md", "spark/README.md", "tests/README.md"):
        assert any(block.document == document for block in RUNNABLE), document
    assert len(RUNNABLE) >= 9


def repository_documents() -> list[str]:
    """Every Markdown document of the repository, relative to it: as git sees them (tracked, or
    new and not ignored), or, outside a git checkout, every ``*.md`` but in hidden, build and
    dependency folders."""
    files = checkout_files()
    if files is None:
        skipped = {"node_modules", "build", "dist"}
        files = tuple(path.relative_to(REPO).as_posix() for path in REPO.rglob("*.md")
                      if not any(part.startswith(".") or part in skipped for part in path.relative_to(REPO).parts[:-1]))
    return sorted(name for name in files if name.endswith(".md"))


def test_every_document_with_shell_blocks_is_run():
    """A document with a shell block is one of DOCUMENTS, so a new document's examples cannot
    escape this file's run."""
    with_blocks = [document for document in repository_documents() if shell_blocks(document)]
    assert "README.md" in with_blocks
    assert sorted(set(with_blocks) - set(DOCUMENTS)) == []


def test_the_readme_stays_a_first_look():
    """README.md is a newcomer's first screen and what follows it; the rest is in the folders'
    documents."""
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) < README_LINES_UNDER, f"README.md has {len(lines)} lines"


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def heading_anchors(document: str) -> set[str]:
    """The anchors GitHub gives the headings of ``document`` (outside code blocks): lower case,
    punctuation but ``-`` and ``_`` dropped, spaces as ``-``, a repeated one numbered."""
    anchors: set[str] = set()
    in_code = False
    for line in (REPO / document).read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (heading := re.match(r"#{1,6} (.+)", line)):
            anchor = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            numbered, n = anchor, 0
            while numbered in anchors:
                n += 1
                numbered = f"{anchor}-{n}"
            anchors.add(numbered)
    return anchors


def test_every_link_of_the_documents_leads_somewhere():
    """Each relative link of a document names a file of the repository and, for a section, a
    heading of that document: a section that moves to another document takes its links along."""
    broken = []
    for document in DOCUMENTS:
        text = re.sub(r"(?ms)^```.*?^```", "", (REPO / document).read_text())
        for target in _LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # https://, mailto:
            path, _, anchor = target.partition("#")
            linked = (REPO / document).parent / path if path else REPO / document
            if not linked.exists():
                broken.append(f"{document}: {target} (no such file)")
            elif anchor and anchor not in heading_anchors(linked.resolve().relative_to(REPO).as_posix()):
                broken.append(f"{document}: {target} (no such section)")
    assert broken == []


@pytest.mark.parametrize("block", RUNNABLE, ids=[f"{b.document}:{b.line}" for b in RUNNABLE])
def test_documented_block_runs(block: ShellBlock, broker_process, tmp_path):
    broker = broker_process()
    assert broker.data_path == tmp_path / "data"
    script, env = prepare_block(block.text, broker, tmp_path)
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=BLOCK_TIMEOUT, stdin=subprocess.DEVNULL,
    )
    report = f"{block.document}:{block.line}\n{script}\nexit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert result.returncode == 0, report
    assert_prints_expected(block, result.stdout, report)


def _run_pasted(block: ShellBlock, ports: tuple[int, ...], workdir: Path, timeout: float = BLOCK_TIMEOUT) -> str:
    """Run a block that starts programs of its own on fixed ``ports``, as pasted into a shell with
    nsq's programs on the PATH, in a checkout at ``workdir``; its output. Skips when nsq's
    programs are missing or a port is taken; stops everything the block started."""
    if reason := nsq_bin_missing():
        pytest.skip(reason)
    for port in ports:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the programs bind: TIME_WAIT is no listener
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                pytest.skip(f"port {port} of the example is taken (a broker of the README's set-up running?)")
    _checkout(workdir)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(_shims(workdir / ".venv" / "bin")), str(nsq_bin()), env.get("PATH", "")])
    # files, not pipes: the background programs keep their output open after the shell exits
    with open(workdir / "out", "w") as out_file, open(workdir / "err", "w") as err_file:
        shell = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", block.text], cwd=workdir, env=env, start_new_session=True,
            stdout=out_file, stderr=err_file, stdin=subprocess.DEVNULL,
        )
        try:
            shell.wait(timeout=timeout)
        finally:
            _stop_group(shell.pid)
    out, err = (workdir / "out").read_text(), (workdir / "err").read_text()
    assert shell.returncode == 0, f"exit {shell.returncode}\n{out}\n{err}"
    return out


def _stop_group(group: int, grace: float = 20.0) -> None:
    """SIGTERM the block's session (its background programs share it) once, and wait until every
    process of it ended (SIGKILL after ``grace`` seconds), so their ports are free again."""
    deadline = time.monotonic() + grace
    sig: int = signal.SIGTERM
    while True:
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            return
        sig = signal.SIGKILL if time.monotonic() > deadline else 0  # 0: only ask whether any is left
        time.sleep(0.05)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(-group, os.WNOHANG)  # reap the shell itself


def test_the_cluster_block_runs_as_pasted(tmp_path):
    """deploy/README.md's local cluster, pasted into a shell with nsq's programs on the PATH: three
    nodes on their fixed ports, nsqlookupd and nsqadmin; its curls wait for the listeners and
    nsq_tail prints the message through nsqlookupd. Everything the block started is stopped."""
    [block] = [b for b in shell_blocks("deploy/README.md") if "deploy/cluster/node-$node.toml" in b.text]
    out = _run_pasted(block, (4150, 4151, 4160, 4161, 4171, 4250, 4251, 4350, 4351), tmp_path)
    assert '"broadcast_address":"127.0.0.1"' in out and '"http_port":4251' in out, out
    assert out.rstrip().endswith("hello"), out
    assert sorted(p.name for p in tmp_path.glob("data-*")) == ["data-a", "data-b", "data-c"]


def test_the_replication_walkthrough_runs_as_pasted(tmp_path):
    """deploy/README.md's replication walkthrough as pasted: its own nsqlookupd and secret, three nodes
    with --replicas=2, a publish retried until acknowledged, one node holding its copy, node 1
    killed and the message read through nsqlookupd from the node that took it over."""
    [block] = [b for b in shell_blocks("deploy/README.md") if "--replication-secret-file=replication.secret" in b.text]
    out = _run_pasted(block, (4150, 4151, 4160, 4161, 4250, 4251, 4350, 4351), tmp_path, timeout=120)
    assert out.startswith("published hello"), out
    assert sorted(line for line in out.splitlines() if line.startswith("copies held")) == [
        "copies held: 0", "copies held: 1"], out
    assert out.rstrip().endswith("hello"), out
    assert (tmp_path / "replication.secret").stat().st_mode & 0o777 == 0o600


def test_the_tls_blocks_run_as_pasted(tmp_path):
    """deploy/README.md's TLS try-out: the openssl line makes a pair the broker starts with, and the
    client block publishes over HTTPS and consumes over TLS, checking the certificate."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    [start] = [b for b in shell_blocks("deploy/README.md") if "openssl req" in b.text]
    [client] = [b for b in shell_blocks("deploy/README.md") if "tls_v1=True" in b.text]
    _checkout(tmp_path)
    env = dict(os.environ)
    env["PATH"] = f"{_shims(tmp_path / '.venv' / 'bin')}{os.pathsep}{env.get('PATH', '')}"
    certificate, broker_line = start.text.rstrip().rsplit("\n", 1)
    assert broker_line.startswith("pynsqd "), start.text
    subprocess.run(["bash", "-euo", "pipefail", "-c", certificate], cwd=tmp_path, env=env, check=True,
                   capture_output=True, timeout=BLOCK_TIMEOUT)
    # the documented command on ephemeral ports; its log gives the ports it took
    broker_line = re.sub(r"127\.0\.0\.1:415[0-2]", "127.0.0.1:0", broker_line)
    broker_line += " --tcp-address=127.0.0.1:0 --http-address=127.0.0.1:0"
    log_path = tmp_path / "broker.log"
    with open(log_path, "w") as log:
        broker = subprocess.Popen(["bash", "-c", f"exec {broker_line}"], cwd=tmp_path, env=env,
                                  stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        def three_listeners() -> dict[str, str] | None:  # once the log names them
            assert broker.poll() is None, log_path.read_text()
            found = dict(re.findall(r"(TCP|HTTPS|HTTP): listening on (\S+)", log_path.read_text()))
            return found if len(found) == 3 else None

        listening = wait_sync(three_listeners, BLOCK_TIMEOUT, report=log_path.read_text)
        script = client.text.replace("127.0.0.1:4150", listening["TCP"]).replace("127.0.0.1:4152", listening["HTTPS"])
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=BLOCK_TIMEOUT, stdin=subprocess.DEVNULL)
    finally:
        broker.terminate()
        broker.wait(timeout=BLOCK_TIMEOUT)
    report = f"exit {result.returncode}\n{result.stdout}\n{result.stderr}\n{log_path.read_text()}"
    assert result.returncode == 0, report
    assert result.stdout.startswith("OK") and "over TLS: hello over TLS" in result.stdout, report
    assert "upgrading connection to TLS" in log_path.read_text(), report


def test_the_deploy_config_starts_a_broker(broker_process):
    """deploy/pynsqd.toml as shipped is a config the broker starts with."""
    broker = broker_process(f"--config={DEPLOY / 'pynsqd.toml'}")
    assert broker.terminate() == 0
    assert "FATAL" not in broker.log_text()


def test_deploy_installs_into_the_virtual_environment_it_runs_from():
    """The unit's and the image's install steps create the venv their command starts from."""
    unit = (DEPLOY / "pynsqd.service").read_text()
    venv = re.search(r"python3 -m venv (\S+)", unit).group(1)
    assert f"{venv}/bin/pip install" in unit
    assert re.search(rf"(?m)^ExecStart={re.escape(venv)}/bin/pynsqd ", unit)
    image = (DEPLOY / "Containerfile").read_text()
    venv = re.search(r"python3? -m venv (\S+)", image).group(1)
    assert f"{venv}/bin/pip install" in image
    assert re.search(rf'(?m)^ENTRYPOINT \["{re.escape(venv)}/bin/pynsqd"\]$', image)
