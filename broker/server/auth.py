"""AUTH against ``--auth-http-address`` servers, as nsqd's ``internal/auth`` does it.

A client's ``AUTH <secret>`` makes the broker ask an auth server
``GET /auth?common_name=..&remote_ip=..&secret=..&tls=true|false`` (a full URL given as the
address is used as it is, with the query appended). The JSON answer names an ``identity``,
an ``identity_url``, a ``ttl`` in seconds and ``authorizations``: each a ``topic`` regular
expression, ``channels`` regular expressions and ``permissions`` (``subscribe``,
``publish``). The answer is cached for ``ttl`` seconds and asked again when a command
needs it after that. Servers are tried in turn from a random one until one answers;
each request is bounded by ``--http-client-connect-timeout`` and
``--http-client-request-timeout``. The regular expressions are Go's (RE2: no backtracking,
so a grant like ``^(a+)+$`` costs microseconds on any name) and match anywhere in the name,
as Go's ``MatchString`` does; an answer with a pattern Go cannot compile fails AUTH.
"""

from __future__ import annotations

import random
import ssl
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlencode

import trio

from broker.gocompat import GoRegexp, compile_go, go_quote_str, replace_surrogates
from broker.gocompat.unmarshal import GO_INT, GO_STRING, GoSlice, GoStruct, unmarshal

if TYPE_CHECKING:
    import httpx

__all__ = ["AuthError", "Authorization", "AuthState", "AuthClient", "PERMISSIONS"]

#: The permissions an auth server may grant.
PERMISSIONS = frozenset({"subscribe", "publish"})
#: The largest auth server answer read (bytes). A real one names a few grants: a few KB.
MAX_ANSWER_SIZE = 1 << 20
#: Answers larger than this (bytes) are decoded, and their patterns compiled, in a worker
#: thread: thousands of grants take a good part of a second, which the event loop must not wait.
_DECODE_INLINE_BELOW = 64 * 1024
#: How many (topic, channel) verdicts an answer remembers.
_REMEMBERED = 1024
#: The longest URL httpx sends (``httpx._urlparse.MAX_URL_LENGTH``); a longer secret cannot fit.
_MAX_URL_LENGTH = 65536


class AuthError(Exception):
    """No auth server gave a usable answer; the message says why, for the log only."""


@dataclass(frozen=True, slots=True)
class Authorization:
    """One grant: a topic pattern, channel patterns and permissions."""

    topic: GoRegexp
    channels: tuple[GoRegexp, ...]
    permissions: frozenset[str]

    def allows(self, topic: str, channel: str) -> bool:
        """Whether this grant lets a client subscribe to ``topic``/``channel`` or, with
        ``channel`` "", publish to ``topic``."""
        if ("subscribe" if channel else "publish") not in self.permissions:
            return False
        if not self.topic.match_string(topic):
            return False
        return any(pattern.match_string(channel) for pattern in self.channels)


@dataclass(frozen=True, slots=True)
class AuthState:
    """An auth server's answer for one client, valid until ``expires`` (trio time)."""

    identity: str
    identity_url: str
    authorizations: tuple[Authorization, ...]
    expires: float
    #: what :meth:`allows` found for each (topic, channel) asked (a client asks of a few, often)
    _allowed: dict[tuple[str, str], bool] = field(default_factory=dict, compare=False, repr=False)

    def allows(self, topic: str, channel: str) -> bool:
        """Whether any grant allows the command (see :meth:`Authorization.allows`).

        Remembered per name pair, so an answer of thousands of grants costs its scan once
        per pair, not once per command.
        """
        key = (topic, channel)
        allowed = self._allowed.get(key)
        if allowed is None:
            allowed = any(grant.allows(topic, channel) for grant in self.authorizations)
            if len(self._allowed) >= _REMEMBERED:
                self._allowed.clear()
            self._allowed[key] = allowed
        return allowed

    def expired(self) -> bool:
        """True once ``ttl`` seconds have passed since the answer."""
        return self.expires < trio.current_time()


def _go_quote(data: bytes) -> str:
    """Go's ``%q`` of a body, enough for the log line (printable ASCII kept, the rest escaped)."""
    out = []
    for byte in data:
        char = chr(byte)
        if char in '"\\':
            out.append("\\" + char)
        elif 0x20 <= byte < 0x7F:
            out.append(char)
        else:
            out.append({0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}.get(byte, f"\\x{byte:02x}"))
    return '"' + "".join(out) + '"'


def _compile(pattern: str, what: str) -> GoRegexp:
    pattern = replace_surrogates(pattern)  # what Go's JSON decoder reads
    try:
        return compile_go(pattern)
    except ValueError as exc:
        raise AuthError(f"unable to compile {what} {go_quote_str(pattern)} {exc}") from None


#: nsqd's ``auth.State`` and ``auth.Authorization``, as the answer is decoded into them
_AUTHORIZATION = GoStruct("auth.Authorization", {"topic": GO_STRING, "channels": GoSlice(GO_STRING),
                                                 "permissions": GoSlice(GO_STRING)})
_STATE = GoStruct("auth.State", {"ttl": GO_INT, "authorizations": GoSlice(_AUTHORIZATION), "identity": GO_STRING,
                                 "identity_url": GO_STRING})


def parse_state(body: bytes, now: float) -> AuthState:
    """An auth server's JSON answer as an :class:`AuthState`; raises :class:`AuthError`
    with nsqd's reasons (a value of the wrong type, unknown permission, bad regular
    expression, ``ttl`` not > 0). Keys match ignoring case, as Go's decoder matches them."""
    try:
        doc = unmarshal(body, _STATE)
    except ValueError as exc:
        # a value of the wrong type has Go's words; what is not JSON at all is said so
        raise AuthError(str(exc) if str(exc).startswith("json: ") else f"invalid JSON - {exc}") from None
    authorizations = []
    for grant in doc["authorizations"]:
        for permission in grant["permissions"]:
            if permission not in PERMISSIONS:
                raise AuthError(f"unknown permission {replace_surrogates(permission)}")
        authorizations.append(Authorization(
            _compile(grant["topic"], "topic"),
            tuple(_compile(channel, "channel") for channel in grant["channels"]),
            frozenset(grant["permissions"]),
        ))
    ttl = doc["ttl"]
    if ttl <= 0:
        raise AuthError(f"invalid TTL {ttl} (must be >0)")
    return AuthState(replace_surrogates(doc["identity"]), replace_surrogates(doc["identity_url"]),
                     tuple(authorizations), now + ttl)


class AuthClient:
    """Asks the auth servers about clients; one per broker, shared by every connection.

    ``connect_timeout`` and ``request_timeout`` are seconds (0: no limit, as in Go);
    ``ssl_context`` verifies ``https://`` auth servers.
    """

    def __init__(self, addresses: tuple[str, ...], connect_timeout: float, request_timeout: float,
                 ssl_context: ssl.SSLContext):
        self.addresses = addresses
        self.connect_timeout = connect_timeout or None
        self.request_timeout = request_timeout or None
        self.ssl_context = ssl_context

    async def query(self, remote_ip: str, tls: bool, secret: str, common_name: str) -> AuthState:
        """The first good answer, trying every server once from a random one.

        Raises :class:`AuthError` naming each server's failure (``failed to auth against
        <addr> - <cause>``, joined with ``; ``).
        """
        errors: list[str] = []
        count = len(self.addresses)
        start = random.randrange(count)
        for i in range(count):
            address = self.addresses[(start + i) % count]
            try:
                return await self._query_one(address, remote_ip, tls, secret, common_name)
            except AuthError as exc:
                errors.append(f"failed to auth against {address} - {exc}")
        raise AuthError("; ".join(errors))

    async def _query_one(self, address: str, remote_ip: str, tls: bool, secret: str, common_name: str) -> AuthState:
        if len(secret) > _MAX_URL_LENGTH:  # refused before megabytes are percent-encoded for nothing
            raise AuthError("InvalidURL: URL too long")
        query = urlencode(sorted({
            "remote_ip": remote_ip,
            "tls": "true" if tls else "false",
            "secret": secret,
            "common_name": common_name,
        }.items()))
        endpoint = f"{address}?{query}" if "://" in address else f"http://{address}/auth?{query}"
        import httpx  # only a broker with an auth server pays for importing it

        timeout = httpx.Timeout(self.request_timeout, connect=self.connect_timeout)
        try:
            with trio.fail_after(self.request_timeout or float("inf")):
                async with httpx.AsyncClient(verify=self.ssl_context, timeout=timeout) as http, \
                        http.stream("GET", endpoint, headers={"Accept": "application/vnd.nsq; version=1.0"}) as response:
                    body = await _read_answer(response)
        except trio.TooSlowError as exc:
            raise AuthError("request timed out") from exc
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise AuthError(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise AuthError(f"got response {response.status_code} {response.reason_phrase} {_go_quote(body)}")
        if len(body) < _DECODE_INLINE_BELOW:
            return parse_state(body, trio.current_time())
        return await trio.to_thread.run_sync(parse_state, body, trio.current_time())


async def _read_answer(response: httpx.Response) -> bytes:
    """The answer's body; raises :class:`AuthError` past :data:`MAX_ANSWER_SIZE` bytes."""
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > MAX_ANSWER_SIZE:
            raise AuthError(f"answer too large (over {MAX_ANSWER_SIZE} bytes)")
    return bytes(body)
