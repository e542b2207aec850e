"""nsqd's status endpoints: ``/ping``, ``/info``, ``/stats``, and ``/metrics`` (not in nsqd).

``/ping`` answers in plain text (``OK``, or ``500`` with ``NOK - <error>``),
``/metrics`` in the Prometheus text format, the others in the V1 style.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

from broker.config.options import NSQD_COMPAT_VERSION
from broker.gocompat import to_ns
from broker.http.query import first, parse_bool, request_params
from broker.http.responses import v1, v1_json
from broker.http.router import Endpoint
from broker.http.server import Request, RequestBody, Response
from broker.observe.health import health_text
from broker.server.net import Address, Addresses

if TYPE_CHECKING:
    from broker.core.broker import Broker
    from broker.observe.prometheus import MetricsExporter

__all__ = ["StatusEndpoints"]



def _port(address: Address | None) -> int:
    """A listener's port for ``/info``: -1 for a unix socket (or no listener), as nsqd."""
    return address[1] if isinstance(address, tuple) else -1


class StatusEndpoints:
    """Health, identity, statistics and metrics of one broker listening on ``addresses``."""

    def __init__(self, broker: Broker, addresses: Addresses):
        self.broker = broker
        self.addresses = addresses
        self._metrics: MetricsExporter | None = None  # made by the first scrape
        self._metrics_headers: tuple[tuple[bytes, bytes], ...] = ()

    def routes(self) -> dict[tuple[str, str], Endpoint]:
        """This group's entries for the :class:`~broker.http.router.Router`."""
        return {
            ("GET", "/ping"): self.ping,
            ("GET", "/info"): self.info,
            ("GET", "/stats"): self.stats,
            ("GET", "/metrics"): self.prometheus,
        }

    async def ping(self, request: Request, body: RequestBody, param: str) -> Response:
        """``GET /ping``: ``OK``, or 500 with the health error."""
        health = health_text(self.broker)
        status = 200 if self.broker.health_error is None else 500
        return Response(status, health.encode("utf-8", "replace"))

    async def info(self, request: Request, body: RequestBody, param: str) -> Response:
        """``GET /info``: version, addresses and the limits a client negotiates against."""
        broker = self.broker
        opts = broker.options
        return v1({
            "version": NSQD_COMPAT_VERSION,
            "broadcast_address": opts.broadcast_address,
            "hostname": socket.gethostname(),
            "http_port": _port(self.addresses.http),
            "tcp_port": _port(self.addresses.tcp),
            "start_time": int(broker.start_time),
            "max_heartbeat_interval": to_ns(opts.max_heartbeat_interval),
            "max_output_buffer_size": opts.max_output_buffer_size,
            "max_output_buffer_timeout": to_ns(opts.max_output_buffer_timeout),
            "max_deflate_level": opts.max_deflate_level,
        })

    async def stats(self, request: Request, body: RequestBody, param: str) -> Response:
        """``GET /stats?format=&topic=&channel=&include_clients=&include_mem=``: text or JSON."""
        # the records and renderers load with the first report, not at start
        from broker.observe.collect import snapshot
        from broker.observe.render_json import render_json
        from broker.observe.render_text import render_text

        params = request_params(request)
        include_clients = parse_bool(first(params, "include_clients"))
        include_mem = parse_bool(first(params, "include_mem"))
        snap = snapshot(self.broker, first(params, "topic"), first(params, "channel"),
                        include_clients is not False, include_mem is not False)
        if first(params, "format") != "json":
            return v1(render_text(snap))
        return v1_json(render_json(snap))

    async def prometheus(self, request: Request, body: RequestBody, param: str) -> Response:
        """``GET /metrics``: the Prometheus text format."""
        from broker.observe.collect import snapshot

        if self._metrics is None:
            # prometheus-client is loaded by the first scrape, not by every start (it is a
            # third of what a start imports)
            from broker.observe.prometheus import CONTENT_TYPE, MetricsExporter

            self._metrics = MetricsExporter()
            self._metrics_headers = ((b"Content-Type", CONTENT_TYPE.encode()),)
        return Response(200, self._metrics.render(snapshot(self.broker)), self._metrics_headers)
