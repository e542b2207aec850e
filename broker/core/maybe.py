"""``Maybe[T]``: a value now, or what to await for it.

The broker's hot paths finish most calls at once and only sometimes must wait (a durable
publish waits for its fsync, a keyed one for its key's journal, a publish under ``--replicas``
for its copies). A coroutine per call would cost every call what only some need, so such a
function is plain and returns either its result (``T``) or an awaitable of it; the caller
tells them apart by type (``type(x) is bytes``, ``isinstance(x, Response)``, ``x is None``)
and awaits only the second. ``Maybe[None]`` is "done, or what to await until it is".

The names say what such a function does, never ``_now`` or ``_nowait``: Trio's ``x_nowait``
raises :class:`trio.WouldBlock` where ``x`` would wait, which these do not.

Holds the type alias only; every layer from the core up imports it.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeAlias, TypeVar

__all__ = ["Maybe"]

T = TypeVar("T")

#: A result, or an awaitable of it (see the module docstring).
Maybe: TypeAlias = T | Awaitable[T]
