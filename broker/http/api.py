"""nsqd's HTTP API on the broker's own Trio loop: publishing, ``/stats``, admin, ``/metrics``.

Routes, status codes, bodies and headers are nsqd 1.3.0's (``nsqd/http.go``,
``internal/http_api``). Responses come in nsqd's three styles:

* V1 (every API route): success is the raw string, or JSON with
  ``Content-Type: application/json; charset=utf-8``, or an empty body; errors are
  ``{"message":"<CODE>"}`` with the status; every V1 response carries
  ``X-NSQ-Content-Type: nsq; version=1.0``;
* plain text (``/ping``): ``OK``, or ``500`` with ``NOK - <error>``;
* ``/metrics`` (not in nsqd): the Prometheus text format.

pynsqd's own routes, in the V1 style, inspect a channel and manage its dead letters:
``GET /channel/peek`` (``state`` = ready, deferred, in_flight or buried; ``n``),
``POST /channel/kick`` and ``POST /channel/delete_buried`` (``id``, or ``n`` oldest, or
all) and ``POST /channel/max_attempts`` (``value`` = a count, 0 for never, or ``default``).

Routing follows nsqd's router (``julienschmidt/httprouter``): an unknown path is
``404 {"message":"NOT_FOUND"}``, a known path with another method is
``405 {"message":"METHOD_NOT_ALLOWED"}`` with an ``Allow`` header, ``OPTIONS`` on a
known path answers ``200`` with ``Allow``, and a path that differs only by a trailing
slash or letter case is redirected (301 for GET, 307 otherwise).

Parameters come from the query string only, parsed like Go's ``url.ParseQuery`` (a
``;`` or a bad ``%`` escape is ``400 INVALID_REQUEST``). Bodies are read with limits:
a ``Content-Length`` above ``--max-msg-size`` (``/pub``) or ``--max-body-size``
(``/mpub``) is refused with 413 before any of the body is read.

Publishing builds messages exactly as the TCP ``PUB``/``MPUB``/``DPUB`` commands do and
queues them with :meth:`Broker.publish`.
"""

from __future__ import annotations

import base64
import ctypes
import ctypes.util
import dataclasses
import gc
import json
import logging
import posixpath
import re
import socket
import struct
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from broker.config.log import LOG_LEVELS, set_log_level
from broker.config.options import NSQD_COMPAT_VERSION, TLS_REQUIRED, get_config_value
from broker.core.message import Message
from broker.gocompat import format_duration, parse_int64, to_ns, wrap_int64
from broker.http.server import BodyReadError, H11Server, Request, RequestBody, Response
from broker.observe.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from broker.observe.metrics import MetricsExporter
from broker.observe.stats import GC_PAUSES, go_json, health_text, render_json, render_text, snapshot
from broker.protocol import is_valid_name

if TYPE_CHECKING:
    from broker.core.broker import Broker
    from broker.core.channel import Channel
    from broker.core.topic import Topic

__all__ = ["HTTPServer", "APIError", "parse_query"]

log = logging.getLogger("pynsqd.http")

JSON_CONTENT_TYPE = b"application/json; charset=utf-8"
_NSQ_HEADER = (b"X-Nsq-Content-Type", b"nsq; version=1.0")
_JSON_HEADERS = ((b"Content-Type", JSON_CONTENT_TYPE), _NSQ_HEADER)
_V1_HEADERS = (_NSQ_HEADER,)

#: nsqd's ``boolParams``: any other value leaves the default.
_BOOL_PARAMS = {"true": True, "1": True, "false": False, "0": False}

_MS = 1_000_000


class APIError(Exception):
    """An error answer: ``status`` and nsqd's message code (``MISSING_ARG_TOPIC``)."""

    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status = status
        self.text = text


# --------------------------------------------------------------------------- query strings

_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")


def _query_unescape(text: str) -> str:
    if "%" in text:
        if text.count("%") != len(_ESCAPE.findall(text)):
            raise ValueError(f"invalid URL escape in {text!r}")
        raw = text.replace("+", " ").encode("utf-8", "surrogateescape")
        raw = re.sub(rb"%([0-9A-Fa-f]{2})", lambda m: bytes((int(m.group(1), 16),)), raw)
        return raw.decode("utf-8", "surrogateescape")
    return text.replace("+", " ") if "+" in text else text


def parse_query(raw: str) -> dict[str, list[str]]:
    """Go's ``url.ParseQuery``: ``&``-separated, ``+`` is a space, ``%XX`` escapes.

    Raises ``ValueError`` (after parsing what it can, as Go does) for a ``;`` in a pair
    or a bad escape; invalid UTF-8 survives as surrogate escapes.
    """
    values: dict[str, list[str]] = {}
    error = None
    for pair in raw.split("&"):
        if ";" in pair:
            error = error or ValueError("invalid semicolon separator in query")
            continue
        if not pair:
            continue
        key, _, value = pair.partition("=")
        try:
            key = _query_unescape(key)
            value = _query_unescape(value)
        except ValueError as exc:
            error = error or exc
            continue
        values.setdefault(key, []).append(value)
    if error is not None:
        raise error
    return values


def _first(params: dict[str, list[str]], key: str) -> str | None:
    found = params.get(key)
    return found[0] if found else None


# --------------------------------------------------------------------------- responses


def _v1(data: Any = None) -> Response:
    """A V1 success: raw text, raw bytes, nothing, or JSON for anything else."""
    if data is None:
        return Response(200, b"", _V1_HEADERS)
    if isinstance(data, str):
        return Response(200, data.encode("utf-8", "surrogateescape"), _V1_HEADERS)
    if isinstance(data, bytes):
        return Response(200, data, _V1_HEADERS)
    return Response(200, go_json(data), _JSON_HEADERS)


def _v1_json(body: bytes) -> Response:
    return Response(200, body, _JSON_HEADERS)


def _v1_error(status: int, text: str) -> Response:
    return Response(status, go_json({"message": text}), _JSON_HEADERS)


_OK = _v1("OK")


# --------------------------------------------------------------------------- routing

_Endpoint = Callable[[Request, RequestBody, str], Awaitable[Response]]


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


_HTML_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&#34;", "'": "&#39;"})


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


class _Router:
    """Method and path to endpoint; static paths plus one ``/config/:opt`` parameter route."""

    __slots__ = ("static", "config", "_lower")

    CONFIG_PREFIX = "/config/"

    def __init__(self, static: dict[str, dict[str, _Endpoint]], config: dict[str, _Endpoint]):
        self.static = static
        self.config = config
        self._lower = {path.lower(): path for path in static}

    def _match(self, method: str, path: str) -> tuple[_Endpoint, str] | None:
        methods = self.static.get(path)
        if methods is not None:
            endpoint = methods.get(method)
            return None if endpoint is None else (endpoint, "")
        if path.startswith(self.CONFIG_PREFIX):
            opt = path[len(self.CONFIG_PREFIX):]
            endpoint = self.config.get(method)
            if opt and "/" not in opt and endpoint is not None:
                return endpoint, opt
        return None

    def _has_method(self, method: str) -> bool:
        return method in self.config or any(method in methods for methods in self.static.values())

    def _fixed_path(self, path: str) -> str | None:
        cleaned = _clean_path(path)
        candidates = [cleaned]
        if cleaned.endswith("/") and len(cleaned) > 1:
            candidates.append(cleaned[:-1])
        for candidate in candidates:
            found = self._lower.get(candidate.lower())
            if found is not None:
                return found
            if candidate.lower().startswith(self.CONFIG_PREFIX):
                opt = candidate[len(self.CONFIG_PREFIX):]
                if opt and "/" not in opt:
                    return self.CONFIG_PREFIX + opt
        return None

    def allowed(self, path: str, method: str) -> str:
        """The ``Allow`` header value for ``path``: other methods that match, plus OPTIONS."""
        methods = set()
        for candidate in ("GET", "POST", "PUT"):
            if candidate != method and self._match(candidate, path) is not None:
                methods.add(candidate)
        if not methods:
            return ""
        methods.add("OPTIONS")
        return ", ".join(sorted(methods))

    def route(self, request: Request) -> tuple[_Endpoint, str] | Response:
        """The endpoint and path parameter for ``request``, or the router's own response."""
        method = request.method
        path = request.path
        found = self._match(method, path)
        if found is not None:
            return found
        if self._has_method(method) and method != "CONNECT" and path != "/":
            if path.endswith("/") and len(path) > 1 and self._match(method, path[:-1]) is not None:
                return _redirect(request, path[:-1])
            fixed = self._fixed_path(path)
            if fixed is not None and self._match(method, fixed) is not None:
                return _redirect(request, fixed)
        if method == "OPTIONS":
            allow = self.allowed(path, method)
            if allow:
                return Response(200, b"", ((b"Allow", allow.encode()),))
        else:
            allow = self.allowed(path, method)
            if allow:
                response = _v1_error(405, "METHOD_NOT_ALLOWED")
                return Response(405, response.body, ((b"Allow", allow.encode()),) + response.headers)
        return _v1_error(404, "NOT_FOUND")


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None)
    except OSError:
        return None


# --------------------------------------------------------------------------- the server


class HTTPServer:
    """nsqd's HTTP API for one broker; owns its listeners' connection tasks.

    The daemon calls :meth:`serve` (in its nursery), then at shutdown
    :meth:`stop_listening` and :meth:`close_connections`.
    """

    def __init__(self, broker: Broker, daemon: Any = None):
        self.broker = broker
        self.daemon = daemon  # the owner; the routes only need the broker
        self.metrics = MetricsExporter()
        self._server = H11Server(self.handle)
        self._router = _Router(
            {
                "/ping": {"GET": self._ping},
                "/info": {"GET": self._info},
                "/pub": {"POST": self._pub},
                "/mpub": {"POST": self._mpub},
                "/stats": {"GET": self._stats},
                "/metrics": {"GET": self._metrics},
                "/topic/create": {"POST": self._topic_create},
                "/topic/delete": {"POST": self._topic_delete},
                "/topic/empty": {"POST": self._topic_empty},
                "/topic/pause": {"POST": self._topic_pause},
                "/topic/unpause": {"POST": self._topic_pause},
                "/channel/create": {"POST": self._channel_create},
                "/channel/delete": {"POST": self._channel_delete},
                "/channel/empty": {"POST": self._channel_empty},
                "/channel/pause": {"POST": self._channel_pause},
                "/channel/unpause": {"POST": self._channel_pause},
                "/debug/freememory": {"POST": self._free_memory},
                # pynsqd's own: inspection and dead letters
                "/channel/peek": {"GET": self._channel_peek},
                "/channel/kick": {"POST": self._channel_kick},
                "/channel/delete_buried": {"POST": self._channel_delete_buried},
                "/channel/max_attempts": {"POST": self._channel_max_attempts},
            },
            {"GET": self._config, "PUT": self._config},
        )

    # ---------------------------------------------------------------- lifecycle

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

    # ---------------------------------------------------------------- dispatch

    async def handle(self, request: Request, body: RequestBody) -> Response:
        """Answer one request (the :class:`H11Server` handler)."""
        if request.method == "OPTIONS" and request.path == "*":
            return Response(200)
        if self.broker.options.tls_required == TLS_REQUIRED:
            return self._tls_required()
        started = time.perf_counter_ns()
        routed = self._router.route(request)
        if isinstance(routed, Response):
            self._log(request, routed.status, started)
            return routed
        endpoint, param = routed
        try:
            response = await endpoint(request, body, param)
        except APIError as err:
            response = _v1_error(err.status, err.text)
        except Exception:  # nsqd's router turns a handler panic into a 500 too
            log.exception("HTTP: %s %s failed", request.method, request.path)
            response = _v1_error(500, "INTERNAL_ERROR")
        if endpoint not in (self._pub, self._mpub):  # nsqd does not log publishes
            self._log(request, response.status, started)
        return response

    def _log(self, request: Request, status: int, started: int) -> None:
        if log.isEnabledFor(logging.INFO):
            uri = request.path + ("?" + request.raw_query if request.raw_query else "")
            log.info("%d %s %s (%s) %s", status, request.method, uri, request.remote,
                     format_duration(time.perf_counter_ns() - started))

    def _tls_required(self) -> Response:
        port = self.broker.options.https_address.rpartition(":")[2]
        body = f'{{"message": "TLS_REQUIRED", "https_port": {int(port) if port.isdigit() else 0}}}'
        return Response(403, body.encode(), _JSON_HEADERS)

    @staticmethod
    def _params(request: Request) -> dict[str, list[str]]:
        try:
            return parse_query(request.raw_query)
        except ValueError as exc:
            log.error("failed to parse request params - %s", exc)
            raise APIError(400, "INVALID_REQUEST") from None

    def _new_topic(self, params: dict[str, list[str]]) -> Topic:
        """nsqd's ``getTopicFromQuery``: the named topic, created if new."""
        name = _first(params, "topic")
        if name is None:
            raise APIError(400, "MISSING_ARG_TOPIC")
        if not is_valid_name(name):
            raise APIError(400, "INVALID_TOPIC")
        return self.broker.get_topic(name)

    def _existing_topic(self, params: dict[str, list[str]]) -> tuple[Topic, str]:
        """nsqd's ``getExistingTopicFromQuery``: validated names, the topic must exist."""
        topic_name = _first(params, "topic")
        if topic_name is None:
            raise APIError(400, "MISSING_ARG_TOPIC")
        if not is_valid_name(topic_name):
            raise APIError(400, "INVALID_ARG_TOPIC")
        channel_name = _first(params, "channel")
        if channel_name is None:
            raise APIError(400, "MISSING_ARG_CHANNEL")
        if not is_valid_name(channel_name):
            raise APIError(400, "INVALID_ARG_CHANNEL")
        topic = self.broker.topics.get(topic_name)
        if topic is None:
            raise APIError(404, "TOPIC_NOT_FOUND")
        return topic, channel_name

    async def _persist_metadata(self) -> None:
        try:
            await self.broker.persist_metadata()
        except OSError as exc:  # nsqd ignores this error too; the metadata task retries
            log.error("failed to persist metadata - %s", exc)
            self.broker.metadata_changed()

    async def _put(self, topic: Topic, bodies: list[bytes], defer_ns: int = 0) -> Response:
        """Queue ``bodies`` as the TCP publish commands do; 503 EXITING if that fails."""
        broker = self.broker
        if broker.exiting:
            raise APIError(503, "EXITING")
        if not bodies:
            return _OK
        try:
            await broker.publish_bodies(topic, bodies, defer_ns)
        except Exception as exc:  # nsqd answers every PutMessage failure this way
            log.error("HTTP: publish to %s failed: %s", topic.name, exc)
            raise APIError(503, "EXITING") from None
        return _OK

    # ---------------------------------------------------------------- endpoints

    async def _ping(self, request: Request, body: RequestBody, param: str) -> Response:
        health = health_text(self.broker)
        status = 200 if self.broker.health_error is None else 500
        return Response(status, health.encode("utf-8", "replace"))

    async def _info(self, request: Request, body: RequestBody, param: str) -> Response:
        broker = self.broker
        opts = broker.options
        return _v1({
            "version": NSQD_COMPAT_VERSION,
            "broadcast_address": opts.broadcast_address,
            "hostname": socket.gethostname(),
            "http_port": _port(getattr(broker, "http_address", None)),
            "tcp_port": _port(getattr(broker, "tcp_address", None)),
            "start_time": int(broker.start_time),
            "max_heartbeat_interval": to_ns(opts.max_heartbeat_interval),
            "max_output_buffer_size": opts.max_output_buffer_size,
            "max_output_buffer_timeout": to_ns(opts.max_output_buffer_timeout),
            "max_deflate_level": opts.max_deflate_level,
        })

    async def _pub(self, request: Request, body: RequestBody, param: str) -> Response:
        opts = self.broker.options
        max_size = opts.max_msg_size
        if request.content_length is not None and request.content_length > max_size:
            raise APIError(413, "MSG_TOO_BIG")
        try:
            data = await body.read(max_size + 1)
        except BodyReadError:
            raise APIError(500, "INTERNAL_ERROR") from None
        if len(data) > max_size:
            raise APIError(413, "MSG_TOO_BIG")
        if not data:
            raise APIError(400, "MSG_EMPTY")
        params = self._params(request)
        topic = self._new_topic(params)
        defer_ns = 0
        defer = params.get("defer")
        if defer is not None:
            try:
                defer_ns = wrap_int64(parse_int64(defer[0]) * _MS)
            except ValueError:
                raise APIError(400, "INVALID_DEFER") from None
            if defer_ns < 0 or defer_ns > to_ns(opts.max_req_timeout):
                raise APIError(400, "INVALID_DEFER")
        return await self._put(topic, [data], defer_ns)

    async def _mpub(self, request: Request, body: RequestBody, param: str) -> Response:
        opts = self.broker.options
        max_body = opts.max_body_size
        if request.content_length is not None and request.content_length > max_body:
            raise APIError(413, "BODY_TOO_BIG")
        params = self._params(request)
        topic = self._new_topic(params)
        binary = False
        values = params.get("binary")
        if values is not None:
            binary = _BOOL_PARAMS.get(values[0])
            if binary is None:
                binary = True
                log.warning("deprecated value '%s' used for /mpub binary param", values[0])
        try:
            data = await body.read(max_body + 1)
        except BodyReadError:
            raise APIError(500, "INTERNAL_ERROR") from None
        if binary:
            if len(data) > max_body:
                raise APIError(413, "BODY_TOO_BIG")
            bodies = _read_binary_mpub(data, opts.max_msg_size, max_body)
        else:
            bodies = _read_text_mpub(data, opts.max_msg_size, max_body)
        return await self._put(topic, bodies)

    async def _stats(self, request: Request, body: RequestBody, param: str) -> Response:
        params = self._params(request)
        include_clients = _BOOL_PARAMS.get(_first(params, "include_clients") or "", True)
        include_mem = _BOOL_PARAMS.get(_first(params, "include_mem") or "", True)
        snap = snapshot(self.broker, _first(params, "topic"), _first(params, "channel"), include_clients, include_mem)
        if _first(params, "format") != "json":
            return _v1(render_text(snap))
        return _v1_json(render_json(snap))

    async def _metrics(self, request: Request, body: RequestBody, param: str) -> Response:
        snap = snapshot(self.broker)
        return Response(200, self.metrics.render(snap), ((b"Content-Type", METRICS_CONTENT_TYPE.encode()),))

    async def _topic_create(self, request: Request, body: RequestBody, param: str) -> Response:
        self._new_topic(self._params(request))
        return _v1()

    async def _topic_delete(self, request: Request, body: RequestBody, param: str) -> Response:
        name = _first(self._params(request), "topic")
        if name is None:
            raise APIError(400, "MISSING_ARG_TOPIC")
        try:
            self.broker.delete_topic(name)
        except KeyError:
            raise APIError(404, "TOPIC_NOT_FOUND") from None
        return _v1()

    async def _topic_empty(self, request: Request, body: RequestBody, param: str) -> Response:
        name = _first(self._params(request), "topic")
        if name is None:
            raise APIError(400, "MISSING_ARG_TOPIC")
        if not is_valid_name(name):
            raise APIError(400, "INVALID_TOPIC")
        topic = self.broker.topics.get(name)
        if topic is None:
            raise APIError(404, "TOPIC_NOT_FOUND")
        try:
            topic.empty()
        except Exception as exc:
            log.error("failed to empty topic %s - %s", name, exc)
            raise APIError(500, "INTERNAL_ERROR") from None
        return _v1()

    async def _topic_pause(self, request: Request, body: RequestBody, param: str) -> Response:
        name = _first(self._params(request), "topic")
        if name is None:
            raise APIError(400, "MISSING_ARG_TOPIC")
        topic = self.broker.topics.get(name)
        if topic is None:
            raise APIError(404, "TOPIC_NOT_FOUND")
        if "unpause" in request.path:
            topic.unpause()
        else:
            topic.pause()
        # persisted at once, so that a crash cannot (un)pause the topic behind the operator's back
        await self._persist_metadata()
        return _v1()

    async def _channel_create(self, request: Request, body: RequestBody, param: str) -> Response:
        topic, channel_name = self._existing_topic(self._params(request))
        topic.get_channel(channel_name)
        return _v1()

    async def _channel_delete(self, request: Request, body: RequestBody, param: str) -> Response:
        topic, channel_name = self._existing_topic(self._params(request))
        try:
            topic.delete_channel(channel_name)
        except KeyError:
            raise APIError(404, "CHANNEL_NOT_FOUND") from None
        return _v1()

    async def _channel_empty(self, request: Request, body: RequestBody, param: str) -> Response:
        topic, channel_name = self._existing_topic(self._params(request))
        channel = topic.channels.get(channel_name)
        if channel is None:
            raise APIError(404, "CHANNEL_NOT_FOUND")
        try:
            channel.empty()
        except Exception as exc:
            log.error("failed to empty channel %s:%s - %s", topic.name, channel_name, exc)
            raise APIError(500, "INTERNAL_ERROR") from None
        return _v1()

    async def _channel_pause(self, request: Request, body: RequestBody, param: str) -> Response:
        topic, channel_name = self._existing_topic(self._params(request))
        channel = topic.channels.get(channel_name)
        if channel is None:
            raise APIError(404, "CHANNEL_NOT_FOUND")
        if "unpause" in request.path:
            channel.unpause()
        else:
            channel.pause()
        await self._persist_metadata()
        return _v1()

    async def _config(self, request: Request, body: RequestBody, opt: str) -> Response:
        broker = self.broker
        if request.method == "PUT":
            limit = broker.options.max_msg_size + 1
            try:
                data = await body.read(limit)
            except BodyReadError:
                raise APIError(500, "INTERNAL_ERROR") from None
            if len(data) == limit or not data:
                raise APIError(413, "INVALID_VALUE")
            if opt == "nsqlookupd_tcp_addresses":
                try:
                    addresses = json.loads(data)
                except ValueError:
                    raise APIError(400, "INVALID_VALUE") from None
                if addresses is None:
                    addresses = []
                if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
                    raise APIError(400, "INVALID_VALUE")
                changes = {"nsqlookupd_tcp_addresses": tuple(addresses)}
            elif opt == "log_level":
                level = data.decode("utf-8", "replace").lower()
                if level not in LOG_LEVELS:
                    raise APIError(400, "INVALID_VALUE")
                changes = {"log_level": level}
            else:
                raise APIError(400, "INVALID_OPTION")
            try:
                broker.options = dataclasses.replace(broker.options, **changes)
            except ValueError:
                raise APIError(400, "INVALID_VALUE") from None
            if "log_level" in changes:
                set_log_level(changes["log_level"])
        try:
            value = get_config_value(broker.options, opt)
        except KeyError:
            raise APIError(400, "INVALID_OPTION") from None
        return _v1(value)

    async def _free_memory(self, request: Request, body: RequestBody, param: str) -> Response:
        gc.collect()
        trim = _malloc_trim()
        if trim is not None:
            trim(0)
        # nsqd 1.3.0 answers this endpoint with a 500: its plain-text wrapper cannot
        # render the handler's empty result (the memory was freed all the same).
        raise APIError(500, "INTERNAL_ERROR")


    # ---------------------------------------------------------------- pynsqd's own endpoints

    def _existing_channel(self, request: Request) -> tuple[Channel, dict[str, list[str]]]:
        params = self._params(request)
        topic, channel_name = self._existing_topic(params)
        channel = topic.channels.get(channel_name)
        if channel is None:
            raise APIError(404, "CHANNEL_NOT_FOUND")
        return channel, params

    async def _channel_peek(self, request: Request, body: RequestBody, param: str) -> Response:
        """``GET /channel/peek``: the next ``n`` messages in a state, without changing anything."""
        channel, params = self._existing_channel(request)
        state = _first(params, "state") or "ready"
        peek = _PEEK.get(state)
        if peek is None:
            raise APIError(400, "INVALID_STATE")
        n = _count_param(params, "n", DEFAULT_PEEK)
        if n is None or n > MAX_PEEK:
            raise APIError(400, "INVALID_N")
        count_of, peek_method = peek
        messages = getattr(channel, peek_method)(n)
        return _v1({
            "topic": channel.topic_name,
            "channel": channel.name,
            "state": state,
            "count": count_of(channel),
            "messages": [_message_document(msg) for msg in messages],
        })

    def _buried_selection(self, params: dict[str, list[str]]) -> tuple[bytes | None, int]:
        msg_id = _first(params, "id")
        if msg_id is not None:
            if not _MESSAGE_ID.fullmatch(msg_id):
                raise APIError(400, "INVALID_ID")
            return msg_id.encode("ascii"), 0
        n = _count_param(params, "n", None)
        if n is None and "n" in params:
            raise APIError(400, "INVALID_N")
        return None, n if n is not None else -1

    async def _channel_kick(self, request: Request, body: RequestBody, param: str) -> Response:
        """``POST /channel/kick``: buried messages back to ready (``id``, or the ``n`` oldest, or all)."""
        channel, params = self._existing_channel(request)
        msg_id, n = self._buried_selection(params)
        kicked = channel.kick(msg_id, len(channel.buried) if n < 0 else n)
        await self._persist_buried(channel)
        return _v1({"kicked": kicked})

    async def _channel_delete_buried(self, request: Request, body: RequestBody, param: str) -> Response:
        """``POST /channel/delete_buried``: drop buried messages (``id``, or the ``n`` oldest, or all)."""
        channel, params = self._existing_channel(request)
        msg_id, n = self._buried_selection(params)
        deleted = channel.delete_buried(msg_id, len(channel.buried) if n < 0 else n)
        await self._persist_buried(channel)
        return _v1({"deleted": deleted})

    async def _persist_buried(self, channel: Channel) -> None:
        try:
            await channel.persist_buried()
        except Exception as exc:
            log.error("failed to persist buried messages of %s:%s - %s", channel.topic_name, channel.name, exc)
            raise APIError(500, "INTERNAL_ERROR") from None

    async def _channel_max_attempts(self, request: Request, body: RequestBody, param: str) -> Response:
        """``POST /channel/max_attempts?value=N``: this channel's attempts limit (``default``: the flag's)."""
        channel, params = self._existing_channel(request)
        value = _first(params, "value")
        if value is None:
            raise APIError(400, "MISSING_ARG_VALUE")
        if value == "default":
            channel.set_max_attempts(None)
        else:
            limit = _count_param(params, "value", None)
            if limit is None:
                raise APIError(400, "INVALID_VALUE")
            channel.set_max_attempts(limit)
        await self._persist_metadata()  # at once, like pause: a crash must not undo it
        return _v1({"max_attempts": channel.max_attempts})


#: Messages ``/channel/peek`` returns by default, and at most.
DEFAULT_PEEK = 10
MAX_PEEK = 1000

_MESSAGE_ID = re.compile(r"[0-9a-f]{16}")

#: state -> (how many the channel holds in it, the channel's peek method)
_PEEK: dict[str, tuple[Callable[[Any], int], str]] = {
    "ready": (lambda channel: channel.depth, "peek_ready"),
    "deferred": (lambda channel: len(channel.deferred), "peek_deferred"),
    "in_flight": (lambda channel: len(channel.in_flight), "peek_in_flight"),
    "buried": (lambda channel: len(channel.buried), "peek_buried"),
}


def _count_param(params: dict[str, list[str]], key: str, default: int | None) -> int | None:
    """A non-negative decimal parameter; ``default`` when absent, None when malformed."""
    text = _first(params, key)
    if text is None:
        return default
    if not text.isdigit() or not text.isascii():
        return None
    return int(text)


def _message_document(msg: Message) -> dict:
    try:
        text = msg.body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return {
        "id": msg.id.decode("ascii", "replace"),
        "timestamp": msg.timestamp,
        "attempts": msg.attempts,
        "due": msg.due_ns,
        "body": text,
        "body_base64": base64.b64encode(msg.body).decode("ascii"),
    }


def _port(address: Any) -> int:
    """A listener's port for ``/info``: -1 for a unix socket (or no listener), as nsqd."""
    if isinstance(address, tuple) and len(address) >= 2:
        return int(address[1])
    return -1


def _read_text_mpub(data: bytes, max_msg_size: int, max_body_size: int) -> list[bytes]:
    """nsqd's text ``/mpub``: one message per line, empty lines skipped.

    ``data`` is at most ``max_body_size + 1`` bytes; reaching that many is
    ``BODY_TOO_BIG``, unless an earlier line already was ``MSG_TOO_BIG`` (nsqd checks
    line by line, in order).
    """
    blocks = data.split(b"\n")
    too_big = len(data) > max_body_size
    if too_big:
        # The block holding the last byte is where nsqd notices the size; the lines
        # before it are checked first.
        last = len(blocks) - 2 if data.endswith(b"\n") else len(blocks) - 1
        for block in blocks[:last]:
            if len(block) > max_msg_size:
                raise APIError(413, "MSG_TOO_BIG")
        raise APIError(413, "BODY_TOO_BIG")
    bodies = [block for block in blocks if block]
    for block in bodies:
        if len(block) > max_msg_size:
            raise APIError(413, "MSG_TOO_BIG")
    return bodies


_U32 = struct.Struct(">i")


def _read_binary_mpub(data: bytes, max_msg_size: int, max_body_size: int) -> list[bytes]:
    """nsqd's binary ``/mpub`` (the TCP ``MPUB`` body): ``[count][size][body]...``.

    Errors are the TCP codes without ``E_``, all 413: ``BAD_BODY`` for the count,
    ``BAD_MESSAGE`` for a message. Bytes after the last message are ignored, as nsqd
    never reads them.
    """
    if len(data) < 4:
        raise APIError(413, "BAD_BODY")
    (count,) = _U32.unpack_from(data, 0)
    if count <= 0 or count > (max_body_size - 4) // 5:
        raise APIError(413, "BAD_BODY")
    bodies = []
    pos = 4
    end = len(data)
    for _ in range(count):
        if pos + 4 > end:
            raise APIError(413, "BAD_MESSAGE")
        (size,) = _U32.unpack_from(data, pos)
        pos += 4
        if size <= 0 or size > max_msg_size:
            raise APIError(413, "BAD_MESSAGE")
        if pos + size > end:
            raise APIError(413, "BAD_MESSAGE")
        bodies.append(data[pos:pos + size])
        pos += size
    return bodies
