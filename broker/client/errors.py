"""What a client raises when the server refuses or the connection fails."""

from __future__ import annotations

__all__ = ["NsqError", "NON_FATAL_CODES"]

#: Error frames after which nsqd keeps the connection open.
NON_FATAL_CODES = frozenset({"E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"})


class NsqError(Exception):
    """nsqd answered with an error frame, or the connection failed.

    ``code`` is nsqd's ``E_*`` code, or the client's own for a failure nsqd did not
    report: ``E_CONNECTION`` (the socket failed or closed), ``E_HTTP_PORT`` (an HTTP
    server answered), ``E_TIMEOUT``, ``E_BAD_FRAME``, ``E_UNEXPECTED``. ``fatal``
    says whether nsqd closes the connection after it; ``from_server`` whether nsqd
    sent it.
    """

    def __init__(self, address: object, code: str, description: str = "", *, from_server: bool = False):
        self.address = address
        self.code = code
        self.description = description
        self.fatal = code not in NON_FATAL_CODES
        self.from_server = from_server
        super().__init__(f"nsqd {address}: {code} {description}".rstrip())

    @classmethod
    def from_frame(cls, address: object, data: bytes) -> NsqError:
        """The error an error frame's payload describes."""
        code, _, description = data.decode("utf-8", "replace").partition(" ")
        return cls(address, code, description, from_server=True)
