"""Search as Firecrawl answers it, against the SearXNG simulator and the generated site: highlights
(on by default) make each web description and news snippet the passages of the result's page that
match the query, verbatim; a page that cannot be read keeps its snippet; the developer and gov
categories keep their sites."""

from __future__ import annotations

from typing import Any

import httpx
import trio
from firecrawl import Firecrawl

from daemon.app import Daemon
from daemon.fakes.searxng import SearxngSim
from daemon.fakes.site import SiteSim
from daemon.search import SearchConfig
from tests.conftest import unlabelled
from tests.crawlapi.test_search import crawl_config, searxng  # noqa: F401

QUERY = "paragraph 2 page"


def _on_site(url: str) -> bool:
    return url.split("/")[2].split(":")[0].endswith("site.test")


def _page_hits(site: SiteSim) -> int:
    return sum(1 for hit in site.hits if hit.path.startswith("/pages/"))


async def _markdown(client: httpx.AsyncClient, url: str) -> str:
    answer = await client.post("/v2/scrape", json={"url": url})
    return str(answer.json()["data"]["markdown"])


async def test_descriptions_become_passages_of_the_pages(
    client: httpx.AsyncClient, site: SiteSim
) -> None:
    answer = await client.post("/v2/search", json={"query": QUERY, "limit": 5,
                                                   "sources": ["web", "news"]})  # fmt: skip
    assert answer.status_code == 200
    data = answer.json()["data"]
    highlighted = 0
    for item, field in [*((i, "description") for i in data["web"]),
                        *((i, "snippet") for i in data["news"])]:  # fmt: skip
        if _on_site(item["url"]):
            page = item["url"].rsplit("/", 1)[1]
            assert item[field].startswith(f"Paragraph 2 of page {page}. Lorem ipsum"), item
            assert item[field] in await _markdown(client, item["url"])  # verbatim
            assert "Paragraph 0" not in item[field]
            highlighted += 1
        else:  # github.com, arxiv.org, example.org resolve nowhere here: the snippet stays
            assert item[field].startswith(f"About {QUERY}: snippet"), item
    assert highlighted == 4  # results 0, 1 of web and of news are on site.test names
    assert "warning" not in answer.json()  # an unreadable page is not a problem of the search
    status = (await client.get("/status")).json()["crawl"]["search"]
    assert status["highlighted"] == 4 and status["highlights"] == "fetch"
    metrics = unlabelled((await client.get("/metrics")).text)
    assert 'crawld_search_highlights_total{outcome="passages"}' in metrics


async def test_highlights_false_keeps_the_snippets_and_reads_nothing(
    client: httpx.AsyncClient, site: SiteSim, fc: Firecrawl, sdk: Any
) -> None:
    before = _page_hits(site)
    answer = await client.post("/v2/search", json={"query": QUERY, "highlights": False})
    assert all(i["description"].startswith("About") for i in answer.json()["data"]["web"])
    data = await sdk(fc.search, QUERY, limit=3, highlights=False)
    assert all(i.description.startswith("About") for i in data.web)
    assert _page_hits(site) == before
    sdk_default = await sdk(fc.search, QUERY, limit=2)  # the SDK sends no highlights: on
    assert sdk_default.web[0].description.startswith("Paragraph 2 of page 0")


async def test_scraped_results_are_highlighted_from_their_scrape(
    client: httpx.AsyncClient, site: SiteSim
) -> None:
    answer = await client.post("/v2/search", json={
        "query": QUERY, "limit": 5, "includeDomains": ["site.test"],
        "scrapeOptions": {"formats": ["links"]}})  # fmt: skip
    web = answer.json()["data"]["web"]
    assert len(web) == 5
    for item in web:
        assert item["description"].startswith("Paragraph 2 of page")
        assert item["links"] and "markdown" not in item  # read for highlights, not returned
    paths = [hit.path for hit in site.hits if hit.path.startswith("/pages/")]
    assert len(paths) == len(set(paths)) == 5  # one fetch per result, none for highlights


async def test_cache_mode_reads_no_page(
    client: httpx.AsyncClient,
    site: SiteSim,
    daemon: Daemon,
    searxng: SearxngSim,  # noqa: F811
) -> None:
    search = daemon.parts["search"]
    search.configure(SearchConfig(base_url=searxng.address, highlights="cache"))  # type: ignore[attr-defined]
    first = (await client.post("/v2/search", json={"query": QUERY, "limit": 2})).json()
    assert all(i["description"].startswith("About") for i in first["data"]["web"])
    assert _page_hits(site) == 0
    await _markdown(client, searxng.result_url(0))  # now page 0 is in the document cache
    second = (await client.post("/v2/search", json={"query": QUERY, "limit": 2})).json()
    assert second["data"]["web"][0]["description"].startswith("Paragraph 2 of page 0")
    assert second["data"]["web"][1]["description"].startswith("About")
    assert _page_hits(site) == 1  # the scrape's own fetch only


async def test_slow_pages_keep_their_snippets_within_the_highlight_timeout(
    client: httpx.AsyncClient,
    site: SiteSim,
    daemon: Daemon,
    searxng: SearxngSim,  # noqa: F811
) -> None:
    search = daemon.parts["search"]
    search.configure(SearchConfig(base_url=searxng.address, highlight_timeout=0.5))  # type: ignore[attr-defined]
    site.latency = (5.0, 5.0)
    started = trio.current_time()
    answer = await client.post("/v2/search", json={"query": QUERY, "limit": 3})
    assert trio.current_time() - started < 3.0
    assert answer.status_code == 200
    assert all(i["description"].startswith("About") for i in answer.json()["data"]["web"])


async def test_developer_and_gov_categories(
    client: httpx.AsyncClient,
    fc: Firecrawl,
    sdk: Any,
    searxng: SearxngSim,  # noqa: F811
) -> None:
    data = await sdk(fc.search, "retries", limit=3, categories=["developer"])
    assert [i.url.split("/")[2] for i in data.web] == ["github.com"] * 3
    assert searxng.requests[-1]["categories"] == "general,it"
    raw = await client.post("/v2/search", json={"query": "retries", "limit": 2,
                                                "categories": ["developer"]})  # fmt: skip
    assert {i["category"] for i in raw.json()["data"]["web"]} == {"developer"}
    gov = await client.post("/v2/search", json={"query": "labeling", "categories": ["gov"]})
    assert gov.status_code == 200 and gov.json()["data"]["web"] == []  # no .gov in the simulator
    assert searxng.requests[-1]["q"] == "labeling site:gov"
    mixed = await client.post("/v2/search", json={"query": "q", "categories": ["gov", "pdf"]})
    assert mixed.status_code == 400 and mixed.json()["details"][0]["path"] == "$.categories"
