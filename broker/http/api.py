"""nsqd's HTTP API on the broker's own Trio loop: the endpoint groups behind one router.

Routes, status codes, bodies and headers are nsqd 1.3.0's (``nsqd/http.go``,
``internal/http_api``): publishing (:mod:`broker.http.publish`), status
(:mod:`broker.http.status`) and administration (:mod:`broker.http.admin`), plus
pynsqd's own channel inspection (:mod:`broker.http.inspect`). Parameters come from
the query string only (:mod:`broker.http.query`); answers are in nsqd's V1 style
(:mod:`broker.http.responses`).
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING

import trio

from broker.core.maybe import Maybe
from broker.gocompat import format_duration
from broker.http.admin import AdminEndpoints
from broker.http.inspect import InspectEndpoints
from broker.http.publish import PublishEndpoints
from broker.http.responses import JSON_HEADERS, APIError, v1_error
from broker.http.router import Endpoint, Router
from broker.http.server import HTTP1Server, Request, RequestBody, Response
from broker.http.status import StatusEndpoints
from broker.observe.runtime import GC_PAUSES
from broker.server.net import Addresses
from diskqueue import DiskQueueError

if TYPE_CHECKING:
    from broker.core.broker import Broker

__all__ = ["HTTPServer"]

log = logging.getLogger("pynsqd.http")

#: Go's answer to ``OPTIONS *``.
_OPTIONS_ANY = Response(200)


class HTTPServer:
    """nsqd's HTTP API for one broker listening on ``addresses``; owns its connection tasks.

    The daemon calls :meth:`serve` (in its nursery), then at shutdown
    :meth:`stop_listening` and :meth:`close_connections`. With ``ssl_context`` it serves
    HTTPS. ``tls_required`` (the plain listener under ``--tls-required=true``) answers every
    request with nsqd's ``403 TLS_REQUIRED`` naming the HTTPS port.
    """

    def __init__(self, broker: Broker, addresses: Addresses, *, ssl_context: ssl.SSLContext | None = None,
                 tls_required: bool = False):
        self.broker = broker
        self._tls_required: Response | None = None
        if tls_required:
            https_port = addresses.https[1] if isinstance(addresses.https, tuple) else 0
            # nsqd writes this body by hand, with a space after each colon
            body = f'{{"message": "TLS_REQUIRED", "https_port": {https_port}}}'.encode()
            self._tls_required = Response(403, body, JSON_HEADERS)
        publish = PublishEndpoints(broker)
        routes: dict[tuple[str, str], Endpoint] = {
            **publish.routes(),
            **StatusEndpoints(broker, addresses).routes(),
            **AdminEndpoints(broker).routes(),
            **InspectEndpoints(broker).routes(),
        }
        self._router = Router(routes)
        self._unlogged = frozenset(publish.routes().values())  # nsqd does not log publishes
        # answered in the read poller's task as the request's bytes arrive (see HTTP1Server)
        self._inline = {"/pub": publish.pub_whole}
        self._server = HTTP1Server(self.handle, inline=self.handle_whole, ssl_context=ssl_context)

    async def serve(self, listeners: list[trio.SocketListener], *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Serve until the connections are closed; reports started once listening."""
        GC_PAUSES.install()
        try:
            await self._server.serve(listeners, task_status=task_status)
        finally:
            GC_PAUSES.uninstall()

    def stop_listening(self) -> None:
        """Stop accepting connections."""
        self._server.stop_listening()

    async def close_connections(self, grace: float) -> None:
        """Finish in-progress requests and close; cancel what is left after ``grace`` seconds."""
        await self._server.close_connections(grace)

    async def handle(self, request: Request, body: RequestBody) -> Response:
        """Answer one request (the :class:`HTTP1Server` handler)."""
        if request.method == "OPTIONS" and request.path == "*":
            return _OPTIONS_ANY
        if self._tls_required is not None:
            return self._tls_required
        started = time.perf_counter_ns()
        routed = self._router.route(request)
        if isinstance(routed, Response):
            self._log(request, routed.status, started)
            return routed
        endpoint, param = routed
        try:
            response = await endpoint(request, body, param)
        except Exception as exc:
            response = self._failed(request, exc)
        if endpoint not in self._unlogged:
            self._log(request, response.status, started)
        return response

    def handle_whole(self, request: Request, body: bytes) -> Maybe[Response] | None:
        """Answer a ``POST /pub`` whose whole ``body`` is here, at once or by what to await
        (the :class:`HTTP1Server` inline handler); None for any other request, which
        :meth:`handle` answers. Never raises."""
        if request.method != "POST" or self._tls_required is not None:
            return None
        endpoint = self._inline.get(request.path)
        if endpoint is None:
            return None
        try:
            answer = endpoint(request, body)
        except Exception as exc:
            return self._failed(request, exc)
        return answer if isinstance(answer, Response) else self._awaited(request, answer)

    async def _awaited(self, request: Request, pending: Awaitable[Response]) -> Response:
        try:
            return await pending
        except Exception as exc:
            return self._failed(request, exc)

    def _failed(self, request: Request, exc: Exception) -> Response:
        """The answer to an endpoint's failure ``exc``: its status for an :class:`APIError`,
        else a 500 after logging it."""
        if isinstance(exc, APIError):
            return v1_error(exc.status, exc.text)
        if isinstance(exc, OSError | DiskQueueError):  # the disk refused (a queue's files, nsqd.dat): no fault of ours
            self.broker.disk_failed(exc)
            log.error("HTTP: %s %s failed - %s", request.method, request.path, exc)
        else:  # nsqd's router turns a handler panic into a 500 too
            log.exception("HTTP: %s %s failed", request.method, request.path, exc_info=exc)
        return v1_error(500, "INTERNAL_ERROR")

    def _log(self, request: Request, status: int, started: int) -> None:
        if log.isEnabledFor(logging.INFO):
            uri = request.path + ("?" + request.raw_query if request.raw_query else "")
            log.info("%d %s %s (%s) %s", status, request.method, uri, request.remote,
                     format_duration(time.perf_counter_ns() - started))
