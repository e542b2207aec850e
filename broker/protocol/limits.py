"""Input bounds the parser enforces, with nsqd 1.3.0's defaults."""

from __future__ import annotations

from typing import NamedTuple

__all__ = [
    "Limits",
    "DEFAULT_MAX_MSG_SIZE",
    "DEFAULT_MAX_BODY_SIZE",
    "DEFAULT_MAX_RDY_COUNT",
    "DEFAULT_MAX_REQ_TIMEOUT_MS",
    "LINE_BUFFER_SIZE",
]

DEFAULT_MAX_MSG_SIZE = 1048576          # --max-msg-size
DEFAULT_MAX_BODY_SIZE = 5242880         # --max-body-size
DEFAULT_MAX_RDY_COUNT = 2500            # --max-rdy-count
DEFAULT_MAX_REQ_TIMEOUT_MS = 3600000    # --max-req-timeout (1h)

#: nsqd reads command lines with ``bufio.Reader.ReadSlice('\n')`` on a reader of
#: ``defaultBufferSize`` = 16 KiB (``nsqd/client_v2.go``). A line whose newline
#: is not within the first 16384 bytes fails with ``bufio: buffer full``; nsqd
#: logs ``failed to read command - bufio: buffer full`` and closes the
#: connection without sending anything.
LINE_BUFFER_SIZE = 16384


class Limits(NamedTuple):
    """Bounds for one connection's parser.

    ``max_msg_size`` bounds a PUB/DPUB body and each MPUB message;
    ``max_body_size`` bounds IDENTIFY/AUTH bodies and a whole MPUB body;
    ``max_line_length`` is the longest command line accepted, counting the
    ``\\n``.
    """

    max_msg_size: int = DEFAULT_MAX_MSG_SIZE
    max_body_size: int = DEFAULT_MAX_BODY_SIZE
    max_rdy_count: int = DEFAULT_MAX_RDY_COUNT
    max_req_timeout_ms: int = DEFAULT_MAX_REQ_TIMEOUT_MS
    max_line_length: int = LINE_BUFFER_SIZE
