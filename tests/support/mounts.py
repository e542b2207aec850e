"""Small file systems for tests of disks that fill up or turn read-only (Linux, root only).

* :func:`tmpfs`: a tmpfs of a given size, optionally mounted read-only; the disk really
  answers ``ENOSPC`` (or ``EROFS``).
* :func:`fill`: a filler file that leaves a chosen number of bytes free, to be deleted when
  the test wants space back.
* :func:`ext4_image`: an ext4 file system in a loop-mounted image; :func:`abort_ext4` makes
  it read-only at once, files open for writing included, as the kernel does after an I/O
  error (``errors=remount-ro``). A tmpfs or bind mount cannot be remounted read-only while
  a file on it is open for writing.

Each context manager skips the test (``pytest.skip``) with the reason when the mount is not
possible here (not root, no ``mount``, no loop devices, no ``mkfs.ext4``), and unmounts on exit.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

__all__ = ["abort_ext4", "ext4_image", "fill", "free_bytes", "remount", "reset_ext4", "tmpfs"]

_TIMEOUT = 30


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=_TIMEOUT, check=False)


def _can_mount() -> str | None:
    """Why mounting is impossible here, or None."""
    if not sys.platform.startswith("linux"):
        return "mounting file systems needs Linux"
    if os.geteuid() != 0:
        return "mounting file systems needs root"
    if shutil.which("mount") is None:
        return "no mount command"
    return None


def _unmount(path: Path) -> None:
    if _run("umount", str(path)).returncode != 0:
        _run("umount", "-l", str(path))  # something still holds it open: detach it


@contextmanager
def _mounted(path: Path, what: str, *mount_args: str) -> Iterator[Path]:
    """``mount <mount_args> <path>`` on the new directory ``path`` while the block runs; skips the
    test ("cannot <what> here") when the mount fails."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = _run("mount", *mount_args, str(path))
    if mounted.returncode != 0:
        pytest.skip(f"cannot {what} here: {mounted.stderr.strip() or f'mount exited {mounted.returncode}'}")
    try:
        yield path
    finally:
        _unmount(path)


@contextmanager
def tmpfs(path: Path, size: str, *, read_only: bool = False) -> Iterator[Path]:
    """A tmpfs of ``size`` (``mount -o size=``, e.g. ``"3m"``) on the new directory ``path``."""
    reason = _can_mount()
    if reason is not None:
        pytest.skip(f"cannot mount a tmpfs here: {reason}")
    options = f"size={size}" + (",ro" if read_only else "")
    with _mounted(path, "mount a tmpfs", "-t", "tmpfs", "-o", options, "tmpfs"):
        yield path


def remount(path: Path, *, read_only: bool) -> None:
    """Remount the tmpfs at ``path`` read-only or read-write (fails while a file is open for writing)."""
    result = _run("mount", "-o", "remount," + ("ro" if read_only else "rw"), str(path))
    if result.returncode != 0:
        raise RuntimeError(f"remounting {path}: {result.stderr.strip()}")


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still write on the file system of ``path``."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(path: Path, leave: int) -> Path:
    """Create ``path`` (a filler file) so that about ``leave`` bytes stay free on its file system
    (none when someone else writes there meanwhile and the disk fills first)."""
    size = max(0, free_bytes(path.parent) - leave)
    chunk = b"\0" * (1 << 16)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        while size > 0:
            size -= os.write(fd, chunk[:size])
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
    finally:
        os.close(fd)
    return path


@contextmanager
def ext4_image(path: Path, size_mb: int = 32) -> Iterator[Path]:
    """An ext4 file system of ``size_mb`` MiB in an image file, loop-mounted on the new directory ``path``."""
    reason = _can_mount()
    if reason is None and shutil.which("mkfs.ext4") is None:
        reason = "no mkfs.ext4 (Debian: apt install e2fsprogs)"
    if reason is not None:
        pytest.skip(f"cannot mount an ext4 image here: {reason}")
    image = path.with_name(path.name + ".img")
    with open(image, "wb") as f:
        f.truncate(size_mb << 20)
    made = _run("mkfs.ext4", "-q", "-F", str(image))
    if made.returncode != 0:
        pytest.skip(f"cannot make an ext4 image here: {made.stderr.strip() or f'mkfs.ext4 exited {made.returncode}'}")
    with _mounted(path, "loop-mount an ext4 image", "-o", "loop,errors=remount-ro", str(image)):
        yield path


def abort_ext4(path: Path) -> None:
    """Make the ext4 file system at ``path`` read-only now, as an I/O error would (``mount -o remount,abort``):
    writes, fsyncs, creations and renames fail with ``EROFS``; reads still work."""
    result = _run("mount", "-o", "remount,abort", str(path))
    if result.returncode != 0:
        raise RuntimeError(f"aborting the ext4 file system at {path}: {result.stderr.strip()}")


def reset_ext4(path: Path) -> None:
    """Unmount the (aborted) ext4 file system at ``path`` and mount its image again, read-write."""
    image = path.with_name(path.name + ".img")
    _unmount(path)
    mounted = _run("mount", "-o", "loop,errors=remount-ro", str(image), str(path))
    if mounted.returncode != 0:
        raise RuntimeError(f"mounting {image} again: {mounted.stderr.strip()}")
