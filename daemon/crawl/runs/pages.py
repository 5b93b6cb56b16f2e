# One page, from URL to Firecrawl document, choosing the engine (point 2 of issue 17):
#
#   - plain HTTP first (daemon/crawl/fetching/fetch.py): it is fast, and its answer says what
#     the URL is;
#   - the browser straight away when the request asks for what only a browser gives (waitFor,
#     actions, a screenshot, mobile) or `[crawl] render = "always"`; the URL is vetted by the SSRF
#     guard and the crawl scope first, so refusals carry the same codes as with HTTP;
#   - with `render = "auto"`, the browser again when the HTTP answer looks script-built
#     (render_rules.script_built: an app root or a <noscript> asking for JavaScript and little
#     text); if that render fails, the HTTP document is kept with a `warning`;
#   - files (PDFs, images, office documents: by their bytes first, then the Content-Type and the
#     extension, daemon/crawl/documents/sniff.py) become documents through the DocumentReader
#     (text layers, OCR, office conversion), also when the browser was asked for and the URL
#     turned out to be a file.
#
# `metadata.engine` says which produced the document: "http", "browser", "pdf", "image" or
# "document". Whatever produced it, the LLM formats (json, summary, question, highlights, query)
# are added last, from its markdown (daemon/crawl/options/llm_formats.py), outside the fetch slot,
# then changeTracking (its snapshot swap, daemon/crawl/tracking/store.py). The document cache
# (daemon/crawl/cache/documents.py) is asked first and given the finished document last.
from __future__ import annotations

import contextlib
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec
import trio

from daemon.crawl.cache import rules as cache_rules
from daemon.crawl.cache.documents import Cached, DocumentCache, Hit
from daemon.crawl.cache.rules import CachePlan
from daemon.crawl.content import attributes
from daemon.crawl.content.document import DocumentOptions, is_html, with_fetch_metadata
from daemon.crawl.documents.errors import DocumentError
from daemon.crawl.documents.parsers import ParserPlan, parser_plan
from daemon.crawl.documents.reader import DocumentReader
from daemon.crawl.documents.sniff import document_kind
from daemon.crawl.fetching.fetch import Fetcher, FetchError, FetchResult, HostGate
from daemon.crawl.fetching.urls import parse_http_url
from daemon.crawl.options import llm_formats
from daemon.crawl.options.scrape_options import SCRAPE_DEFAULTS, ScrapeOptions, document_options
from daemon.crawl.proxies import RETRY_STATUSES
from daemon.crawl.rendering import render_rules as rr
from daemon.crawl.rendering.browser import BrowserPool
from daemon.crawl.rendering.render import NotRenderable, Rendered, RenderError, RenderSpec, render
from daemon.crawl.tracking.changes import TrackingSpec, tracking_spec
from daemon.crawl.tracking.store import ChangeTracker

__all__ = ["PageMaker", "PagePlan", "Produced", "page_plan"]

DocumentFn = Callable[
    [FetchResult, DocumentOptions, str], Awaitable[tuple[dict[str, Any], list[str]]]
]


class PagePlan(msgspec.Struct, frozen=True):
    """What a request's scrape options mean for each of its pages, computed once per job."""

    doc: DocumentOptions
    headers: dict[str, str]
    timeout: float
    skip_tls_verification: bool
    forced: tuple[str, ...]
    """Why the browser must render (empty: HTTP may do)."""
    spec: RenderSpec
    parsers: ParserPlan
    """What files are parsed, and how (Firecrawl's `parsers`)."""
    retain: bool = True
    """False (zeroDataRetention): nothing of the page is kept, OCR results included."""
    proxy: str | None = None
    """Firecrawl's `proxy` option (daemon/crawl/proxies.py Proxies.attempts)."""
    llm: llm_formats.LlmPlan | None = None
    """The formats a model answers (None: none was asked for)."""
    cache: CachePlan | None = None
    """What the document cache may do for these pages (None: nothing)."""
    tracking: TrackingSpec | None = None
    """The changeTracking format (None: not asked for)."""

    def fetch_kw(self) -> dict[str, Any]:
        return {
            "headers": self.headers,
            "timeout": self.timeout,
            "skip_tls_verification": self.skip_tls_verification,
            "proxy": self.proxy,
        }


def page_plan(
    options: ScrapeOptions,
    page_timeout: float,
    max_screenshot_height: int = 16384,
    *,
    zero_data_retention: bool = False,
) -> PagePlan:
    """The plan of already validated options (problems were a 400 at the request)."""
    skip_tls = options.skipTlsVerification
    if skip_tls is None:
        skip_tls = not options.headers
    timeout = options.timeout / 1000 if options.timeout is not None else page_timeout
    actions, _ = rr.parse_actions(options.actions, "$.actions", options.waitFor)
    screenshot, _ = rr.screenshot_spec(options.formats, "$")
    languages = tuple((options.location or {}).get("languages") or ())
    forced = rr.browser_reasons(
        wait_for=options.waitFor,
        actions=len(actions),
        screenshot=screenshot is not None,
        mobile=options.mobile,
    )
    spec = RenderSpec(
        timeout=timeout,
        wait_for_ms=options.waitFor,
        actions=tuple(actions),
        screenshot=screenshot,
        mobile=bool(options.mobile),
        headers=dict(options.headers),
        skip_tls_verification=skip_tls,
        languages=tuple(str(x) for x in languages),
        max_screenshot_height=max_screenshot_height,
    )
    headers = dict(options.headers)
    if languages and not any(k.lower() == "accept-language" for k in headers):
        headers["Accept-Language"] = rr.accept_language(list(spec.languages))
    return PagePlan(
        doc=document_options(options),
        headers=headers,
        timeout=timeout,
        skip_tls_verification=skip_tls,
        forced=tuple(forced),
        spec=spec,
        parsers=parser_plan(options.parsers),
        retain=not zero_data_retention,
        proxy=options.proxy,
        llm=llm_formats.llm_plan(options.formats),
        cache=cache_rules.cache_plan(
            msgspec.to_builtins(options),
            defaults=SCRAPE_DEFAULTS,
            zero_data_retention=zero_data_retention,
        ),
        tracking=tracking_spec(options.formats, zero_data_retention),
    )


@dataclass
class Produced:
    result: FetchResult
    document: dict[str, Any]
    links: list[str]
    engine: str


def _from_cache(url: str, page: Cached, created_ms: int) -> Produced:
    document = page.document
    metadata = document.setdefault("metadata", {})
    metadata["scrapeId"] = str(uuid.uuid4())
    metadata["cacheState"] = "hit"
    metadata["cachedAt"] = iso_ms(created_ms)
    result = FetchResult(
        requested_url=url, url=page.final_url, status_code=page.status_code,
        content_type=page.content_type, headers={}, body=b"",
    )  # fmt: skip
    return Produced(result, document, page.links, page.engine)


def iso_ms(ms: int) -> str:
    """Epoch milliseconds as ISO 8601 UTC with milliseconds (`2026-01-02T03:04:05.678Z`)."""
    text = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def _host(url: str) -> str:
    parsed = parse_http_url(url)
    return (parsed.host or "") if parsed is not None else ""


class PageMaker:
    """Produces pages with the fetcher and, when there is one, the browser."""

    def __init__(
        self,
        fetcher: Fetcher,
        document: DocumentFn,
        *,
        browser: BrowserPool | None = None,
        render_mode: str = "auto",
        gate: HostGate | None = None,
        cpu: trio.CapacityLimiter | None = None,
        llm: Any = None,
    ) -> None:
        self.llm = llm
        """The daemon's LlmService (daemon/llm/), for the json and summary formats."""
        self.cache: DocumentCache | None = None
        """The document cache (set by the crawl service; None: every page is live)."""
        self.tracker: ChangeTracker | None = None
        """The changeTracking snapshots (set by the crawl service)."""
        self.fetcher = fetcher
        self.document = document
        self.browser = browser
        self.render_mode = render_mode
        self.gate = gate
        self.cpu = cpu or trio.CapacityLimiter(2)
        self.documents = DocumentReader(cpu=self.cpu)
        """Files made documents (set by the crawl service to the daemon's, with [ocr])."""
        self.renders: dict[str, int] = {"forced": 0, "always": 0, "auto": 0, "fallback": 0}

    async def produce(
        self,
        url: str,
        plan: PagePlan,
        *,
        check_hop: Callable[[str], str | None] | None = None,
        concurrency: int | None = None,
        delay: float | None = None,
        slot: Any = None,
        looked_up: tuple[Hit | None] | None = None,
    ) -> Produced:
        """The page's document, with its LLM formats, from the cache when the plan lets it;
        FetchError with Firecrawl's code when there is none. `looked_up`: the cache was asked
        already (`DocumentCache.lookup_many`), this is its answer."""
        cache = plan.cache
        if cache is not None:
            if looked_up is not None:
                hit = looked_up[0]
            else:
                hit = await self.cache.lookup(url, cache) if self.cache is not None else None
            if hit is not None:
                return _from_cache(url, hit.page, hit.created_ms)
            if cache.only is not None:
                raise FetchError(cache.only, cache_rules.MISS_MESSAGES[cache.only], url)
        produced = await self._produce(url, plan, check_hop, concurrency, delay, slot)
        if plan.doc.attributes and "attributes" not in produced.document:  # no DOM: a PDF, text
            produced.document["attributes"] = attributes.empty(plan.doc.attributes)
        if plan.llm is not None:
            if self.llm is None:
                from daemon.llm.service import LlmService

                self.llm = LlmService(None)
            await llm_formats.apply(self.llm, plan.llm, produced.document)
        if plan.tracking is not None:
            if self.tracker is None:
                self.tracker = ChangeTracker(None)
            await self.tracker.apply(self.llm, plan.tracking, url, produced.document)
        if cache is not None:
            storable = cache_rules.storable(produced.result.status_code, produced.document)
            if self.cache is not None and storable:
                page = Cached(
                    document=produced.document, links=produced.links,
                    final_url=produced.result.url, status_code=produced.result.status_code,
                    content_type=produced.result.content_type, engine=produced.engine,
                )  # fmt: skip
                await self.cache.remember(url, cache, page)
            produced.document.setdefault("metadata", {})["cacheState"] = "miss"
        return produced

    async def _produce(
        self,
        url: str,
        plan: PagePlan,
        check_hop: Callable[[str], str | None] | None,
        concurrency: int | None,
        delay: float | None,
        slot: Any,
    ) -> Produced:
        slot = slot if slot is not None else contextlib.nullcontext()
        browser = self.browser
        if browser is None and {"actions", "screenshot"} & set(plan.forced):
            # waitFor and mobile are ignored without a browser (with a warning at the request);
            # a job stored while the browser was on cannot give what it asked for.
            raise FetchError(
                "SCRAPE_ALL_ENGINES_FAILED",
                f"{', '.join(plan.forced)} need a browser and [crawl.browser] is not enabled",
                url,
            )
        if browser is not None and (plan.forced or self.render_mode == "always"):
            if check_hop is not None and (reason := check_hop(url)) is not None:
                raise FetchError("CRAWL_DENIAL", f"URL refused: {reason}", url)
            await self.fetcher.vet(url)
            self.renders["forced" if plan.forced else "always"] += 1
            try:
                rendered = await self._render(url, plan, slot, concurrency, delay)
            except NotRenderable:
                pass  # a file: fetch it over HTTP below
            else:
                return await self._rendered(url, rendered, plan, check_hop)
        fetch_kw = plan.fetch_kw()
        async with slot:
            result = await self.fetcher.fetch(
                url, check_hop=check_hop, concurrency=concurrency, delay=delay, **fetch_kw
            )
        if (kind := document_kind(result.content_type, result.body, result.url)) is not None:
            return await self._file(url, result, plan, kind)
        if (
            browser is not None
            and self.render_mode == "auto"
            and is_html(result)
            and (signal := rr.script_built(result.body)) is not None
        ):
            self.renders["auto"] += 1
            try:
                rendered = await self._render(result.url, plan, slot, concurrency, delay)
            except NotRenderable:
                pass
            except FetchError as exc:
                self.renders["fallback"] += 1
                produced = await self._http(url, result, plan)
                produced.document["warning"] = (
                    f"the page looks script-built ({signal}) but rendering it failed "
                    f"({exc.code}: {exc.message}); this is the HTML as served"
                )
                return produced
            else:
                produced = await self._rendered(url, rendered, plan, check_hop)
                produced.document["metadata"]["renderReason"] = signal
                return produced
        return await self._http(url, result, plan)

    async def _render(
        self, url: str, plan: PagePlan, slot: Any, concurrency: int | None, delay: float | None
    ) -> Rendered:
        assert self.browser is not None
        gate = (
            self.gate.slot(_host(url), concurrency=concurrency, delay=delay)
            if self.gate is not None
            else contextlib.nullcontext()
        )
        # The same pools as HTTP (Proxies.attempts): `auto` renders again through the stealth
        # pool after a 401/403/429.
        attempts = self.fetcher.proxies.attempts(plan.proxy)
        try:
            async with slot, gate:
                for n, pool in enumerate(attempts):
                    spec = msgspec.structs.replace(plan.spec, stealth=pool == "stealth")
                    rendered = await render(self.browser, url, spec)
                    if n + 1 == len(attempts) or rendered.result.status_code not in RETRY_STATUSES:
                        break
                return rendered
        except RenderError as exc:
            raise FetchError(exc.code, exc.message, url) from None

    async def _rendered(
        self,
        url: str,
        rendered: Rendered,
        plan: PagePlan,
        check_hop: Callable[[str], str | None] | None,
    ) -> Produced:
        final = rendered.result.url
        if check_hop is not None and final != url and (reason := check_hop(final)) is not None:
            raise FetchError("CRAWL_DENIAL", f"the page moved to a refused URL: {reason}", url)
        document, links = await self.document(rendered.result, plan.doc, url)
        document["metadata"]["engine"] = "browser"
        document["metadata"]["proxyUsed"] = rendered.result.proxy_used
        if rendered.screenshot is not None:
            document["screenshot"] = rendered.screenshot
        if rendered.actions is not None:
            document["actions"] = rendered.actions
        return Produced(rendered.result, document, links, "browser")

    async def _http(self, url: str, result: FetchResult, plan: PagePlan) -> Produced:
        document, links = await self.document(result, plan.doc, url)
        document["metadata"]["engine"] = "http"
        document["metadata"]["proxyUsed"] = result.proxy_used
        return Produced(result, document, links, "http")

    async def _file(self, url: str, result: FetchResult, plan: PagePlan, kind: str) -> Produced:
        try:
            parsed = await self.documents.parse(result.body, kind, plan.parsers, retain=plan.retain)
        except DocumentError as exc:
            raise FetchError(exc.code, exc.message, url) from None
        document = parsed.formats(plan.doc.formats)
        document["metadata"] = with_fetch_metadata(
            parsed.metadata, url, result.url, result.status_code, result.content_type,
            str(uuid.uuid4()),
        )  # fmt: skip
        document["metadata"]["engine"] = parsed.engine
        document["metadata"]["proxyUsed"] = result.proxy_used
        return Produced(result, document, [], parsed.engine)
