"""A request target as Go's server reads it: the decoded path and the raw query.

Origin form (``/pub?topic=t``) and absolute form (``http://host/pub?topic=t``) are read
alike; ``%XX`` escapes in the path are decoded (``+`` is kept), and a bad escape makes the
target unreadable (``400``). Distinct targets are kept decoded, up to a number and a
length, since clients send the same few again and again.

A pure function with a bounded cache: :mod:`broker.http.connection` calls it.
"""

from __future__ import annotations

import re

__all__ = ["split_target", "DECODED"]

#: Distinct request targets whose decoded path and query are kept, up to this length.
_CACHED_TARGETS = 1024
_CACHED_TARGET_BYTES = 512
_PERCENT = re.compile(rb"%([0-9A-Fa-f]{2})")
#: The targets decoded so far (None: a bad escape), for a lookup that costs no call; filled
#: by :func:`split_target`.
DECODED: dict[bytes, tuple[str, str] | None] = {}


def _decode_path(raw: bytes) -> str | None:
    """Go's path unescaping: ``%XX`` decoded, ``+`` kept; None for a bad escape."""
    if b"%" in raw:
        if raw.count(b"%") != len(_PERCENT.findall(raw)):
            return None
        raw = _PERCENT.sub(lambda m: bytes((int(m.group(1), 16),)), raw)
    return raw.decode("utf-8", "surrogateescape")


def _path_and_query(target: bytes) -> tuple[bytes, bytes]:
    """(path, raw query) of an origin-form or absolute-form request target."""
    if not target.startswith(b"/"):
        scheme, sep, rest = target.partition(b"://")
        if sep:
            slash = rest.find(b"/")
            question = rest.find(b"?")
            if slash == -1 or (question != -1 and question < slash):
                target = b"/" + rest[question:] if question != -1 else b"/"
            else:
                target = rest[slash:]
    path, _, query = target.partition(b"?")
    return path, query


def split_target(target: bytes) -> tuple[str, str] | None:
    """(decoded path, raw query) of a request target; None for a bad escape."""
    try:
        return DECODED[target]
    except KeyError:
        pass
    raw_path, raw_query = _path_and_query(target)
    path = _decode_path(raw_path)
    found = None if path is None else (path, raw_query.decode("utf-8", "surrogateescape"))
    if len(target) <= _CACHED_TARGET_BYTES:
        if len(DECODED) >= _CACHED_TARGETS:
            DECODED.clear()
        DECODED[target] = found
    return found
