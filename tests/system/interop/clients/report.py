"""The report every Python client script writes: one JSON object per line on stdout.

Bodies travel as Latin-1 text in both directions (command line in, report out), so any bytes
round-trip unchanged through JSON.
"""

from __future__ import annotations

import json
import sys
import time

__all__ = ["EXIT_TIMEOUT", "body_bytes", "body_text", "emit", "emit_message", "read_command_line"]

#: Exit status of a script whose deadline passed before it saw what it expected.
EXIT_TIMEOUT = 3


def body_bytes(text: str) -> bytes:
    """A body as the test wrote it (Latin-1 text) turned back into bytes."""
    return text.encode("latin-1")


def body_text(body: bytes | str) -> str:
    """A body as bytes turned into Latin-1 text for the report."""
    if isinstance(body, str):
        return body
    return bytes(body).decode("latin-1")


def emit(event: str, **fields) -> None:
    """Write one report line and flush it, so the test sees it at once."""
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def emit_message(reader: int, channel: str, msg_id, body, attempts: int, timestamp: int, action: str) -> None:
    """Report one delivery as the client library handed it to the application."""
    if isinstance(msg_id, bytes):
        msg_id = msg_id.decode("ascii")
    emit(
        "message",
        reader=reader,
        channel=channel,
        id=msg_id,
        body=body_text(body),
        attempts=attempts,
        timestamp=timestamp,
        received_ns=time.time_ns(),
        action=action,
    )


def read_command_line(argv: list[str]) -> tuple[str, dict]:
    """``<script> <command> '<json config>'`` -> (command, config)."""
    if len(argv) != 3:
        raise SystemExit(f"usage: {argv[0]} COMMAND JSON_CONFIG")
    return argv[1], json.loads(argv[2])
