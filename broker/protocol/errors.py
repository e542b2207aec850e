"""The error taxonomy of the V2 protocol.

nsqd answers a bad command with an error frame whose payload is
``"<CODE> <description>"`` (``internal/protocol/errors.go``: ``Error()`` joins
code and description with one space, even when the description is empty).
Every code except ``E_FIN_FAILED``, ``E_REQ_FAILED`` and ``E_TOUCH_FAILED`` is
fatal: nsqd sends the frame, then closes the connection.
"""

from __future__ import annotations

__all__ = ["ProtocolError", "command_failed"]


class ProtocolError(Exception):
    """A client error with nsqd's wire code and wording.

    ``code`` is the stable wire code (``"E_INVALID"``); ``description`` the
    human part (``"invalid command ASDF"``, may be empty); ``fatal`` says whether
    the owner closes the connection after sending the frame; ``payload`` is
    exactly what goes in the error frame. ``payload`` defaults to
    ``code + " " + description``; it is given explicitly when the description
    carries raw client bytes (echoed verbatim, as nsqd does) and is empty when
    nsqd closes the connection without sending any frame.
    """

    def __init__(self, code: str, description: str = "", *, fatal: bool = True, payload: bytes | None = None):
        if payload is None:
            payload = f"{code} {description}".encode()
        super().__init__(code, description)
        self.code = code
        self.description = description
        self.fatal = fatal
        self.payload = payload

    @classmethod
    def with_raw_description(cls, code: str, description: bytes, *, fatal: bool = True) -> ProtocolError:
        """An error whose description holds client bytes that must reach the wire unchanged."""
        return cls(
            code,
            description.decode("utf-8", "backslashreplace"),
            fatal=fatal,
            payload=code.encode("ascii") + b" " + description,
        )

    def __str__(self) -> str:
        return self.payload.decode("utf-8", "backslashreplace") or f"{self.code} {self.description}"

    def __repr__(self) -> str:
        return f"ProtocolError({self.code!r}, {self.description!r}, fatal={self.fatal!r}, payload={self.payload!r})"


def command_failed(code: str, verb: str, subject: bytes, reason: bytes) -> ProtocolError:
    """nsqd's non-fatal ``E_<VERB>_FAILED <VERB> <id> failed <reason>``, the id (or lease token)
    bytes as the client sent them."""
    return ProtocolError.with_raw_description(code, verb.encode() + b" " + subject + b" failed " + reason, fatal=False)
