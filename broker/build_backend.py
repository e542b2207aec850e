"""The project's build backend: setuptools', plus Spark discovery in editable installs.

Spark finds Python data sources by listing the top-level modules on ``sys.path``
(``pkgutil.iter_modules``) and registering the ``DefaultSource`` of each
``pyspark_*`` one. A regular install puts ``pyspark_nsq`` in site-packages, where
that listing sees it. An editable install (``pip install -e .``) of this layout,
where the connector lives in ``spark/pyspark_nsq`` beside ``broker/``, gets an
import hook from setuptools instead, which imports the packages but does not list
them, so ``spark.readStream.format("nsq")`` failed with ``DATA_SOURCE_NOT_FOUND``.

``build_editable`` therefore adds one more path entry to the editable wheel:
``build/__editable__.pynsqd`` in the checkout, a directory of symbolic links, one
per top-level package of ``[tool.setuptools] package-dir`` (``pyspark_nsq`` to
``spark/pyspark_nsq``, ...). Files added later are seen without reinstalling,
nothing else in the checkout becomes importable, and as an ordinary path entry it
comes before the system's site-packages, so an older copy installed there cannot
shadow the checkout. Where links cannot be made, the build fails with the reason.
"""

from __future__ import annotations

import base64
import hashlib
import os
import tomllib
import zipfile
from pathlib import Path

from setuptools import build_meta
from setuptools.build_meta import *  # noqa: F403  # every hook not overridden is setuptools'

_ROOT = Path(__file__).resolve().parents[1]
#: The path file added to editable wheels.
_PTH_NAME = "__editable__.pynsqd-links.pth"


def _discovery_dir() -> Path:
    """A directory of links to the checkout's top-level packages."""
    with open(_ROOT / "pyproject.toml", "rb") as file:
        packages = tomllib.load(file)["tool"]["setuptools"]["package-dir"]
    links = _ROOT / "build" / "__editable__.pynsqd"
    links.mkdir(parents=True, exist_ok=True)
    for name, source in packages.items():
        link = links / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(_ROOT / source, target_is_directory=True)
    return links


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _add_path_file(wheel: Path, entry: Path) -> None:
    """Rewrite ``wheel`` with a ``.pth`` file naming ``entry``, listed in its RECORD."""
    pth = (str(entry) + "\n").encode()
    rebuilt = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(wheel) as old, zipfile.ZipFile(rebuilt, "w", zipfile.ZIP_DEFLATED) as new:
        for item in old.infolist():
            data = old.read(item)
            if item.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines()
                lines.insert(len(lines) - 1, _record_line(_PTH_NAME, pth))
                data = ("\n".join(lines) + "\n").encode()
                new.writestr(_PTH_NAME, pth)
            new.writestr(item, data)
    os.replace(rebuilt, wheel)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """setuptools' editable wheel, plus the path entry that lets Spark list the connector.

    Raises OSError when the links cannot be made."""
    name = build_meta.build_editable(wheel_directory, config_settings, metadata_directory)
    _add_path_file(Path(wheel_directory, name), _discovery_dir())
    return name
