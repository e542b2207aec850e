"""A damaged ``nsqd.dat``: pynsqd refuses to start with nsqd's one FATAL line, and keeps the file.

Each case puts a damaged metadata file beside a topic's disk queue, then starts a real
``pynsqd`` on it: it must exit with status 1 after exactly one FATAL line, never a traceback,
and leave the data directory as it found it (the damaged file is evidence; nsqd does not
overwrite it either). The FATAL text is nsqd 1.3.0's for the same file, word for word:
checked against the expected text always, and against the real nsqd run on a copy of the
same directory when nsq's programs are here.
"""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from diskqueue import DiskQueue
from tests.support.paths import nsq_bin
from tests.support.processes import Exited, run_to_exit

VALID = json.dumps({"topics": [{"channels": [{"name": "billing", "paused": False}], "name": "orders",
                                "paused": False}], "version": "1.3.0"}, separators=(",", ":")).encode()
#: Bigger than anything pynsqd reads before it knows the file is damaged.
HUGE = 128 << 20


def _write(content: bytes):
    return lambda path: path.write_bytes(content)


def _huge_zeros(path: Path) -> None:
    with open(path, "wb") as f:  # sparse: costs no disk
        f.truncate(HUGE)


#: case -> (how to damage nsqd.dat, what nsqd 1.3.0 says after "failed to load metadata - ")
CASES = {
    "random-bytes": (_write(random.Random(1).randbytes(4096)),
                     "failed to parse metadata in {path} - invalid character 'õ' looking for beginning of value"),
    "truncated": (_write(VALID[: VALID.index(b"billing") + 3]), "failed to parse metadata in {path} - unexpected end of JSON input"),
    "wrong-shape": (_write(b'{"topics": {"orders": ["billing"]}, "version": "1.3.0"}'),
                    "failed to parse metadata in {path} - json: cannot unmarshal object into Go struct field "
                    "Metadata.topics of type []nsqd.TopicMetadata"),
    "wrong-type": (_write(VALID.replace(b'"paused":false}],', b'"paused":"no"}],')),
                   "failed to parse metadata in {path} - json: cannot unmarshal string into Go struct field "
                   "ChannelMetadata.topics.channels.paused of type bool"),
    "zeroed-block": (_write(bytes(4096)),
                     "failed to parse metadata in {path} - invalid character '\\x00' looking for beginning of value"),
    "huge": (_huge_zeros,
             "failed to parse metadata in {path} - invalid character '\\x00' looking for beginning of value"),
    "empty": (_write(b""), "failed to parse metadata in {path} - unexpected end of JSON input"),
    "directory": (lambda path: path.mkdir(),
                  "failed to read metadata from {path} - read {path}: is a directory"),
}


def _snapshot(data: Path) -> dict[str, tuple[int, int, int]]:
    """Every entry of the directory: inode, size, modification time (a rewrite changes one of them)."""
    return {entry.name: (entry.stat().st_ino, entry.stat().st_size, entry.stat().st_mtime_ns)
            for entry in sorted(data.iterdir())}


async def _data_directory(path: Path, damage) -> Path:
    path.mkdir(parents=True)
    queue = DiskQueue("orders", path)
    queue.put_many([b"m%d" % i for i in range(10)])
    await queue.close()
    damage(path / "nsqd.dat")
    return path


async def test_damaged_metadata_is_refused_with_nsqds_fatal_line_and_kept(tmp_path: Path) -> None:
    directories = {case: await _data_directory(tmp_path / case, damage) for case, (damage, _) in CASES.items()}
    before = {case: _snapshot(data) for case, data in directories.items()}
    nsqd = nsq_bin()
    copies = {}
    if nsqd is not None:  # the same damage in a directory of its own for nsqd
        copies = {case: await _data_directory(tmp_path / "nsqd" / case, damage) for case, (damage, _) in CASES.items()}
    with ThreadPoolExecutor(max_workers=4) as pool:
        runs = {case: pool.submit(run_to_exit, data) for case, data in directories.items()}
        references = {case: pool.submit(run_to_exit, data, program=[str(nsqd / "nsqd")], timeout=60)
                      for case, data in copies.items()}
        exited: dict[str, Exited] = {case: run.result() for case, run in runs.items()}

    for case, run in exited.items():
        path = directories[case] / "nsqd.dat"
        expected = "failed to load metadata - " + CASES[case][1].format(path=path)
        assert (run.status, run.fatal_lines) == (1, [expected]), (case, run.output)
        assert "Traceback" not in run.output, case
        assert _snapshot(directories[case]) == before[case], case  # nothing rewritten, nothing added
    # the huge file was not read whole: what it starts with was enough
    assert exited["huge"].max_rss < HUGE // 2, exited["huge"].max_rss
    for case, reference in references.items():
        said = reference.result()
        assert said.status == 1, (case, said.output)
        assert said.fatal_lines == [line.replace(str(directories[case]), str(copies[case]))
                                    for line in exited[case].fatal_lines], case
