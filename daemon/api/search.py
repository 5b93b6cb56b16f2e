# POST /v2/search over HTTP, in Firecrawl's shapes: validation problems are its 400 with
# `details`; a search while `[search]` is off is a 501 (the feature is missing here, the request
# is fine) saying how to turn it on; a provider that fails is a 502 and a search that outlives its
# `timeout` Firecrawl's 408, all `{success: false, error, code}` so the SDKs raise the error
# their users expect.
from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta
from starlette.requests import Request
from starlette.responses import Response

from daemon.api.app import ApiRoute, QueryParam, int_param, json
from daemon.api.crawl import bad_request, firecrawl_error, request_body, scrape_deployment
from daemon.crawl.options.schemas import NOT_BLANK
from daemon.crawl.problems import BadRequest, json_object
from daemon.crawl.search import developer
from daemon.crawl.search.service import MAX_QUERY, SearchBody, SearchService, parse_search
from daemon.search import SearchError

SEARCH_ERRORS = {
    400: "Bad Request: unknown keys, invalid values, unsupported options",
    408: "SEARCH_TIMEOUT: the request's timeout passed",
    501: "SEARCH_NOT_CONFIGURED: this crawld has no [search] provider",
    502: "the search provider failed (unreachable, an error, bad JSON)",
}


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


class DeveloperRequest(
    msgspec.Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True
):
    """POST /v2/search/developer (firecrawl-py); GET takes query, k, passages as query
    parameters (firecrawl-mcp). firecrawl-py's index filters (types, repos, sources, language,
    topic, license, min_stars, max_stars, archived, fork, skills, in the body or the query) are a
    400 unless null: not crawld's."""

    query: Annotated[str, Meta(max_length=MAX_QUERY, extra_json_schema=NOT_BLANK)]
    k: Annotated[int, Meta(ge=1, le=100)] | None = 10
    passages: Annotated[int, Meta(ge=1, le=5)] | None = 3
    origin: Any = None
    types: None = None
    repos: None = None
    sources: None = None
    language: None = None
    topic: None = None
    license: None = None
    min_stars: None = None
    max_stars: None = None
    archived: None = None
    fork: None = None
    skills: None = None


class DeveloperPassage(msgspec.Struct):
    text: str


class DeveloperResult(msgspec.Struct):
    id: str
    """`issue:owner/repo#n`, `pr:owner/repo#n`, `readme:owner/repo` or `doc:<hash>`"""
    url: str
    title: str
    passages: list[DeveloperPassage]


class DeveloperResponse(msgspec.Struct):
    success: bool
    results: list[DeveloperResult]


DEVELOPER_QUERY = [
    QueryParam(
        "query",
        "The question or search phrase",
        required=True,
        max_length=MAX_QUERY,
        pattern=NOT_BLANK["pattern"],
    ),
    int_param("k", "Most results (default 10)", 1, 100),
    int_param("passages", "Most passages a result (default 3)", 1, 5),
]


def routes(service: SearchService) -> list[ApiRoute]:
    async def run(body: bytes) -> dict[str, Any] | Response:
        try:
            parsed = parse_search(body, llm=service.crawl.llm,
                                  browser=service.crawl.browser is not None,
                                  stealth=service.crawl.stealth_proxies)  # fmt: skip
        except BadRequest as exc:
            return bad_request(exc)
        try:
            return await service.search(parsed)
        except SearchError as exc:
            return firecrawl_error(exc.status, exc.message, exc.code)

    async def search(request: Request) -> Response:
        try:
            body = await request_body(request)
        except BadRequest as exc:
            return bad_request(exc)
        answer = await run(body)
        return answer if isinstance(answer, Response) else json(answer)

    async def developer_search(request: Request) -> Response:
        try:
            if request.method == "GET":
                raw: dict[str, Any] = dict(request.query_params)
            else:
                raw = json_object(await request_body(request))
            body, passages = developer.search_body(raw, from_query=request.method == "GET")
        except BadRequest as exc:
            return bad_request(exc)
        answer = await run(msgspec.json.encode(body))
        if isinstance(answer, Response):
            return answer
        return json({"success": True, "results": developer.results(answer, passages)})

    return [
        ApiRoute("POST", "/v2/search", search,
                 "Search the web through the configured provider ([search], SearXNG); with"
                 " scrapeOptions.formats each web and news result is scraped",
                 body=SearchBody, body_required=True, response=SearchResponse,
                 errors=SEARCH_ERRORS, deployment=scrape_deployment(service.crawl)),
        *[ApiRoute(method, "/v2/search/developer", developer_search,
                   "Firecrawl's developer search, answered by a search with categories"
                   " [\"developer\"] (code hosts, Q&A, documentation sites): ranked"
                   " {id, url, title, passages}",
                   body=DeveloperRequest if method == "POST" else None,
                   body_required=method == "POST",
                   query=DEVELOPER_QUERY if method == "GET" else (),
                   response=DeveloperResponse,
                   errors={400: "Bad Request: query missing, k or passages out of range, or a"
                                " filter of Firecrawl's own index (not supported by crawld)",
                           408: "SEARCH_TIMEOUT",
                           501: "SEARCH_NOT_CONFIGURED: this crawld has no [search] provider",
                           502: "the search provider failed"})
          for method in ("GET", "POST")],
    ]  # fmt: skip
