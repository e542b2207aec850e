"""pynsqd's version, and the nsqd version it answers as."""

from __future__ import annotations

__all__ = ["__version__", "NSQD_COMPAT_VERSION", "VERSION_TEXT"]

__version__ = "0.1.0"
# What the wire and HTTP ``version`` fields report, so tooling that checks nsqd's version works.
NSQD_COMPAT_VERSION = "1.3.0"
#: What ``--version`` prints.
VERSION_TEXT = f"pynsqd v{__version__} (nsqd {NSQD_COMPAT_VERSION} compatible)"
