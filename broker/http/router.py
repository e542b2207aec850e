"""Method and path to endpoint, answering what does not match as nsqd's router does.

nsqd routes with ``julienschmidt/httprouter``: an unknown path is
``404 {"message":"NOT_FOUND"}``, a known path with another method is
``405 {"message":"METHOD_NOT_ALLOWED"}`` with an ``Allow`` header, ``OPTIONS`` on a
known path answers ``200`` with ``Allow``, and a path that differs only by a trailing
slash or letter case is redirected (301 for GET, 307 otherwise). The target ``*`` with any
method but OPTIONS is ``405``, allowing every method routed anywhere.
"""

from __future__ import annotations

import posixpath
import urllib.parse
from collections.abc import Awaitable, Callable

from broker.http.responses import v1_error
from broker.http.server import Request, RequestBody, Response

__all__ = ["Endpoint", "Router"]

#: An endpoint: the request, its body and the value of the route's ``:name`` segment ("" if none).
Endpoint = Callable[[Request, RequestBody, str], Awaitable[Response]]

#: The methods an ``Allow`` header can name besides OPTIONS.
_ROUTED_METHODS = ("GET", "POST", "PUT")

_HTML_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&#34;", "'": "&#39;"})


def _clean_path(path: str) -> str:
    """httprouter's ``CleanPath``: resolve ``.``, ``..`` and ``//``, keep a trailing slash."""
    if not path:
        return "/"
    cleaned = posixpath.normpath("/" + path.lstrip("/"))
    if cleaned.startswith("//"):
        cleaned = "/" + cleaned.lstrip("/")
    if path.endswith("/") and cleaned != "/":
        cleaned += "/"
    return cleaned


def _redirect(request: Request, path: str) -> Response:
    """Go's ``http.Redirect`` to ``path`` (plus the original query)."""
    status = 301 if request.method == "GET" else 307
    escaped = urllib.parse.quote(path.encode("utf-8", "surrogateescape"), safe="/:@!$&'()*+,;=-._~")
    location = escaped + ("?" + request.raw_query if request.raw_query else "")
    headers = [(b"Location", location.encode("utf-8", "surrogateescape"))]
    body = b""
    if request.method in ("GET", "HEAD"):
        headers.insert(0, (b"Content-Type", b"text/html; charset=utf-8"))
    if request.method == "GET":
        phrase = "Moved Permanently" if status == 301 else "Temporary Redirect"
        body = f'<a href="{location.translate(_HTML_ESCAPES)}">{phrase}</a>.\n\n'.encode("utf-8", "surrogateescape")
    return Response(status, body, tuple(headers))


class Router:
    """A table from ``(method, path)`` to endpoint.

    A path is static (``/topic/create``) or ends in one parameter segment
    (``/config/:opt``), which matches one non-empty segment and is passed to the
    endpoint.
    """

    __slots__ = ("_static", "_prefixed", "_lower")

    def __init__(self, routes: dict[tuple[str, str], Endpoint]):
        self._static: dict[str, dict[str, Endpoint]] = {}
        self._prefixed: dict[str, dict[str, Endpoint]] = {}
        for (method, path), endpoint in routes.items():
            prefix, colon, _ = path.rpartition("/:")
            table, key = (self._prefixed, prefix + "/") if colon else (self._static, path)
            table.setdefault(key, {})[method] = endpoint
        self._lower = {path.lower(): path for path in self._static}

    def _match_prefixed(self, path: str) -> tuple[dict[str, Endpoint], str] | None:
        for prefix, methods in self._prefixed.items():
            if path.startswith(prefix):
                param = path[len(prefix):]
                if param and "/" not in param:
                    return methods, param
        return None

    def _match(self, method: str, path: str) -> tuple[Endpoint, str] | None:
        methods = self._static.get(path)
        if methods is not None:
            endpoint = methods.get(method)
            return None if endpoint is None else (endpoint, "")
        prefixed = self._match_prefixed(path)
        if prefixed is not None:
            endpoint = prefixed[0].get(method)
            if endpoint is not None:
                return endpoint, prefixed[1]
        return None

    def _has_method(self, method: str) -> bool:
        return any(method in methods for table in (self._static, self._prefixed) for methods in table.values())

    def _fixed_path(self, path: str) -> str | None:
        """The route a path means up to case and cleaning (httprouter's ``FindCaseInsensitivePath``)."""
        cleaned = _clean_path(path)
        candidates = [cleaned]
        if cleaned.endswith("/") and len(cleaned) > 1:
            candidates.append(cleaned[:-1])
        for candidate in candidates:
            found = self._lower.get(candidate.lower())
            if found is not None:
                return found
            lowered = candidate.lower()
            for prefix in self._prefixed:
                if lowered.startswith(prefix):
                    param = candidate[len(prefix):]
                    if param and "/" not in param:
                        return prefix + param
        return None

    def allowed(self, path: str, method: str) -> str:
        """The ``Allow`` header value for ``path``: other methods that match, plus OPTIONS;
        for ``*`` (the server as a whole) every method routed anywhere."""
        if path == "*":
            methods = {other for other in _ROUTED_METHODS if self._has_method(other)}
        else:
            methods = {other for other in _ROUTED_METHODS if other != method and self._match(other, path) is not None}
        if not methods:
            return ""
        methods.add("OPTIONS")
        return ", ".join(sorted(methods))

    def route(self, request: Request) -> tuple[Endpoint, str] | Response:
        """The endpoint and path parameter for ``request``, or the router's own response."""
        method = request.method
        path = request.path
        methods = self._static.get(path)
        if methods is not None:
            endpoint = methods.get(method)
            if endpoint is not None:
                return endpoint, ""
        found = self._match(method, path)
        if found is not None:
            return found
        if self._has_method(method) and method != "CONNECT" and path != "/":
            if path.endswith("/") and len(path) > 1 and self._match(method, path[:-1]) is not None:
                return _redirect(request, path[:-1])
            fixed = self._fixed_path(path)
            if fixed is not None and self._match(method, fixed) is not None:
                return _redirect(request, fixed)
        allow = self.allowed(path, method)
        if method == "OPTIONS":
            if allow:
                return Response(200, b"", ((b"Allow", allow.encode()),))
        elif allow:
            response = v1_error(405, "METHOD_NOT_ALLOWED")
            return Response(405, response.body, ((b"Allow", allow.encode()),) + response.headers)
        return v1_error(404, "NOT_FOUND")
