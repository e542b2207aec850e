"""A run of ``FIN`` lines, recognised and taken apart without a split per line.

FIN is the hot path of a consumer: a client acknowledging a window of messages sends a run
of identical-looking lines, ``"FIN " + a 16-byte id + "\n"`` (an id with no space or
newline, not ending in ``"\r"``, which the general path would strip). A run is found and
its ids taken without the per-line split and dispatch: a chunk of nothing but such lines is
checked with strided slices (C loops), anything else by one regex match; the ids come out
of one struct unpack per 1024 lines. :class:`~broker.protocol.connection.ServerConnection`
uses it where FIN is legal.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from functools import lru_cache

from .commands import Fin
from .frames import MSG_ID_LENGTH

__all__ = ["FIN_LINE", "fin_run_end", "fin_ids", "new_fins"]

#: The bytes of one well-formed FIN line.
FIN_LINE = 4 + MSG_ID_LENGTH + 1
_FIN_RUN = re.compile(rb"(?:FIN [^ \n]{%d}[^ \n\r]\n)+" % (MSG_ID_LENGTH - 1))
_FIN_PIECE = 1024
_new = object.__new__
# A frozen dataclass __init__ sets each field through object.__setattr__; the slot
# descriptor stores the same field directly.
_set_fin_id = Fin.__dict__["msg_id"].__set__


def new_fins(ids: list[bytes]) -> list[Fin]:
    """``[Fin(msg_id) for msg_id in ids]``, built without the frozen dataclass's ``__init__``."""
    fins: list[Fin] = []
    append = fins.append
    for msg_id in ids:
        event = _new(Fin)
        _set_fin_id(event, msg_id)
        append(event)
    return fins


def fin_run_end(data: bytes, pos: int, end: int) -> int:
    """Where the run of well-formed FIN lines that starts at ``pos`` ends (``pos``: no run)."""
    count = (end - pos) // FIN_LINE
    if count > 1:
        stop = pos + count * FIN_LINE
        lines = data[pos:stop]
        if (lines[FIN_LINE - 1::FIN_LINE] == b"\n" * count and lines[0::FIN_LINE] == b"F" * count
                and lines[1::FIN_LINE] == b"I" * count and lines[2::FIN_LINE] == b"N" * count
                and lines[3::FIN_LINE] == b" " * count and lines.count(b" ") == count
                and lines.count(b"\n") == count and b"\r" not in lines[FIN_LINE - 2::FIN_LINE]):
            return stop
    run = _FIN_RUN.match(data, pos, end)
    return run.end() if run is not None else pos


@lru_cache(maxsize=32)
def _fin_ids_unpacker(count: int) -> Callable[[bytes, int], tuple[bytes, ...]]:
    return struct.Struct(("4x%dsx" % MSG_ID_LENGTH) * count).unpack_from


def fin_ids(data: bytes, pos: int, stop: int) -> list[bytes]:
    """The ids of the well-formed FIN lines in ``data[pos:stop]``."""
    count = (stop - pos) // FIN_LINE
    ids: list[bytes] = []
    while count:
        piece = min(count, _FIN_PIECE)
        ids.extend(_fin_ids_unpacker(piece)(data, pos))
        pos += piece * FIN_LINE
        count -= piece
    return ids
