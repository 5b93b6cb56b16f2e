# The HTTP edge: every request passes these checks before a route sees it, so the routes any area
# adds (collector, jobs, tracker, crawl) are covered without doing anything themselves. The rules
# are pure functions over header values, tested with tables; `EdgeMiddleware` is the thin ASGI
# shell that applies them in order and counts what it refused. It sits inside Starlette's error
# middleware, so its early answers use the same JSON shape as every other error.
#
# Order: concurrency cap (503) → head size (431) → Host allow-list (421) → body size by
# Content-Length (413) → API key, or the console's session cookie with its CSRF token (401/403)
# → browser cross-site request (403) → JSON Content-Type on methods that change data (415).
# Then the body is counted as it streams (chunked bodies have no Content-Length: 413) and must
# arrive within `body_timeout` (408), so a trickling upload cannot hold a slot forever.
# /healthz skips the cap, the Host, key and cross-site checks: a monitor must reach it even when
# the API is full.
#
# WebSocket handshakes (the crawl watcher) pass the same Host, key and cross-site checks; the key
# may also come as the `Sec-WebSocket-Protocol` value, where browsers and the JS SDK put it. A
# refused handshake gets the same JSON answer as HTTP (ASGI's websocket.http.response). Open
# sockets are capped at `max_concurrent_requests` of their own, since each may last a whole crawl.
#
# Upload routes (POST /v2/parse) are the one exception to "JSON or nothing": their route declares
# a body limit of its own (EdgePolicy.uploads, read at each request so a reload applies), and
# there multipart/form-data is accepted. A browser form could post one cross-site, so the key and
# the cross-site check still apply there as everywhere.
from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

import trio
from prometheus_client import Counter
from starlette.websockets import WebSocket

from daemon import metrics
from daemon.api.errors import HTTPError, JSONResponse, error_response
from daemon.config import HttpConfig

OPEN_PATHS = frozenset({"/healthz"})
"""Paths that need no key, no allowed Host and are never refused as busy."""
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
DEFAULT_HOST_NAMES = ("localhost", "127.0.0.1", "[::1]")
MIN_KEY_LENGTH = 16
"""Shorter API keys are refused by the config check (a key is a password nobody types)."""

refused = Counter(
    "crawld_http_refused",
    "Requests the HTTP edge refused before a route saw them, by reason",
    ["reason"],
    registry=metrics.REGISTRY,
)


class BodyTooLarge(HTTPError):
    def __init__(self, limit: int) -> None:
        super().__init__(413, "request body too large", {"max_body": limit})


class BodyTooSlow(HTTPError):
    def __init__(self, seconds: float) -> None:
        super().__init__(408, "request body not received in time", {"body_timeout_s": seconds})


def parse_keys(value: str | None) -> tuple[bytes, ...]:
    """The API keys in an environment variable's value: comma-separated, blanks ignored."""
    if value is None:
        return ()
    return tuple(k.strip().encode() for k in value.split(",") if k.strip())


def bearer_matches(authorization: str | None, keys: Iterable[bytes]) -> bool:
    """Whether `Authorization: Bearer <token>` carries one of `keys` (constant-time per key)."""
    if authorization is None:
        return False
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return False
    given = token.strip().encode("utf-8", "surrogateescape")
    found = False
    for key in keys:  # no early exit: every key is compared
        found |= hmac.compare_digest(given, key)
    return found


def split_host(value: str) -> tuple[str, int | None]:
    """("name", port or None) of a Host header or a `hosts` entry; IPv6 keeps its brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        if "]" not in value:
            return "", None
        name, _, rest = value.partition("]")
        name += "]"
        port = rest[1:] if rest.startswith(":") else ""
    elif value.count(":") > 1:  # a bare IPv6 address in the config
        name, port = f"[{value}]", ""
    else:
        name, _, port = value.partition(":")
    name = name.rstrip(".")
    if port:
        if not (port.isascii() and port.isdigit() and len(port) <= 5):
            return "", None
        return name, int(port)
    return name, None


@dataclass(frozen=True)
class HostRule:
    """Accepted Host names; an entry without a port accepts no port or the listening port."""

    entries: tuple[tuple[str, int | None], ...]
    any_host: bool = False

    @classmethod
    def from_config(cls, http: HttpConfig) -> HostRule:
        if "*" in http.hosts:
            return cls((), any_host=True)
        if http.hosts:
            return cls(tuple(split_host(h) for h in http.hosts))
        bind_host = http.bind.rpartition(":")[0]
        names = [split_host(bind_host)[0], *DEFAULT_HOST_NAMES]
        return cls(tuple((n, None) for n in dict.fromkeys(names)))

    def allows(self, host_header: str | None, listening_port: int | None) -> bool:
        if self.any_host:
            return True
        if not host_header:
            return False
        name, port = split_host(host_header)
        for allowed, allowed_port in self.entries:
            if name != allowed:
                continue
            if allowed_port is None:
                if port is None or port == listening_port:
                    return True
            elif port == allowed_port or (port is None and allowed_port == 80):
                return True
        return False


def _origin_authority(origin: str) -> str | None:
    try:
        parts = urlsplit(origin)
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return None
    default = ":80" if parts.scheme == "http" else ":443"
    return parts.netloc.lower().removesuffix(default)


def cross_site_reason(
    sec_fetch_site: str | None, origin: str | None, host_header: str | None
) -> str | None:
    """Why a request comes from another site's page (a browser sent it for that page), or None.

    `Sec-Fetch-Site` is set by current browsers on every request; `Origin` by older ones on
    non-GET requests. A request with neither comes from a program (curl, an SDK), not a page.
    """
    if sec_fetch_site is not None and sec_fetch_site.strip().lower() in ("cross-site", "same-site"):
        return f"Sec-Fetch-Site: {sec_fetch_site.strip().lower()}"
    if origin is not None:
        authority = _origin_authority(origin.strip())
        host = (host_header or "").strip().lower()
        for suffix in (":80", ":443"):
            host = host.removesuffix(suffix)
        if authority is None or authority != host:
            return "Origin is not this server"
    return None


def is_json_media_type(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def media_type_refusal(
    method: str,
    content_type: str | None,
    content_length: str | None,
    chunked: bool,
    upload: bool = False,
) -> str | None:
    """Why a request that may change data has a body that is not JSON, or None.

    Methods other than GET/HEAD/OPTIONS carry either JSON or nothing: an HTML form or a
    `text/plain` fetch cannot reach a route that changes data.
    """
    if method in SAFE_METHODS:
        return None
    if content_type is not None:
        if is_json_media_type(content_type):
            return None
        if upload and content_type.split(";", 1)[0].strip().lower() == "multipart/form-data":
            return None
        if upload:
            return "Content-Type must be multipart/form-data (or application/json)"
        return "Content-Type must be application/json"
    has_body = chunked or (content_length is not None and content_length.strip() not in ("", "0"))
    return "a request body needs Content-Type: application/json" if has_body else None


@dataclass(frozen=True)
class EdgePolicy:
    keys: tuple[bytes, ...]
    hosts: HostRule
    metrics_public: bool
    max_body: int
    body_timeout: float
    max_concurrent: int
    max_head: int = 16 * 1024
    uploads: Mapping[str, Callable[[], int]] = field(default_factory=dict)
    """Upload paths (multipart/form-data accepted) and their own body limit, in bytes."""

    def body_limit(self, path: str) -> int:
        """The largest body `path` takes: its upload limit, else max_body."""
        limit = self.uploads.get(path)
        return limit() if limit is not None else self.max_body

    @classmethod
    def from_config(cls, http: HttpConfig, key_value: str | None) -> EdgePolicy:
        return cls(
            keys=parse_keys(key_value),
            hosts=HostRule.from_config(http),
            metrics_public=http.metrics_public,
            max_body=http.max_body,
            body_timeout=float(http.body_timeout),
            max_concurrent=http.max_concurrent_requests,
            max_head=http.max_header_bytes,
        )

    def needs_key(self, path: str) -> bool:
        if not self.keys or path in OPEN_PATHS:
            return False
        return not (self.metrics_public and path == "/metrics")


class SessionCheck(Protocol):
    """A second way in besides the bearer key: the console's session cookie (daemon/ui).

    `keyless(path)` names the paths a browser must reach before it has a session (the console's
    page, its assets, the login route): they skip the key check, never the Host or cross-site
    rules. `refusal(headers, method)` is None when the request carries a valid session (and, on
    a method that changes data, its CSRF token), else (status, detail)."""

    def keyless(self, path: str) -> bool: ...

    def refusal(self, headers: Mapping[str, str], method: str) -> tuple[int, str] | None: ...


@dataclass
class EdgeStats:
    """What the edge is doing, for /status: requests in progress and refusals by reason."""

    active: int = 0
    websockets: int = 0
    refused: dict[str, int] = field(default_factory=dict)

    def refuse(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1
        refused.labels(reason).inc()


def unauthorized(detail: str) -> JSONResponse:
    """401 in Firecrawl's SDK shape and ours, with the challenge RFC 6750 asks for."""
    response = JSONResponse(
        {"success": False, "error": "Unauthorized", "detail": detail}, status_code=401
    )
    response.headers["WWW-Authenticate"] = 'Bearer realm="crawld"'
    return response


def _headers(scope: Mapping[str, Any]) -> dict[str, str]:
    found: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", ()):
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1")
        if name not in found:
            found[name] = value
        elif name != "host":  # a repeated header is one comma-joined value (RFC 9110 5.3)
            found[name] = f"{found[name]}, {value}"
    return found


def _chunked(headers: Mapping[str, str]) -> bool:
    return "chunked" in headers.get("transfer-encoding", "").lower()


def _has_body(headers: Mapping[str, str]) -> bool:
    return _chunked(headers) or headers.get("content-length", "0").strip() not in ("", "0")


class EdgeMiddleware:
    """ASGI middleware applying EdgePolicy to every HTTP request."""

    def __init__(
        self,
        app: Any,
        policy: EdgePolicy,
        stats: EdgeStats | None = None,
        sessions: SessionCheck | None = None,
    ) -> None:
        self.app = app
        self.policy = policy
        self.stats = stats if stats is not None else EdgeStats()
        self.sessions = sessions

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            await self.websocket(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        body = _Body(receive, self.policy, self.stats, has_body=_has_body(headers),
                     limit=self.policy.body_limit(scope.get("path", "")))  # fmt: skip
        refusal = self.check(scope, headers)
        if refusal is not None:
            reason, response = refusal
            self.stats.refuse(reason)
            await response(scope, receive, body.send_wrapper(send))
            return
        self.stats.active += 1
        try:
            await self.app(scope, body.receive, body.send_wrapper(send))
        finally:
            self.stats.active -= 1

    async def websocket(self, scope: Any, receive: Any, send: Any) -> None:
        refusal = self.check(scope, _headers(scope))
        if refusal is None:
            self.stats.websockets += 1
            try:
                await self.app(scope, receive, send)
            finally:
                self.stats.websockets -= 1
            return
        reason, response = refusal
        self.stats.refuse(reason)
        message = await receive()  # websocket.connect: the handshake waits for our answer
        if message["type"] != "websocket.connect":
            return
        if "websocket.http.response" in scope.get("extensions", {}):
            await WebSocket(scope, receive, send).send_denial_response(response)
        else:
            await send({"type": "websocket.close", "code": 1008})

    def key_matches(self, scope: Mapping[str, Any], headers: Mapping[str, str]) -> bool:
        keys = self.policy.keys
        if bearer_matches(headers.get("authorization"), keys):
            return True
        if scope.get("type") == "websocket":
            offered = scope.get("subprotocols") or ()
            return any(bearer_matches(f"Bearer {p}", keys) for p in offered)
        return False

    def check(
        self, scope: Mapping[str, Any], headers: Mapping[str, str]
    ) -> tuple[str, JSONResponse] | None:
        """The first rule the request breaks, as (metric reason, answer), or None."""
        policy = self.policy
        path = scope.get("path", "")
        open_path = path in OPEN_PATHS
        busy = self.stats.websockets if scope.get("type") == "websocket" else self.stats.active
        if not open_path and busy >= policy.max_concurrent:
            response = error_response(503, "too many requests in progress", {
                "max_concurrent_requests": policy.max_concurrent})  # fmt: skip
            response.headers["Retry-After"] = "1"
            return "busy", response
        head = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
        head += sum(len(k) + len(v) + 4 for k, v in scope.get("headers", ()))
        if head > policy.max_head:
            # hypercorn stops a head that grows past the limit while it arrives; one that came
            # in a single read is measured here.
            return "head_too_large", error_response(
                431, "request line and headers too large", {"max_header_bytes": policy.max_head}
            )
        server = scope.get("server")
        port = server[1] if server else None
        host = headers.get("host")
        if not open_path and not policy.hosts.allows(host, port):
            return "host", error_response(
                421, "Host not accepted by this server", {"host": host, "setting": "[http] hosts"}
            )
        length = headers.get("content-length")
        if length is not None:
            if not (length.strip().isascii() and length.strip().isdigit()):
                return "bad_length", error_response(400, "invalid Content-Length", None)
            if int(length) > (limit := policy.body_limit(path)):
                return "too_large", error_response(
                    413, "request body too large", {"max_body": limit}
                )
        sessions = self.sessions
        keyless = sessions is not None and sessions.keyless(path)
        if policy.needs_key(path) and not keyless and not self.key_matches(scope, headers):
            if sessions is not None and "cookie" in headers and "authorization" not in headers:
                why = sessions.refusal(headers, scope.get("method", "GET"))
                if why is None:
                    return self._after_key(scope, headers, length, open_path)
                if why[0] == 403:
                    return "csrf", error_response(403, "CSRF token missing or wrong", why[1])
            given = "authorization" in headers or scope.get("subprotocols")
            detail = "the API key is not valid" if given else "send Authorization: Bearer <key>"
            if scope.get("type") == "websocket" and not given:
                detail += " (or the key as Sec-WebSocket-Protocol)"
            return "unauthorized", unauthorized(detail)
        return self._after_key(scope, headers, length, open_path)

    def _after_key(
        self,
        scope: Mapping[str, Any],
        headers: Mapping[str, str],
        length: str | None,
        open_path: bool,
    ) -> tuple[str, JSONResponse] | None:
        host = headers.get("host")
        if not open_path:
            reason = cross_site_reason(headers.get("sec-fetch-site"), headers.get("origin"), host)
            if reason is not None:
                return "cross_site", error_response(
                    403, "cross-site browser requests are refused", reason
                )
        why = media_type_refusal(scope.get("method", "GET"), headers.get("content-type"),
                                 length, _chunked(headers),
                                 scope.get("path", "") in self.policy.uploads)  # fmt: skip
        if why is not None:
            return "media_type", error_response(415, "unsupported media type", why)
        return None


class _Body:
    """One request's body as the app reads it: counted against max_body, due by body_timeout.

    An answer sent before the body was read completely says `Connection: close`: the server
    drops the rest of the body with the connection, and a client must not reuse it."""

    def __init__(
        self,
        receive: Any,
        policy: EdgePolicy,
        stats: EdgeStats,
        *,
        has_body: bool,
        limit: int | None = None,
    ) -> None:
        self._receive = receive
        self.policy = policy
        self.limit = policy.max_body if limit is None else limit
        self.stats = stats
        self.deadline = trio.current_time() + policy.body_timeout
        self.received = 0
        self.complete = not has_body

    async def receive(self) -> Any:
        if self.complete:
            return await self._receive()
        with trio.move_on_at(self.deadline):
            message = await self._receive()
            if message["type"] == "http.request":
                self.received += len(message.get("body", b""))
                if self.received > self.limit:
                    self.stats.refuse("too_large")
                    raise BodyTooLarge(self.limit)
                self.complete = not message.get("more_body", False)
            return message
        self.stats.refuse("body_timeout")
        raise BodyTooSlow(self.policy.body_timeout)

    def send_wrapper(self, send: Any) -> Any:
        async def wrapped(message: Any) -> None:
            if message["type"] == "http.response.start" and not self.complete:
                message = {**message, "headers": [*message.get("headers", ()),
                                                  (b"connection", b"close")]}  # fmt: skip
            await send(message)

        return wrapped
