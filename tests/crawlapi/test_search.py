"""POST /v2/search through firecrawl-py and raw HTTP: crawld asks the SearXNG simulator, maps its
results into Firecrawl's buckets, scrapes them on request, and answers every fault clearly."""

from __future__ import annotations

import functools
from typing import Any

import httpx
import pytest
import trio
from firecrawl import Firecrawl
from firecrawl.v2.types import ScrapeOptions
from firecrawl.v2.utils.error_handler import FirecrawlError

from daemon.app import Daemon
from daemon.fakes.searxng import SearxngSim, serve_searxng
from daemon.fakes.site import SiteSim
from daemon.search import SearchConfig
from tests.conftest import unlabelled
from tests.crawlapi.conftest import CONFIG


@pytest.fixture
async def searxng(nursery: trio.Nursery, site: SiteSim) -> SearxngSim:
    sim = SearxngSim(site_base=f"http://site.test:{site.port}")
    host, port = await nursery.start(functools.partial(serve_searxng, sim))
    sim.address = f"http://{host}:{port}"  # type: ignore[attr-defined]
    return sim


@pytest.fixture
def crawl_config(searxng: SearxngSim) -> str:
    address = searxng.address  # type: ignore[attr-defined]
    return CONFIG + f'[search]\nbase_url = "{address}"\nengines = ["fake"]\n'


async def test_sdk_search_web_results(fc: Firecrawl, sdk: Any, searxng: SearxngSim) -> None:
    data = await sdk(fc.search, "trio nurseries")
    assert len(data.web) == 10  # Firecrawl v2's default limit (the SDK sends none)
    first = data.web[0]
    assert first.title == "trio nurseries — general result 0"
    assert first.url == searxng.result_url(0) and first.position == 1
    assert first.description.startswith("About trio nurseries")
    assert [r.position for r in data.web] == list(range(1, 11))
    assert data.news is None and data.images is None
    sent = searxng.requests[-1]
    assert (sent["q"], sent["categories"], sent["engines"], sent["format"]) == (
        "trio nurseries",
        "general",
        "fake",
        "json",
    )


async def test_news_and_images_and_paging(fc: Firecrawl, sdk: Any, searxng: SearxngSim) -> None:
    data = await sdk(fc.search, "q", sources=["web", "news", "images"], limit=25)
    assert len(data.web) == len(data.news) == len(data.images) == 25
    assert data.news[0].date == "2026-11-01T08:00:00" and data.news[0].snippet
    assert data.images[3].image_url == "https://example.org/img/3.png"
    assert (data.images[3].image_width, data.images[3].image_height) == (643, 483)
    pages = sorted(int(r["pageno"]) for r in searxng.requests if r["categories"] == "general")
    assert pages == [1, 2, 3]  # 10 a page: three pages for 25


async def test_domain_filters_and_categories(client: httpx.AsyncClient) -> None:
    only = await client.post("/v2/search", json={"query": "q", "limit": 8,
                                                 "includeDomains": ["site.test"]})  # fmt: skip
    hosts = {item["url"].split("/")[2].split(":")[0] for item in only.json()["data"]["web"]}
    assert hosts == {"site.test", "www.site.test"}
    assert len(only.json()["data"]["web"]) == 8
    without = await client.post("/v2/search", json={"query": "q", "excludeDomains": ["github.com"],
                                                    "limit": 20})  # fmt: skip
    assert all("github.com" not in i["url"] for i in without.json()["data"]["web"])
    research = await client.post("/v2/search", json={"query": "q", "categories": ["research"]})
    assert {i["url"].split("/")[2] for i in research.json()["data"]["web"]} == {"arxiv.org"}


async def test_parameters_reach_searxng(client: httpx.AsyncClient, searxng: SearxngSim) -> None:
    response = await client.post("/v2/search", json={
        "query": "q", "lang": "de", "country": "de", "tbs": "qdr:m", "safe": True,
        "location": "Berlin", "limit": 1})  # fmt: skip
    assert response.status_code == 200
    sent = searxng.requests[-1]
    assert (sent["language"], sent["time_range"], sent["safesearch"]) == ("de-DE", "month", "2")
    assert "location is not sent to SearXNG" in response.json()["warning"]


async def test_results_are_scraped_on_request(
    fc: Firecrawl, sdk: Any, searxng: SearxngSim, site: SiteSim
) -> None:
    data = await sdk(fc.search, "q", limit=6, include_domains=["site.test"],
                     scrape_options=ScrapeOptions(formats=["markdown", "links"]))  # fmt: skip
    assert len(data.web) == 6
    for doc in data.web:
        page = int(doc.metadata.url.rsplit("/", 1)[1])
        assert doc.markdown.startswith(f"# Page {page}"), (page, doc.markdown[:200])
        assert doc.links
        assert site.hits_for(f"/pages/{page}")  # fetched from the site, not made up


async def test_a_result_that_cannot_be_scraped_is_kept_with_a_warning(
    client: httpx.AsyncClient,
) -> None:
    # github.com and arxiv.org results resolve nowhere in tests: each fails its scrape alone.
    response = await client.post("/v2/search", json={
        "query": "q", "limit": 6, "scrapeOptions": {"formats": ["markdown"]}})  # fmt: skip
    body = response.json()
    assert response.status_code == 200 and body["success"] is True
    web = body["data"]["web"]
    assert len(web) == 6
    scraped = [i for i in web if "markdown" in i]
    unscraped = [i for i in web if "markdown" not in i]
    assert len(scraped) == 3 and len(unscraped) == 3
    assert all(i["title"] and i["url"] for i in unscraped)
    assert "3 result(s) could not be scraped" in body["warning"]


async def test_provider_faults_are_clear_errors(
    client: httpx.AsyncClient, searxng: SearxngSim, fc: Firecrawl, sdk: Any
) -> None:
    searxng.mode = "down"
    down = await client.post("/v2/search", json={"query": "q"})
    assert down.status_code == 502
    assert down.json()["success"] is False and down.json()["code"] == "SEARCH_PROVIDER_ERROR"
    assert "answered 500: search error" in down.json()["error"]
    with pytest.raises(FirecrawlError):
        await sdk(fc.search, "q")
    searxng.mode = "bad_json"
    bad = await client.post("/v2/search", json={"query": "q"})
    assert bad.status_code == 502 and "not a JSON object" in bad.json()["error"]
    searxng.mode, searxng.rate_limited = "rate_limit", 1
    retried = await client.post("/v2/search", json={"query": "q", "limit": 2})
    assert retried.status_code == 200 and len(retried.json()["data"]["web"]) == 2
    searxng.mode, searxng.json_enabled = "ok", False
    refused = await client.post("/v2/search", json={"query": "q"})
    assert refused.status_code == 502 and "search.formats" in refused.json()["error"]
    searxng.json_enabled, searxng.mode, searxng.slow_s = True, "slow", 3.0
    slow = await client.post("/v2/search", json={"query": "q", "timeout": 1000})
    assert slow.status_code == 408 and slow.json()["code"] == "SEARCH_TIMEOUT"


async def test_unreachable_provider_and_search_turned_off(
    client: httpx.AsyncClient, daemon: Daemon
) -> None:
    search = daemon.parts["search"]
    search.configure(SearchConfig(base_url="http://127.0.0.1:9", retries=0))
    gone = await client.post("/v2/search", json={"query": "q"})
    assert gone.status_code == 502 and "unreachable" in gone.json()["error"]
    search.configure(SearchConfig())
    off = await client.post("/v2/search", json={"query": "q"})
    # a feature this crawld lacks, not a bad request (Firecrawl's self-hosted 501)
    assert off.status_code == 501 and off.json()["code"] == "SEARCH_NOT_CONFIGURED"
    assert "[search] base_url" in off.json()["error"]
    status = (await client.get("/status")).json()["crawl"]["search"]
    assert status["enabled"] is False and status["failed"] >= 2


async def test_firecrawls_cloud_catalogue_is_ignored_with_a_warning(
    client: httpx.AsyncClient, searxng: SearxngSim
) -> None:
    # What firecrawl-mcp sends on every search when it holds an API key.
    response = await client.post("/v2/search", json={
        "query": "q", "limit": 2, "sources": ["web", "alexandria"], "domainTools": True,
        "toolDetail": "compact"})  # fmt: skip
    body = response.json()
    assert response.status_code == 200 and len(body["data"]["web"]) == 2
    assert set(body["data"]) == {"web"} and "tools" not in body
    assert "source 'alexandria' and domainTools are ignored" in body["warning"]
    assert {r["categories"] for r in searxng.requests} == {"general"}
    alone = await client.post("/v2/search", json={"query": "q", "sources": ["alexandria"]})
    assert alone.status_code == 400
    assert "not served by crawld" in alone.json()["details"][0]["message"]


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"query": ""}, "$.query"),
        ({"query": "q", "limit": 0}, "$.limit"),
        ({"query": "q", "limit": 101}, "$.limit"),
        ({"query": "q", "sources": ["video"]}, "$.sources[0]"),
        ({"query": "q", "sources": [{"type": "alexandria"}]}, "$.sources[0]"),
        ({"query": "q", "sources": ["alexandria", "video"]}, "$.sources[1]"),
        ({"query": "q", "toolDetail": "all"}, "$.toolDetail"),
        ({"query": "q", "categories": ["video"]}, "$.categories[0]"),
        ({"query": "q", "categories": ["developer", "pdf"]}, "$.categories"),
        ({"query": "q", "categories": ["research", "gov"]}, "$.categories"),
        (
            {"query": "q", "includeDomains": ["a.org"], "excludeDomains": ["b.org"]},
            "$.includeDomains",
        ),
        ({"query": "q", "includeDomains": ["a b"]}, "$.includeDomains[0]"),
        ({"query": "q", "timeout": 10}, "$.timeout"),
        ({"query": "q", "nope": 1}, "$.nope"),
        ({"query": "q", "scrapeOptions": {"formats": ["bogus"]}}, "$.scrapeOptions.formats[0]"),
        ({"query": "q", "scrapeOptions": {"wat": 1}}, "$.scrapeOptions.wat"),
        ({"query": 5}, "$.query"),
        ({}, "$"),
    ],
)
async def test_bad_requests_name_the_field(
    client: httpx.AsyncClient, searxng: SearxngSim, body: dict[str, Any], path: str
) -> None:
    before = len(searxng.requests)
    response = await client.post("/v2/search", json=body)
    assert response.status_code == 400
    assert response.json()["success"] is False
    assert any(d["path"].startswith(path) for d in response.json()["details"])
    assert len(searxng.requests) == before  # nothing was asked


async def test_search_in_openapi_and_metrics(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    op = doc["paths"]["/v2/search"]["post"]
    assert {"200", "400", "408", "502"} <= set(op["responses"])
    await client.post("/v2/search", json={"query": "q", "limit": 1})
    metrics = unlabelled((await client.get("/metrics")).text)
    assert 'crawld_searches_total{outcome="ok"}' in metrics
    assert 'crawld_search_provider_requests_total{outcome="ok"}' in metrics
