"""Spark finds the ``nsq`` data source after a regular and after an editable install.

Each test installs this checkout into a fresh virtual environment (sharing the
packages of the interpreter running the tests, which may itself be a virtual
environment, ``--no-deps``, so nothing is downloaded but the build backend's
setuptools) and runs Spark's own discovery code, ``lookup_data_sources._main``,
which lists ``pyspark_*`` modules on ``sys.path`` and registers their
``DefaultSource``: the code that answers ``spark.readStream.format("nsq")``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.installs import fresh_venv
from tests.support.paths import REPO

pytestmark = [pytest.mark.spark]

_LOOKUP = textwrap.dedent("""
    import io, json, pkgutil, struct
    from pyspark.sql.worker.lookup_data_sources import _main
    out = io.BytesIO()
    _main(None, out)
    data = out.getvalue()
    (count,), pos, names = struct.unpack_from(">i", data), 4, []
    for _ in range(count):
        (size,) = struct.unpack_from(">i", data, pos)
        names.append(data[pos + 4:pos + 4 + size].decode())
        (size,) = struct.unpack_from(">i", data, pos + 4 + size)
        pos += 8 + len(names[-1]) + size
    found = [m.module_finder.path for m in pkgutil.iter_modules() if m.name == "pyspark_nsq"]
    print(json.dumps({"sources": names, "pyspark_nsq": found[0] if found else None}))
""")


def _install(tmp_path: Path, *pip_args: str) -> dict:
    python = fresh_venv(tmp_path / "venv")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", *pip_args],
                   cwd=tmp_path, env=env, check=True, timeout=300)
    lookup = subprocess.run([str(python), "-c", _LOOKUP], cwd=tmp_path, env=env, check=True,
                            timeout=120, capture_output=True, text=True)
    return json.loads(lookup.stdout.splitlines()[-1])


def test_a_regular_install_is_discovered(tmp_path):
    found = _install(tmp_path, str(REPO))
    assert "nsq" in found["sources"]
    assert found["pyspark_nsq"] == str(tmp_path / "venv" / "lib" /
                                       f"python{sys.version_info.major}.{sys.version_info.minor}" /
                                       "site-packages")


def test_an_editable_install_is_discovered_and_is_the_checkout(tmp_path):
    found = _install(tmp_path, "-e", str(REPO))
    assert "nsq" in found["sources"]
    # the checkout's connector, not a copy installed elsewhere on the system
    assert found["pyspark_nsq"] == str(REPO / "build" / "__editable__.pynsqd")
    assert (Path(found["pyspark_nsq"]) / "pyspark_nsq").resolve() == REPO / "spark" / "pyspark_nsq"
