# POST /v2/search over HTTP, in Firecrawl's shapes: validation problems are its 400 with
# `details`; a search while `[search]` is off is a 400 saying how to turn it on; a provider that
# fails is a 502 and a search that outlives its `timeout` Firecrawl's 408, both `{success: false,
# error, code}` so the SDKs raise the error their users expect.
from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from daemon.api.app import ApiRoute, json
from daemon.api.crawl import bad_request, firecrawl_error, request_body
from daemon.crawl.problems import BadRequest
from daemon.crawl.search.service import SearchRequest, SearchService, parse_search
from daemon.search import SearchError


class SearchData(msgspec.Struct, kw_only=True, omit_defaults=True):
    web: list[dict[str, Any]] | None = None
    news: list[dict[str, Any]] | None = None
    images: list[dict[str, Any]] | None = None


class SearchResponse(msgspec.Struct, kw_only=True, omit_defaults=True):
    success: bool
    data: SearchData
    creditsUsed: int = 0
    id: str | None = None
    warning: str | None = None


def routes(service: SearchService) -> list[ApiRoute]:
    async def search(request: Request) -> Response:
        try:
            parsed = parse_search(await request_body(request), llm=service.crawl.llm,
                                  browser=service.crawl.browser is not None,
                                  stealth=service.crawl.stealth_proxies)  # fmt: skip
        except BadRequest as exc:
            return bad_request(exc)
        try:
            answer = await service.search(parsed)
        except SearchError as exc:
            return firecrawl_error(exc.status, exc.message, exc.code)
        return json(answer)

    return [
        ApiRoute("POST", "/v2/search", search,
                 "Search the web through the configured provider ([search], SearXNG); with"
                 " scrapeOptions.formats each web and news result is scraped",
                 body=SearchRequest, response=SearchResponse,
                 errors={400: "Bad Request, or [search] is not configured",
                         408: "SEARCH_TIMEOUT: the request's timeout passed",
                         502: "the search provider failed (unreachable, an error, bad JSON)"}),
    ]  # fmt: skip
