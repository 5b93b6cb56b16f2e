# Fetching pages for users means fetching URLs chosen by strangers, so every request goes through
# the webhooks' SSRF guard (daemon/jobs/ssrf.py): the host is resolved once, blocked ranges are
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
# Connections: plain-http hops share one client (its pool is keyed by IP and port, which is
# harmless without TLS); https hops use a client per host name, because a pool keyed by IP would
# reuse a TLS session verified for another name on the same address. Resolutions are cached for a
# minute (a crawl asks for the same host thousands of times); the cached addresses are vetted at
# every use. HostGate spaces requests to one host (per-host concurrency and politeness delay)
# across every job, on trio's clock.
from __future__ import annotations

import math
import ssl
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any
from urllib.parse import urljoin

import httpx
import msgspec
import trio
from prometheus_client import Counter

from daemon.crawl.config import CrawlConfig
from daemon.jobs.ssrf import (
    BlockedAddress,
    ResolutionFailed,
    Resolver,
    new_client,
    parse_networks,
    pinned_request,
    system_resolver,
    vet_url,
)
from daemon.metrics import REGISTRY
from daemon.net.ttlcache import TtlCache
from daemon.redact import cap, redact_url

__all__ = [
    "FetchError",
    "FetchPolicy",
    "FetchResult",
    "Fetcher",
    "HostGate",
    "Resolver",
    "accepted_content_type",
]

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_CROSS_ORIGIN_DROPPED = frozenset({"authorization", "cookie", "proxy-authorization"})
_CALLER_DROPPED = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "accept-encoding"}
)
_TEXT_TYPES = frozenset(
    {"application/json", "application/xml", "application/xhtml+xml", "application/rss+xml",
     "application/pdf"}
)  # fmt: skip
_HTTPS_CLIENTS = 64
DNS_CACHE_SECONDS = 60.0
_GATE_PRUNE_AT = 1024
_GATE_PRUNE_EVERY = 60.0
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

    @classmethod
    def from_config(cls, config: CrawlConfig) -> FetchPolicy:
        return cls(
            user_agent=config.user_agent,
            connect_timeout=float(config.connect_timeout),
            timeout=float(config.page_timeout),
            max_bytes=config.max_bytes,
            allow_cidrs=tuple(config.allow_cidrs),
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


class FetchError(Exception):
    """A page that could not be fetched. `code` is Firecrawl's error code (SCRAPE_TIMEOUT,
    SCRAPE_DNS_RESOLUTION_ERROR, SCRAPE_SSL_ERROR, SCRAPE_SITE_ERROR,
    SCRAPE_UNSUPPORTED_FILE_ERROR, CRAWL_DENIAL); `message` is safe to show the user (URLs in it
    are redacted); `url` is the URL that was requested."""

    def __init__(self, code: str, message: str, url: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.url = url


def _shown(url: str) -> str:
    """A URL as it may appear in an error: credentials and query values masked, cut short."""
    return cap(redact_url(url))


def accepted_content_type(content_type: str) -> bool:
    """HTML, text/*, JSON, XML and PDF are scraped; other types (images, archives) are not.
    A missing Content-Type is accepted (the body is sniffed later)."""
    kind = content_type.split(";", 1)[0].strip().lower()
    return (
        not kind
        or kind.startswith("text/")
        or kind in _TEXT_TYPES
        or kind.endswith(("+json", "+xml"))
    )


def _is_tls_error(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, ssl.SSLError | ssl.CertificateError):
            return True
        text = str(seen)
        if "CERTIFICATE_VERIFY_FAILED" in text or "SSL" in text or "TLS" in text:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _failure(exc: httpx.HTTPError, url: str) -> FetchError:
    shown = _shown(url)
    if isinstance(exc, httpx.TimeoutException):
        return FetchError("SCRAPE_TIMEOUT", f"timed out fetching {shown}", url)
    if _is_tls_error(exc):
        return FetchError("SCRAPE_SSL_ERROR", f"TLS handshake with {shown} failed: {exc}", url)
    if isinstance(exc, httpx.ConnectError):
        return FetchError("SCRAPE_SITE_ERROR", f"cannot connect to {shown}: {exc}", url)
    return FetchError("SCRAPE_SITE_ERROR", f"error fetching {shown}: {type(exc).__name__}", url)


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
                f"no complete answer from {_shown(self.url)} within {self.seconds:g} s",
                self.url,
            )


class _HostState:
    __slots__ = ("active", "lot", "next_start", "users")

    def __init__(self) -> None:
        self.active = 0
        self.users = 0
        self.next_start = -math.inf
        self.lot = trio.lowlevel.ParkingLot()


class HostGate:
    """Per-host concurrency and politeness delay, shared by every job of the process.

    `slot(host)` admits at most `per_host` holders at once (fewer if the caller asks for a
    lower `concurrency`), and with `delay` starts holders at least `delay` seconds apart.
    `clock` returns seconds on trio's timeline (trio.current_time by default, so tests run it
    under autojump_clock)."""

    def __init__(self, per_host: int, clock: Callable[[], float] = trio.current_time) -> None:
        if per_host < 1:
            raise ValueError("per_host must be at least 1")
        self.per_host = per_host
        self._clock = clock
        self._hosts: dict[str, _HostState] = {}
        self._prune_at = _GATE_PRUNE_AT
        self._next_prune = -math.inf

    def active(self, host: str) -> int:
        state = self._hosts.get(host)
        return state.active if state else 0

    @asynccontextmanager
    async def slot(
        self, host: str, *, concurrency: int | None = None, delay: float | None = None
    ) -> AsyncIterator[None]:
        limit = min(self.per_host, concurrency or self.per_host)
        state = self._hosts.get(host)
        if state is None:
            state = self._hosts[host] = _HostState()
        state.users += 1
        try:
            while state.active >= limit:
                await state.lot.park()
            state.active += 1
            try:
                if delay:
                    start = max(self._clock(), state.next_start)
                    state.next_start = start + delay
                    wait = start - self._clock()
                    if wait > 0:
                        await trio.sleep(wait)
                yield
            finally:
                state.active -= 1
                state.lot.unpark_all()
        finally:
            state.users -= 1
            now = self._clock()
            if state.users == 0 and state.next_start <= now:
                del self._hosts[host]
            kept = len(self._hosts)
            if kept > self._prune_at or (kept > _GATE_PRUNE_AT and now >= self._next_prune):
                self._prune(now)

    def _prune(self, now: float) -> None:
        """Forget idle hosts whose politeness delay has passed (a broad crawl with a delay
        would otherwise keep one entry per host ever visited)."""
        for name in [n for n, s in self._hosts.items() if s.users == 0 and s.next_start <= now]:
            del self._hosts[name]
        self._prune_at = max(_GATE_PRUNE_AT, 2 * len(self._hosts))
        self._next_prune = now + _GATE_PRUNE_EVERY

    def __len__(self) -> int:
        """Hosts the gate currently keeps state for."""
        return len(self._hosts)


class Fetcher:
    """Fetches pages under a FetchPolicy; one per process (it owns the connection pools)."""

    def __init__(
        self,
        policy: FetchPolicy,
        *,
        resolver: Resolver | None = None,
        gate: HostGate | None = None,
    ) -> None:
        self.policy = policy
        self.gate = gate
        self._resolver = resolver or system_resolver
        self._dns: TtlCache[tuple[str, int], list[str]] = TtlCache(
            DNS_CACHE_SECONDS, _DNS_CACHE_SIZE
        )
        self._allow = parse_networks(policy.allow_cidrs)
        self._http = new_client(max_connections=256, max_keepalive=64)
        self._https: OrderedDict[tuple[str, bool], httpx.AsyncClient] = OrderedDict()
        self._in_use: dict[int, int] = {}
        self._retired: list[httpx.AsyncClient] = []

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
            raise FetchError("CRAWL_DENIAL", f"{_shown(url)} refused: {exc.reason}", url) from None

    def _client(self, scheme: str, host: str, verify: bool) -> httpx.AsyncClient:
        if scheme == "http":
            return self._http
        key = (host, verify)
        client = self._https.get(key)
        if client is None:
            client = new_client(max_connections=32, max_keepalive=8, verify=verify)
            self._https[key] = client
            while len(self._https) > _HTTPS_CLIENTS:
                _, old = self._https.popitem(last=False)
                self._retired.append(old)
        else:
            self._https.move_to_end(key)
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
    ) -> FetchResult:
        """GET `url`, following up to `max_redirects` redirects by hand.

        Every hop is vetted by the SSRF guard and `check_hop(url)` (a refusal reason or None);
        a refusal raises FetchError("CRAWL_DENIAL") before anything is sent to that hop.
        `timeout` (seconds, the policy's by default) bounds the whole fetch. Bodies over
        `max_bytes` and unsupported content types raise FetchError. With a HostGate, each hop
        holds a slot of its host (`concurrency`, `delay` as HostGate.slot). `any_content_type`
        lifts the content-type check (gzipped sitemaps)."""
        budget = _Budget(timeout if timeout is not None else self.policy.timeout, url)
        try:
            result = await self._follow(
                url,
                dict(headers or {}),
                not skip_tls_verification,
                check_hop,
                _Hop(concurrency, delay, any_content_type),
                budget,
            )
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
    ) -> FetchResult:
        policy = self.policy
        headers = {"User-Agent": policy.user_agent, "Accept-Encoding": "gzip, deflate"}
        headers.update(
            (k, v) for k, v in caller_headers.items() if k.lower() not in _CALLER_DROPPED
        )
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
            if check_hop is not None:
                reason = check_hop(current)
                if reason is not None:
                    where = f"redirect to {_shown(current)}" if redirects else "URL"
                    raise FetchError("CRAWL_DENIAL", f"{where} refused: {reason}", url)
            try:
                with budget.spend():
                    vetted = await vet_url(target, self._allow, resolver=self._resolve)
            except ResolutionFailed as exc:
                raise FetchError("SCRAPE_DNS_RESOLUTION_ERROR", exc.reason, url) from None
            except BlockedAddress as exc:
                where = f"redirect to {_shown(current)}" if redirects else _shown(current)
                raise FetchError("CRAWL_DENIAL", f"{where} refused: {exc.reason}", url) from None
            client = self._client(vetted.scheme, vetted.host, verify)
            timeouts = httpx.Timeout(policy.timeout, connect=policy.connect_timeout)
            request = pinned_request(client, target, vetted, None, headers, timeouts, method="GET")
            self._in_use[id(client)] = self._in_use.get(id(client), 0) + 1
            try:
                # Waiting for the host's turn is not the page's time: only the exchange is.
                async with self._gated(vetted.host, hop.concurrency, hop.delay):
                    with budget.spend():
                        result = await self._exchange(
                            client, request, url, current, redirects, hop.any_content_type
                        )
            finally:
                self._in_use[id(client)] -= 1
                if not self._in_use[id(client)]:
                    del self._in_use[id(client)]
            if self._retired:
                await self._close_retired()
            if isinstance(result, FetchResult):
                return result
            redirects.append(current)
            seen.add(current)
            if len(redirects) > policy.max_redirects:
                raise FetchError(
                    "SCRAPE_SITE_ERROR", f"more than {policy.max_redirects} redirects", url
                )
            if result in seen:
                raise FetchError("SCRAPE_SITE_ERROR", "redirect loop", url)
            current = result

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
        client: httpx.AsyncClient,
        request: httpx.Request,
        url: str,
        current: str,
        redirects: list[str],
        any_content_type: bool,
    ) -> FetchResult | str:
        """One hop: the final FetchResult, or the absolute URL a redirect points to."""
        try:
            response = await client.send(request, follow_redirects=False, stream=True)
        except httpx.HTTPError as exc:
            raise _failure(exc, current) from None
        try:
            location = response.headers.get("location")
            if response.status_code in REDIRECT_STATUSES and location:
                try:
                    return urljoin(current, location.strip())
                except ValueError:
                    raise FetchError(
                        "SCRAPE_SITE_ERROR", "redirect to an invalid URL", url
                    ) from None
            content_type = response.headers.get("content-type", "")
            if not any_content_type and not accepted_content_type(content_type):
                kind = content_type.split(";", 1)[0].strip()
                raise FetchError(
                    "SCRAPE_UNSUPPORTED_FILE_ERROR", f"unsupported content type {kind!r}", url
                )
            body = await self._read_capped(response, url, current)
            return FetchResult(
                requested_url=url,
                url=current,
                status_code=response.status_code,
                content_type=content_type,
                headers={k.lower(): v for k, v in response.headers.items()},
                body=body,
                redirects=list(redirects),
            )
        finally:
            await response.aclose()

    async def _read_capped(self, response: httpx.Response, url: str, current: str) -> bytes:
        cap = self.policy.max_bytes
        declared = response.headers.get("content-length", "")
        too_big = FetchError(
            "SCRAPE_SITE_ERROR", f"page larger than the size cap ({cap} bytes)", url
        )
        if (
            declared.isdigit()
            and int(declared) > cap
            and "content-encoding" not in response.headers
        ):
            raise too_big
        body = bytearray()
        try:
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > cap:
                    raise too_big
        except httpx.HTTPError as exc:
            raise _failure(exc, current) from None
        return bytes(body)

    async def aclose(self) -> None:
        await self._http.aclose()
        for client in [*self._https.values(), *self._retired]:
            await client.aclose()
        self._https.clear()
        self._retired.clear()

    async def __aenter__(self) -> Fetcher:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
