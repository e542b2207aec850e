"""Copies of the checkout and virtual environments to install it into, as a user or an image build does."""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
import venv
from functools import cache
from pathlib import Path

from tests.support.paths import REPO

__all__ = ["checkout_files", "copy_checkout", "fresh_venv"]


@cache
def checkout_files() -> tuple[str, ...] | None:
    """The repository's files as git sees them: tracked, and new ones it does not ignore (what
    a commit of the working tree would hold), relative to ``REPO``; None outside a git checkout."""
    try:
        listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return tuple(sorted(name for name in listed.decode().split("\0") if name and (REPO / name).is_file()))


def copy_checkout(target: Path) -> Path:
    """Copy :func:`checkout_files` (not ``.git``) into ``target``: a downloaded archive of the
    repository, or the context of a container build. Returns ``target``."""
    files = checkout_files()
    assert files is not None, "not a git checkout"
    for name in files:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target / name)
    return target


def fresh_venv(env_dir: Path) -> Path:
    """A new virtual environment with pip that also sees the packages of the interpreter running
    the tests (so nothing but build tools is downloaded); returns its ``python``."""
    venv.EnvBuilder(system_site_packages=True, with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    # system_site_packages shares the base interpreter's packages; when the tests run in a
    # virtual environment, the dependencies are in that one's site-packages instead, so add it too.
    inner = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    outer = sysconfig.get_paths()["purelib"]
    if outer != inner:
        Path(inner, "outer-environment.pth").write_text(outer + "\n")
    return python
