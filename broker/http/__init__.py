"""nsqd's HTTP API: an HTTP/1.1 server that reads requests as Go's does, nsqd's router and its endpoints.

:mod:`broker.http.connection` is one connection's HTTP with no I/O (bytes in, requests out;
responses in, bytes out: :mod:`~broker.http.parser`, :mod:`~broker.http.render`);
:mod:`broker.http.server` runs it over sockets (:mod:`~broker.http.transport`). Neither knows
anything of NSQ; :mod:`broker.http.api` puts the endpoint groups (:mod:`~broker.http.publish`,
:mod:`~broker.http.status`, :mod:`~broker.http.admin`, :mod:`~broker.http.inspect`) behind one
:class:`~broker.http.router.Router`.
"""

from broker.http.api import HTTPServer
from broker.http.connection import HTTPConnection
from broker.http.query import parse_query
from broker.http.responses import APIError
from broker.http.router import Router
from broker.http.server import BodyReadError, HTTP1Server, Request, RequestBody, Response

__all__ = [
    "APIError",
    "BodyReadError",
    "HTTP1Server",
    "HTTPConnection",
    "HTTPServer",
    "Request",
    "RequestBody",
    "Response",
    "Router",
    "parse_query",
]
