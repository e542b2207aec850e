"""pynsqd installs whole from a copy of the repository without ``.git``: a downloaded archive, or
a container build (``.dockerignore`` leaves ``.git`` out of the context).

In a git checkout setuptools-scm hands setuptools every tracked file; without ``.git`` a build
has only what ``pyproject.toml`` names: the packages (the build backend is one of their modules). The test copies the checkout's files
without ``.git``, builds a source distribution there and a wheel from it (as ``python -m build``
does), and a wheel straight from the copy (as ``pip install .`` in the image does); it checks
that each holds every module, then installs the first wheel into a fresh virtual environment and
imports every module from it, run from another directory so the checkout is never what is
imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

from tests.support.installs import checkout_files, copy_checkout, fresh_venv

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(checkout_files() is None,
                       reason="needs a git checkout: the copy is made of the files git tracks and would track"),
]

#: Where each top-level package's files are in the checkout.
_PACKAGES = {"broker": "broker", "diskqueue": "diskqueue", "pyspark_nsq": "spark/pyspark_nsq"}

_IMPORT_ALL = textwrap.dedent("""
    import importlib, importlib.util, json, sys
    found = {}
    for name in json.loads(sys.argv[1]):
        if name.endswith(".__main__"):  # importing it would run the program: found, not run
            found[name] = importlib.util.find_spec(name).origin
        else:
            found[name] = importlib.import_module(name).__file__
    print(json.dumps(found))
""")


def _package_files() -> dict[str, str]:
    """Every module of the packages: its path in the checkout -> its path once installed."""
    files = {}
    for name in checkout_files() or ():
        for package, where in _PACKAGES.items():
            if name.startswith(where + "/") and name.endswith(".py"):
                files[name] = package + name[len(where):]
    return files


def _module(installed_path: str) -> str:
    parts = installed_path[:-len(".py")].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_a_copy_without_git_builds_and_installs_every_module(tmp_path):
    files = _package_files()
    assert "broker/replication/replicator.py" in files and "spark/pyspark_nsq/datasource.py" in files
    source = copy_checkout(tmp_path / "source")
    assert not (source / ".git").exists()
    python = fresh_venv(tmp_path / "venv")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def run(*args: str | Path, cwd: Path = tmp_path) -> str:
        done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{args}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    run(python, "-m", "pip", "install", "-q", "build")
    run(python, "-m", "build", "--outdir", tmp_path / "dist", source)  # the sdist, then a wheel built from it
    run(python, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", tmp_path / "direct", source)

    (sdist,) = (tmp_path / "dist").glob("pynsqd-*.tar.gz")
    with tarfile.open(sdist) as archive:
        in_sdist = {member.name.partition("/")[2] for member in archive.getmembers()}
    assert not {*files, "pyproject.toml", "README.md", "broker/build_backend.py"} - in_sdist
    for wheel in [*(tmp_path / "dist").glob("*.whl"), *(tmp_path / "direct").glob("*.whl")]:
        with zipfile.ZipFile(wheel) as archive:
            assert not set(files.values()) - set(archive.namelist()), wheel

    (from_sdist,) = (tmp_path / "dist").glob("*.whl")
    # --ignore-installed: the interpreter running the tests may hold a pynsqd of the same version
    run(python, "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed", from_sdist)
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    modules = sorted(_module(path) for path in files.values())
    origins = json.loads(run(python, "-c", _IMPORT_ALL, json.dumps(modules)).splitlines()[-1])
    assert {name: Path(origin).relative_to(site).as_posix() for name, origin in origins.items()} == \
        {_module(path): path for path in files.values()}
    usage = run(tmp_path / "venv" / "bin" / "pynsqd", "--help")
    assert usage.startswith("Usage of pynsqd:\n")
