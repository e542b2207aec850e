"""nsqd's V1 response style and its error answer.

Success is the raw string, or JSON with ``Content-Type: application/json;
charset=utf-8``, or an empty body; errors are ``{"message":"<CODE>"}`` with the
status. Every V1 response carries ``X-NSQ-Content-Type: nsq; version=1.0``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from broker.gocompat import go_json
from broker.http.server import Response

__all__ = ["APIError", "JSON_CONTENT_TYPE", "JSON_HEADERS", "v1", "v1_json", "v1_error", "OK"]

JSON_CONTENT_TYPE = b"application/json; charset=utf-8"
_NSQ_HEADER = (b"X-Nsq-Content-Type", b"nsq; version=1.0")
#: The headers of a V1 JSON answer.
JSON_HEADERS = ((b"Content-Type", JSON_CONTENT_TYPE), _NSQ_HEADER)
_V1_HEADERS = (_NSQ_HEADER,)


class APIError(Exception):
    """An error answer: ``status`` and nsqd's message code (``MISSING_ARG_TOPIC``)."""

    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status = status
        self.text = text


def v1(data: Any = None) -> Response:
    """A V1 success: raw text, raw bytes, nothing, or JSON for anything else."""
    if data is None:
        return Response(200, b"", _V1_HEADERS)
    if isinstance(data, str):
        return Response(200, data.encode("utf-8", "surrogateescape"), _V1_HEADERS)
    if isinstance(data, bytes):
        return Response(200, data, _V1_HEADERS)
    return Response(200, go_json(data), JSON_HEADERS)


def v1_json(body: bytes) -> Response:
    """A V1 success whose JSON body is already rendered."""
    return Response(200, body, JSON_HEADERS)


@lru_cache(maxsize=256)
def v1_error(status: int, text: str) -> Response:
    """A V1 error: ``{"message":"<text>"}`` with ``status`` (one shared object per error)."""
    return Response(status, go_json({"message": text}), JSON_HEADERS)


#: The answer of a publish.
OK = v1("OK")
