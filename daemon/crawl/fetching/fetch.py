# Fetching pages for users means fetching URLs chosen by strangers, so every request goes through
# the SSRF guard (daemon/net/ssrf.py): the host is resolved once, blocked ranges are
# refused unless `[crawl] allow_cidrs` allows them, and the connection goes to the vetted address
# with the original Host header and TLS SNI. httpx never follows redirects itself: each hop is
# vetted again and the caller's `check_hop` (the crawl scope) re-applied, so a redirect can lead
# neither to 169.254.169.254 nor out of a crawl's scope.
#
# A page has one time budget covering resolution, every hop and the body (time spent waiting for
# the host's turn in the HostGate is not counted), and the body is read as a stream under a byte
# cap (decompressed bytes count). Failures are FetchError with Firecrawl's
# error codes, which the API returns as they are.
#
# Connections: plain-http hops share one set of connections (kept by IP and port, which is harmless
# without TLS); https hops use a set per host name, because connections kept by IP would reuse a TLS
# session verified for another name on the same address. Those sets are httpx transports of
# daemon/net/origins.py, not httpcore's pool, whose scans of every pooled connection per request
# cost a fifth of a page's time on the event loop (the crawl's fetch slots and HostGate bound the
# requests in flight). A direct hop goes below httpx: its GET is built whole by
# `ssrf.pinned_core_get` as httpcore's request (the headers an httpx client would send, without its
# layers: cookies, auth, event hooks, redirects, none of them used here, each paid per request)
# and its answer read from httpcore's response, decoded and its headers made text as httpx would
# (daemon/net/answers.py): httpx's Request, Response and stream objects were a large part of a
# page's CPU on the event loop. Proxied hops stay on httpx's client. Resolutions are cached for a
# minute (a crawl asks for the same host thousands of times); the cached addresses are vetted at
# every use. HostGate spaces requests to one host (per-host concurrency and politeness delay)
# across every job, on trio's clock.
#
# Outbound proxies (`[crawl] proxies`, daemon/crawl/proxies.py): the target is vetted exactly as
# above FIRST, so a name resolving to a private or metadata address is refused before a proxy
# sees anything. Then the request goes to the proxy with the vetted NAME (CONNECT host:port for
# https, absolute-form for http, a SOCKS5 domain-name request): the proxy resolves the name
# again, which crawld cannot see (docs/how-to/crawl-proxies.md lists what a proxy can still
# reach). The proxy's own address is the operator's setting and is not vetted. One client per
# (proxy, TLS verification): httpx keys tunnels by the target's name, so TLS sessions are never
# shared across names.
#
# Around this room: the rules that need no connection (content types scraped, the error codes of
# a failure) are in fetch_rules.py, the per-host gate in hostgate.py.
from __future__ import annotations

import http.cookiejar
from collections import OrderedDict
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any, cast

import httpcore
import httpx
import msgspec
import trio
from prometheus_client import Counter

from daemon.crawl.config import CrawlConfig
from daemon.crawl.fetching.fetch_rules import (
    FetchError,
    accepted_content_type,
    http_failure,
    proxy_failure,
    redirect_or_refusal,
    shown_url,
    too_big,
)
from daemon.crawl.fetching.hostgate import HostGate
from daemon.crawl.proxies import RETRY_STATUSES, Proxies, ProxyServer, Rotation, Upstream
from daemon.metrics import REGISTRY
from daemon.net import tls
from daemon.net.answers import content_decoder, header_text
from daemon.net.connections import httpx_error
from daemon.net.origins import OriginConnections
from daemon.net.ssrf import (
    BlockedAddress,
    ResolutionFailed,
    Resolver,
    Vetted,
    parse_networks,
    pinned_core_get,
    system_resolver,
    vet_url,
)
from daemon.net.ttlcache import TtlCache

__all__ = [
    "FetchError",
    "FetchPolicy",
    "FetchResult",
    "Fetcher",
    "HostGate",
    "Resolver",
    "accepted_content_type",
]

_CROSS_ORIGIN_DROPPED = frozenset({"authorization", "cookie", "proxy-authorization"})
_CALLER_DROPPED = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "accept-encoding"}
)
_PROXY_DROPPED = frozenset({"proxy-authorization", "proxy-connection"})
_HTTPS_CLIENTS = 64
Sender = httpx.AsyncClient | OriginConnections
"""A proxy's client, or the connections a hop goes to directly (no client layers: the request
is built whole by `pinned_core_get`)."""
_HTTP_IDLE = 64
"""Keep-alive connections kept idle over every plain-http host."""
_HTTPS_IDLE = 8
"""Keep-alive connections kept idle per https host name."""
DNS_CACHE_SECONDS = 60.0
_DNS_CACHE_SIZE = 4096

fetches = Counter(
    "crawld_crawl_fetches",
    "Pages fetched by the crawl engine, by outcome (ok, or the Firecrawl error code)",
    ["outcome"],
    registry=REGISTRY,
)
fetched_bytes = Counter(
    "crawld_crawl_fetched_bytes", "Body bytes read by the crawl engine", registry=REGISTRY
)


class FetchPolicy(msgspec.Struct, frozen=True):
    """How pages are fetched; seconds for the timeouts, bytes for `max_bytes`."""

    user_agent: str
    connect_timeout: float
    timeout: float
    max_bytes: int
    allow_cidrs: tuple[str, ...] = ()
    max_redirects: int = 10
    proxies: tuple[ProxyServer, ...] = ()
    stealth_proxies: tuple[ProxyServer, ...] = ()
    proxy_rotation: Rotation = "per_host"

    @classmethod
    def from_config(cls, config: CrawlConfig) -> FetchPolicy:
        return cls(
            user_agent=config.user_agent,
            connect_timeout=float(config.connect_timeout),
            timeout=float(config.page_timeout),
            max_bytes=config.max_bytes,
            allow_cidrs=tuple(config.allow_cidrs),
            proxies=tuple(config.proxies),
            stealth_proxies=tuple(config.stealth_proxies),
            proxy_rotation=config.proxy_rotation,
        )


class FetchResult(msgspec.Struct, frozen=True):
    """A fetched page. `url` is the final URL; `redirects` the URLs that answered with a
    redirect, in order (the requested URL first when there was one); `headers` have
    lower-case names."""

    requested_url: str
    url: str
    status_code: int
    content_type: str
    headers: dict[str, str]
    body: bytes
    redirects: list[str] = []
    proxy_used: str = "basic"
    """Firecrawl's `metadata.proxyUsed`: the pool that answered ("basic" or "stealth")."""
    proxy: str = ""
    """The name of the upstream proxy that carried the last hop ("" when direct)."""


class _Hop(msgspec.Struct, frozen=True):
    concurrency: int | None
    delay: float | None
    any_content_type: bool


class _Budget:
    """A page's time budget, spent only while resolving and exchanging, not while waiting
    for the host's turn in the HostGate."""

    def __init__(self, seconds: float, url: str) -> None:
        self.seconds = seconds
        self.left = seconds
        self.url = url

    @contextmanager
    def spend(self) -> Iterator[None]:
        start = trio.current_time()
        with trio.move_on_after(max(self.left, 0.0)) as scope:
            yield
        self.left -= trio.current_time() - start
        if scope.cancelled_caught:
            raise FetchError(
                "SCRAPE_TIMEOUT",
                f"no complete answer from {shown_url(self.url)} within {self.seconds:g} s",
                self.url,
            )


class Fetcher:
    """Fetches pages under a FetchPolicy; one per process (it owns the connection pools)."""

    def __init__(
        self,
        policy: FetchPolicy,
        *,
        resolver: Resolver | None = None,
        gate: HostGate | None = None,
        proxies: Proxies | None = None,
    ) -> None:
        self.policy = policy
        self.gate = gate
        self.proxies = proxies or Proxies.from_servers(
            policy.proxies, policy.stealth_proxies, policy.proxy_rotation
        )
        self._proxied: dict[tuple[str, bool], httpx.AsyncClient] = {}
        self._resolver = resolver or system_resolver
        self._dns: TtlCache[tuple[str, int], list[str]] = TtlCache(
            DNS_CACHE_SECONDS, _DNS_CACHE_SIZE
        )
        self._allow = tuple(parse_networks(policy.allow_cidrs))
        self._unverified = httpx.create_ssl_context(False, trust_env=False)
        """For `skipTlsVerification` (no CA bundle read: cheap to make)."""
        self._timeouts = httpx.Timeout(policy.timeout, connect=policy.connect_timeout)
        self._core_timeouts = self._timeouts.as_dict()
        self._http = OriginConnections(max_idle=_HTTP_IDLE)
        self._https: OrderedDict[tuple[str, bool], OriginConnections] = OrderedDict()
        self._in_use: dict[int, int] = {}
        self._retired: list[Sender] = []

    async def _resolve(self, host: str, port: int) -> list[str]:
        """The resolver's answer, remembered for DNS_CACHE_SECONDS (failures are not). Every
        address is still vetted at each use, so the cache cannot let a blocked one through."""
        key = (host, port)
        now = trio.current_time()
        cached = self._dns.get(key, now)
        if cached is not None:
            return cached
        addresses = await self._resolver(host, port)
        self._dns.put(key, addresses, now)
        return addresses

    async def vet(self, url: str) -> None:
        """The SSRF guard's verdict on `url` alone, as FetchError (CRAWL_DENIAL,
        SCRAPE_DNS_RESOLUTION_ERROR, SCRAPE_SITE_ERROR), for pages the browser loads itself."""
        try:
            target = httpx.URL(url)
        except httpx.InvalidURL as exc:
            raise FetchError("SCRAPE_SITE_ERROR", f"invalid URL: {exc}", url) from None
        try:
            await vet_url(target, self._allow, resolver=self._resolve)
        except ResolutionFailed as exc:
            raise FetchError("SCRAPE_DNS_RESOLUTION_ERROR", exc.reason, url) from None
        except BlockedAddress as exc:
            raise FetchError(
                "CRAWL_DENIAL", f"{shown_url(url)} refused: {exc.reason}", url
            ) from None

    def _transport(self, scheme: str, host: str, verify: bool) -> OriginConnections:
        if scheme == "http":
            return self._http
        key = (host, verify)
        client = self._https.get(key)
        if client is None:
            context = self._unverified if not verify else tls.verifying(trust_env=False)
            client = OriginConnections(max_idle=_HTTPS_IDLE, ssl_context=context)
            self._https[key] = client
            while len(self._https) > _HTTPS_CLIENTS:
                _, old = self._https.popitem(last=False)
                self._retired.append(old)
        else:
            self._https.move_to_end(key)
        return client

    def _proxied_client(self, upstream: Upstream, verify: bool) -> httpx.AsyncClient:
        key = (upstream.name, verify)
        client = self._proxied.get(key)
        if client is None:
            client = self._proxied[key] = httpx.AsyncClient(
                proxy=upstream.httpx_proxy(),
                follow_redirects=False,
                trust_env=False,
                verify=verify,
                limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
                cookies=_no_cookies(),
            )
        return client

    async def _close_retired(self) -> None:
        idle = [c for c in self._retired if not self._in_use.get(id(c))]
        self._retired = [c for c in self._retired if self._in_use.get(id(c))]
        for client in idle:
            await client.aclose()

    async def fetch(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        skip_tls_verification: bool = False,
        check_hop: Callable[[str], str | None] | None = None,
        concurrency: int | None = None,
        delay: float | None = None,
        any_content_type: bool = False,
        proxy: str | None = None,
    ) -> FetchResult:
        """GET `url`, following up to `max_redirects` redirects by hand.

        Every hop is vetted by the SSRF guard and `check_hop(url)` (a refusal reason or None);
        a refusal raises FetchError("CRAWL_DENIAL") before anything is sent to that hop.
        `timeout` (seconds, the policy's by default) bounds the whole fetch. Bodies over
        `max_bytes` and unsupported content types raise FetchError. With a HostGate, each hop
        holds a slot of its host (`concurrency`, `delay` as HostGate.slot). `any_content_type`
        lifts the content-type check (gzipped sitemaps). `proxy` is the request's Firecrawl
        option (basic, stealth, enhanced, auto; see Proxies.attempts): with `auto` and a stealth
        pool, a 401, 403 or 429 is fetched again through the stealth pool."""
        budget = _Budget(timeout if timeout is not None else self.policy.timeout, url)
        attempts = self.proxies.attempts(proxy)
        try:
            for n, pool in enumerate(attempts):
                result = await self._follow(
                    url,
                    dict(headers or {}),
                    not skip_tls_verification,
                    check_hop,
                    _Hop(concurrency, delay, any_content_type),
                    budget,
                    pool,
                )
                if n + 1 == len(attempts) or result.status_code not in RETRY_STATUSES:
                    break
        except FetchError as exc:
            fetches.labels(exc.code).inc()
            raise
        fetches.labels("ok").inc()
        fetched_bytes.inc(len(result.body))
        return result

    async def _follow(
        self,
        url: str,
        caller_headers: dict[str, str],
        verify: bool,
        check_hop: Callable[[str], str | None] | None,
        hop: _Hop,
        budget: _Budget,
        pool: str = "basic",
    ) -> FetchResult:
        policy = self.policy
        headers = {"User-Agent": policy.user_agent, "Accept-Encoding": "gzip, deflate"}
        dropped = _CALLER_DROPPED | _PROXY_DROPPED if self.proxies.active else _CALLER_DROPPED
        headers.update((k, v) for k, v in caller_headers.items() if k.lower() not in dropped)
        current = url
        redirects: list[str] = []
        seen: set[str] = set()
        previous_host: str | None = None
        while True:
            try:
                target = httpx.URL(current)
            except httpx.InvalidURL as exc:
                raise FetchError("SCRAPE_SITE_ERROR", f"invalid URL: {exc}", url) from None
            if previous_host is not None and target.host != previous_host:
                for name in list(headers):
                    if name.lower() in _CROSS_ORIGIN_DROPPED:
                        del headers[name]
            previous_host = target.host
            vetted = await self._vet_hop(target, url, current, redirects, check_hop, budget)
            upstream = self.proxies.pick(pool, vetted.host)
            result = await self._hop(
                target, vetted, upstream, headers, verify, url, current, redirects, hop, budget
            )
            if isinstance(result, FetchResult):
                return msgspec.structs.replace(
                    result, proxy_used=pool, proxy=upstream.name if upstream else ""
                )
            redirects.append(current)
            seen.add(current)
            if len(redirects) > policy.max_redirects:
                raise FetchError(
                    "SCRAPE_SITE_ERROR", f"more than {policy.max_redirects} redirects", url
                )
            if result in seen:
                raise FetchError("SCRAPE_SITE_ERROR", "redirect loop", url)
            current = result

    async def _vet_hop(
        self,
        target: httpx.URL,
        url: str,
        current: str,
        redirects: list[str],
        check_hop: Callable[[str], str | None] | None,
        budget: _Budget,
    ) -> Vetted:
        """The hop to `current` checked by `check_hop` and the SSRF guard, or FetchError."""
        if check_hop is not None:
            reason = check_hop(current)
            if reason is not None:
                where = f"redirect to {shown_url(current)}" if redirects else "URL"
                raise FetchError("CRAWL_DENIAL", f"{where} refused: {reason}", url)
        try:
            with budget.spend():
                return await vet_url(target, self._allow, resolver=self._resolve)
        except ResolutionFailed as exc:
            raise FetchError("SCRAPE_DNS_RESOLUTION_ERROR", exc.reason, url) from None
        except BlockedAddress as exc:
            where = f"redirect to {shown_url(current)}" if redirects else shown_url(current)
            raise FetchError("CRAWL_DENIAL", f"{where} refused: {exc.reason}", url) from None

    async def _hop(
        self,
        target: httpx.URL,
        vetted: Vetted,
        upstream: Upstream | None,
        headers: dict[str, str],
        verify: bool,
        url: str,
        current: str,
        redirects: list[str],
        hop: _Hop,
        budget: _Budget,
    ) -> FetchResult | str:
        """One request to the vetted hop, directly (to the vetted address) or through
        `upstream`: the final FetchResult, or the absolute URL a redirect points to."""
        timeouts = self._timeouts
        client: Sender
        if upstream is None:
            client = self._transport(vetted.scheme, vetted.host, verify)
            request: httpx.Request | httpcore.Request = pinned_core_get(
                target, vetted, headers, self._core_timeouts
            )
        else:
            # The vetted name goes to the proxy, which resolves it itself.
            client = self._proxied_client(upstream, verify)
            request = client.build_request("GET", target, headers=headers, timeout=timeouts)
        self._in_use[id(client)] = self._in_use.get(id(client), 0) + 1
        try:
            # Waiting for the host's turn is not the page's time: only the exchange is.
            async with self._gated(vetted.host, hop.concurrency, hop.delay):
                with budget.spend():
                    result = await self._exchange(
                        client, request, url, current, redirects, hop.any_content_type, upstream
                    )
        finally:
            self._in_use[id(client)] -= 1
            if not self._in_use[id(client)]:
                del self._in_use[id(client)]
        if self._retired:
            await self._close_retired()
        return result

    @asynccontextmanager
    async def _gated(
        self, host: str, concurrency: int | None, delay: float | None
    ) -> AsyncIterator[None]:
        if self.gate is None:
            yield
            return
        async with self.gate.slot(host, concurrency=concurrency, delay=delay):
            yield

    async def _exchange(
        self,
        client: Sender,
        request: httpx.Request | httpcore.Request,
        url: str,
        current: str,
        redirects: list[str],
        any_content_type: bool,
        upstream: Upstream | None = None,
    ) -> FetchResult | str:
        """One hop: the final FetchResult, or the absolute URL a redirect points to."""
        if isinstance(client, OriginConnections):
            assert isinstance(request, httpcore.Request)
            return await self._direct(client, request, url, current, redirects, any_content_type)
        assert isinstance(request, httpx.Request) and upstream is not None
        try:
            response = await client.send(request, follow_redirects=False, stream=True)
        except httpx.HTTPError as exc:
            error = proxy_failure(exc, current, upstream)
            self.proxies.count(upstream, error.code)
            raise error from None
        if response.status_code == 407:  # the proxy's answer to an absolute-form request
            await response.aclose()
            self.proxies.count(upstream, "SCRAPE_SITE_ERROR")
            raise FetchError(
                "SCRAPE_SITE_ERROR",
                f"proxy {upstream.name} refused the credentials (407) for {shown_url(current)}",
                url,
            )
        self.proxies.count(upstream, "ok")
        try:
            headers = dict(response.headers.items())
            location = redirect_or_refusal(
                response.status_code, headers, url, current, any_content_type, self.policy.max_bytes
            )
            if location is not None:
                return location
            body = bytearray()
            try:
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > self.policy.max_bytes:
                        raise too_big(url, self.policy.max_bytes)
            except httpx.HTTPError as exc:
                raise http_failure(exc, current) from None
            return self._result(response.status_code, headers, body, url, current, redirects)
        finally:
            await response.aclose()

    async def _direct(
        self,
        transport: OriginConnections,
        request: httpcore.Request,
        url: str,
        current: str,
        redirects: list[str],
        any_content_type: bool,
    ) -> FetchResult | str:
        """A direct hop's exchange on httpcore's objects (no httpx Request or Response), its
        answer read as httpx would (daemon/net/answers.py)."""
        try:
            conn, response = await transport.exchange(request)
        except httpx.HTTPError as exc:
            raise http_failure(exc, current) from None
        try:
            headers = header_text(response.headers)
            location = redirect_or_refusal(
                response.status, headers, url, current, any_content_type, self.policy.max_bytes
            )
            if location is not None:
                return location
            decoder = content_decoder(headers)
            body = bytearray()
            cap = self.policy.max_bytes
            try:
                async for chunk in cast(AsyncIterable[bytes], response.stream):
                    body += decoder.decode(chunk)
                    if len(body) > cap:
                        raise too_big(url, cap)
                body += decoder.flush()
                if len(body) > cap:
                    raise too_big(url, cap)
            except Exception as exc:
                mapped = httpx_error(exc)
                if isinstance(mapped, httpx.HTTPError):
                    raise http_failure(mapped, current) from None
                raise
            return self._result(response.status, headers, body, url, current, redirects)
        finally:
            await transport.finish(conn, response)

    @staticmethod
    def _result(
        status: int,
        headers: dict[str, str],
        body: bytearray,
        url: str,
        current: str,
        redirects: list[str],
    ) -> FetchResult:
        return FetchResult(
            requested_url=url,
            url=current,
            status_code=status,
            content_type=headers.get("content-type", ""),
            headers=headers,
            body=bytes(body),
            redirects=list(redirects),
        )

    async def aclose(self) -> None:
        await self._http.aclose()
        for client in [*self._https.values(), *self._retired, *self._proxied.values()]:
            await client.aclose()
        self._https.clear()
        self._proxied.clear()
        self._retired.clear()

    async def __aenter__(self) -> Fetcher:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


def _no_cookies() -> http.cookiejar.CookieJar:
    return http.cookiejar.CookieJar(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
