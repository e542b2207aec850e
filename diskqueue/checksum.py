"""CRC-32C (Castagnoli), the record checksum.

CRC-32C is computed in hardware by the ``crc32c`` package (SSE4.2 / ARMv8 CRC
instructions): about 100 ns for a 100-byte payload, a third of zlib's CRC-32, which
matters because every record read is verified. Without the package a table-driven
pure-Python implementation of the same function keeps every file readable and writable,
only much slower; ``ACCELERATED`` says which one is in use.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import logging
import os
from typing import Protocol

__all__ = ["ACCELERATED", "Checksum", "crc32c", "software_crc32c", "warn_if_slow"]

class Checksum(Protocol):
    """The shape of the CRC-32C function: bytes, and the CRC to continue from (0 starts one)."""

    def __call__(self, data: bytes | bytearray | memoryview, value: int = 0, /) -> int: ...


_POLY = 0x82F63B78  # CRC-32C, reflected


def _table() -> list[int]:
    table = []
    for n in range(256):
        crc = n
        for _ in range(8):
            crc = (crc >> 1) ^ _POLY if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _table()


def software_crc32c(data: bytes | bytearray | memoryview, value: int = 0, /) -> int:
    """CRC-32C of ``data`` continuing from the CRC ``value`` (0 starts a new one)."""
    table = _TABLE
    crc = value ^ 0xFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _accelerated() -> Checksum | None:
    """The ``crc32c`` package's function, or None without the package.

    Its extension module is loaded by itself when it can be: the package's ``__init__``
    reads its own version from the installed metadata, which costs a start 20–40 ms
    (``importlib.metadata`` and the ``email`` package), more than the rest of the disk queue.
    """
    spec = importlib.util.find_spec("crc32c")
    if spec is None:
        return None
    for folder in spec.submodule_search_locations or ():
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(folder, "_crc32c" + suffix)
            loader = importlib.machinery.ExtensionFileLoader("crc32c._crc32c", path)
            extension = importlib.util.spec_from_file_location("crc32c._crc32c", path, loader=loader)
            if extension is None:
                continue
            try:
                module = importlib.util.module_from_spec(extension)
                loader.exec_module(module)
            except (ImportError, OSError):  # not this suffix; the package's own import is the fallback
                continue
            function: Checksum = module.crc32c
            return function
    from crc32c import crc32c as packaged

    return packaged


_found = _accelerated()
ACCELERATED = _found is not None
crc32c: Checksum = _found if _found is not None else software_crc32c


_warned = False


def warn_if_slow(log: logging.Logger) -> None:
    """Log once per process that checksums run in pure Python (the package is missing)."""
    global _warned
    if not ACCELERATED and not _warned:
        _warned = True
        log.warning("the crc32c package is not installed: disk queue checksums run in pure "
                    "Python, many times slower; install crc32c")
