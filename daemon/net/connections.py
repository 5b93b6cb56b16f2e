# One destination host's keep-alive connections, as an httpx transport for `ssrf.send_vetted`.
#
# Why not httpx's own transport: its httpcore connection pool re-checks EVERY pooled connection
# (a poll() system call for each idle one) when a request starts and again when it ends, under a
# lock; with per_host_concurrency connections that was about half the CPU of a webhook request.
# The drainer already caps the requests in flight per host with its own limiter, so all this
# needs to do is hand out an idle connection: a stack of httpcore HTTP/1.1 connections, the one
# taken checked once (expired keep-alive, closed by the server, or made for another address),
# put back once its answer was read to the end, closed otherwise.
#
# `post` is the webhook drainer's way in (through `ssrf.send_vetted`): an httpcore request in,
# (status, Retry-After, capped body) out, with none of the httpx Request/Response/stream objects
# `handle_async_request` builds around the same exchange (a tenth of a webhook request's CPU).
#
# What stays as in httpx: httpcore's connection (h11, TLS with the request's `sni_hostname` and
# the certificate checked against it, timeouts from the request's extensions), keep-alive for 5 s,
# and httpx's exception types. No proxies, no HTTP/2. Requests go to the request URL's host, which
# `ssrf.pinned_post` and `ssrf.pinned_core_get` made the vetted IP; a connection serves only
# requests for its own (scheme, IP, port), so a new vetted address never reuses a connection made
# for the old one. `exchange` and `finish` are the crawl's way in: an httpcore request in, the
# answer's head out, its body read by the caller (daemon/net/answers.py reads it as httpx would).
from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Protocol

import httpcore
import httpx
import trio

from daemon.net.coalesce import CoalescingBackend


class Connection(Protocol):
    """What the pool uses of a connection: httpcore.AsyncHTTPConnection's methods (daemon/net/
    h1.py has them too)."""

    async def handle_async_request(self, request: httpcore.Request) -> httpcore.Response: ...

    def can_handle_request(self, origin: httpcore.Origin) -> bool: ...

    def is_idle(self) -> bool: ...

    def has_expired(self) -> bool: ...

    async def aclose(self) -> None: ...


KEEPALIVE_S = 5.0
"""An idle connection is closed after this long (httpx's default)."""


def httpx_error(exc: Exception) -> Exception:
    """The httpx exception httpx's own transport raises for httpcore's `exc` (else `exc`).

    httpx names its transport errors after httpcore's, so the most specific httpcore class of
    `exc` that httpx also has is the one (httpx's own table of them is private).
    """
    if isinstance(exc, httpcore.ConnectionNotAvailable):  # a pooled connection gone stale
        return httpx.RemoteProtocolError(str(exc))
    for cls in type(exc).__mro__:
        mapped = getattr(httpx, cls.__name__, None) if cls.__module__ == "httpcore" else None
        if isinstance(mapped, type) and issubclass(mapped, httpx.TransportError):
            return mapped(str(exc))
    return exc


@contextlib.contextmanager
def _as_httpx_errors() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        mapped = httpx_error(exc)
        if mapped is exc:
            raise
        raise mapped from exc


class HostConnections(httpx.AsyncBaseTransport):
    """Keep-alive HTTP/1.1 connections to one destination host; at most `max_idle` are kept
    idle. The caller caps how many requests run at once (one connection each)."""

    connection_type: Callable[..., Connection] = httpcore.AsyncHTTPConnection
    """What a connection is made as (`origin`, `ssl_context`, `keepalive_expiry`,
    `network_backend`)."""

    def __init__(
        self,
        *,
        max_idle: int,
        ssl_context: ssl.SSLContext | None = None,
        keepalive_expiry: float = KEEPALIVE_S,
    ) -> None:
        self.max_idle = max_idle
        self.ssl_context = ssl_context
        """For https (None: httpcore's default context, certificates checked)."""
        self.keepalive_expiry = keepalive_expiry
        self._idle: list[Connection] = []
        self._backend = CoalescingBackend()
        self._closed = False
        self.opened = 0
        """Connections made so far (tests)."""

    @property
    def idle(self) -> int:
        return len(self._idle)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        core = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path
            ),
            headers=request.headers.raw,
            content=request.content,
            extensions=request.extensions,
        )
        conn, response = await self.exchange(core)
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_Answer(self, conn, response),
            extensions=response.extensions,
        )

    async def post(self, request: httpcore.Request, max_body: int) -> tuple[int, str | None, bytes]:
        """Send `request` (built by the caller, `Content-Length` included) and read at most
        `max_body` bytes of the answer: (status, Retry-After, body). The lean path of
        `ssrf.send_vetted`: no httpx Request, Response or stream objects around the exchange."""
        conn, response = await self.exchange(request)
        content = b""
        try:
            with _as_httpx_errors():
                async for chunk in response.aiter_stream():
                    content += chunk
                    if len(content) >= max_body:
                        break
        finally:
            await self.finish(conn, response)
        retry_after = next(
            (v.decode("latin-1") for k, v in response.headers if k.lower() == b"retry-after"), None
        )
        return response.status, retry_after, content[:max_body]

    async def finish(self, conn: Connection, response: httpcore.Response) -> None:
        """Close `response` (its connection too if its body was not read to the end) and hand
        `conn` back, kept idle if it can serve another request."""
        try:
            with trio.CancelScope(shield=True):
                await response.aclose()
        finally:
            await self._release(conn)

    async def exchange(self, core: httpcore.Request) -> tuple[Connection, httpcore.Response]:
        """`core` (an httpcore request, its URL's host the vetted address) sent on an idle
        connection or a new one: the connection and the answer's head (httpx's exception types
        on failure). The caller reads the body from `response.stream`, then calls `finish`."""
        if self._closed:
            raise RuntimeError("the host's connections are closed")
        origin = core.url.origin
        conn = await self._take(origin)
        if conn is None:
            conn = self._connect(origin)
        try:
            with _as_httpx_errors():
                response = await conn.handle_async_request(core)
        except BaseException:
            await self._discard(conn)
            raise
        return conn, response

    def _connect(self, origin: httpcore.Origin) -> Connection:
        self.opened += 1
        return self.connection_type(
            origin,
            ssl_context=self.ssl_context,
            keepalive_expiry=self.keepalive_expiry,
            network_backend=self._backend,
        )

    async def _take(self, origin: httpcore.Origin) -> Connection | None:
        """The most recently used idle connection that can still serve `origin`; the others
        taken on the way (expired, closed by the server, another address) are closed."""
        while self._idle:
            conn = self._idle.pop()
            if conn.can_handle_request(origin) and conn.is_idle() and not conn.has_expired():
                return conn
            await self._discard(conn)
        return None

    async def _release(self, conn: Connection) -> None:
        if not self._closed and conn.is_idle() and len(self._idle) < self.max_idle:
            self._idle.append(conn)
        else:
            await self._discard(conn)

    async def _discard(self, conn: Connection) -> None:
        with trio.CancelScope(shield=True):
            await conn.aclose()

    async def aclose(self) -> None:
        """Close the idle connections; those in use close when their answer is done."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await self._discard(conn)


class _Answer(httpx.AsyncByteStream):
    """A response body that hands its connection back once closed."""

    def __init__(
        self,
        owner: HostConnections,
        conn: Connection,
        response: httpcore.Response,
    ) -> None:
        self._owner = owner
        self._conn: Connection | None = conn
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _as_httpx_errors():
            async for chunk in self._response.aiter_stream():
                yield chunk

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await self._owner.finish(conn, self._response)
