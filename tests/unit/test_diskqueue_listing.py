"""Opening many queues from one listing of their directory (``DirectoryListing``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from diskqueue import DirectoryListing, DiskQueue, fileops
from diskqueue.__main__ import main as check_main
from diskqueue.check import check
from diskqueue.format import meta_filename, segment_filename
from tests.support.diskqueues import read_all

#: queue names as a broker makes them, one holding the file names' own infix
NAMES = ["t", "t:c", "t:c#buried", "a.b", "x.diskqueue.000000.dat", "q"]


@contextmanager
def counted_listings(directory: Path) -> Iterator[list[str]]:
    """Every listing of ``directory`` made through the disk queue's file operations."""
    made: list[str] = []
    real = fileops.listdir

    def listdir(path=".") -> list[str]:
        if os.path.realpath(os.fspath(path)) == os.path.realpath(directory):
            made.append(os.fspath(path))
        return real(path)

    previous = fileops.substitute({"listdir": listdir})
    try:
        yield made
    finally:
        fileops.substitute(previous)


async def populate(path: Path, names: list[str], records: int = 3) -> None:
    """Queues ``names`` in ``path``, each with ``records`` records, one read and committed."""
    for name in names:
        q = DiskQueue(name, path, max_bytes_per_file=200)
        q.put_many([f"{name}-{i}".encode().ljust(40, b".") for i in range(records)])
        q.read_many(1)
        await q.close()


async def test_queues_opened_from_one_listing_hold_what_they_hold_alone(tmp_path: Path) -> None:
    await populate(tmp_path, NAMES)
    (tmp_path / (meta_filename("q") + ".tmp")).write_bytes(b"left by a killed process")
    (tmp_path / "unrelated.txt").write_bytes(b"not a queue file")
    with counted_listings(tmp_path) as made:
        listing = DirectoryListing(tmp_path)
        queues = [DiskQueue(name, tmp_path, max_bytes_per_file=200, listing=listing) for name in NAMES]
        fresh = DiskQueue("new", tmp_path, listing=listing)
    assert len(made) == 1
    for name, q in zip(NAMES, queues, strict=True):
        assert read_all(q) == [f"{name}-{i}".encode().ljust(40, b".") for i in (1, 2)], name
        await q.close()
    assert fresh.depth == 0
    fresh.put(b"written after opening")
    await fresh.close()
    # the stale temporary checkpoint the listing showed was removed, as a listing of its own would
    assert not (tmp_path / (meta_filename("q") + ".tmp")).exists()
    assert read_all(DiskQueue("new", tmp_path)) == [b"written after opening"]


async def test_a_name_handed_out_once_is_listed_again(tmp_path: Path) -> None:
    await populate(tmp_path, ["t"])
    listing = DirectoryListing(tmp_path)
    q = DiskQueue("t", tmp_path, max_bytes_per_file=200, listing=listing)
    q.put_many([b"more"] * 20)  # new segments the listing never saw
    q.read_many(1)
    await q.close()
    assert listing.take("t") is None and listing.peek("t") is None
    with counted_listings(tmp_path) as made:
        again = DiskQueue("t", tmp_path, max_bytes_per_file=200, listing=listing)
    assert len(made) == 1
    assert len(read_all(again)) == 2 + 20 - 1  # two left by populate, twenty added, one read
    await again.close()


async def test_a_listing_of_another_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with pytest.raises(ValueError, match="listing"):
        DiskQueue("t", tmp_path / "b", listing=DirectoryListing(tmp_path / "a"))
    with pytest.raises(ValueError, match="listing"):
        check(tmp_path / "b", "t", listing=DirectoryListing(tmp_path / "a"))


async def test_names_are_the_queues_with_segments_or_checkpoints(tmp_path: Path) -> None:
    await populate(tmp_path, NAMES)
    (tmp_path / (segment_filename("gone", 0) + ".bad")).write_bytes(b"set aside")
    (tmp_path / (meta_filename("stray") + ".tmp")).write_bytes(b"temporary")
    assert DirectoryListing(tmp_path).names() == sorted(NAMES)


async def test_checking_every_queue_lists_the_directory_once(tmp_path: Path, capsys) -> None:
    names = [f"topic{i}" for i in range(200)] + NAMES
    await populate(tmp_path, names)
    with counted_listings(tmp_path) as made:
        assert check_main([str(tmp_path)]) == 0
    assert len(made) == 1
    out = capsys.readouterr().out
    assert out.count(": OK") == len(names)
    listing = DirectoryListing(tmp_path)
    for name in NAMES:
        assert check(tmp_path, name, listing=listing) == check(tmp_path, name), name
